"""One verl V1 training run (real ``verl.trainer.ppo.v1`` trainer code, CPU stand-ins from
``tests/doubles/verl_v1.py``), run in its own process by ``test_frameworks_verl_v1.py``.

    python tests/integration/verl_v1_run.py MODE TRAINER_MODE DUMP_DIR OUT [STEPS] [BATCH] [VAL_BATCH] [SYNC_STEPS] [THRESHOLD]

MODE: dump | mock | off; TRAINER_MODE: sync | separate_async | colocate_async. Writes to OUT (torch.save):
the tiny model's parameters, the metrics ``fit`` logged (wall-clock ones left out), how many
prompts the agent loop generated, the weight versions of what each step trained on, and the
submission steps of the prompts left in the queue at the end. VAL_BATCH:
validate before training and every 2 steps over 6 validation prompts in batches of VAL_BATCH.
SYNC_STEPS: separate_async's parameter_sync_step (mini-batches, so ``sample`` calls, per step).
THRESHOLD: trainer.v1.sampler.max_off_policy_threshold (default 2: trajectories at most one
version stale; 1 evicts every prompt submitted before the current step, and refills).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from verl_v1 import ActorGroup, AgentLoop, Tracking, Weights, dataset, install_imports  # noqa: E402

install_imports()

import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

WALL_CLOCK = ("timing", "perf/time_per_step", "perf/throughput", "perf/max_memory")


def config(trainer_mode: str, mode: str, dump_dir: str, steps: int, batch: int, val_batch: int = 0,
           sync_steps: int = 1, threshold: int = 2) -> Any:
    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    cfg = OmegaConf.load(path)
    overrides = {
        "data": {"train_batch_size": batch, "gen_batch_size": None if trainer_mode == "sync" else 1,
                 "val_batch_size": val_batch or 2},
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "actor_rollout_ref": {
            "hybrid_engine": trainer_mode != "separate_async",
            "actor": {"ppo_mini_batch_size": batch // sync_steps, "use_kl_loss": False},
            "rollout": {"n": 2, "nnodes": 1, "n_gpus_per_node": 1, "calculate_log_probs": False,
                        "checkpoint_engine": {"backend": "nccl" if trainer_mode == "separate_async" else "naive"}},
        },
        "critic": {"enable": False},
        "trainer": {
            "val_before_train": bool(val_batch), "test_freq": 2 if val_batch else -1, "save_freq": -1, "total_epochs": 1,
            "total_training_steps": steps, "logger": ["console"], "resume_mode": "disable", "device": "cpu",
            "v1": {"trainer_mode": trainer_mode,
                   "separate_async": {"parameter_sync_step": sync_steps, "num_warmup_batches": 1},
                   "colocate_async": {"num_warmup_batches": 1},
                   "sampler": {"max_off_policy_threshold": threshold, "max_off_policy_strategy": "drop"}},
        },
        "rollout_mock": {"enable": mode != "off", "mode": "dump" if mode == "off" else mode, "dump_dir": dump_dir},
    }
    cfg = OmegaConf.merge(cfg, OmegaConf.create(overrides))
    OmegaConf.resolve(cfg)  # as verl's main_ppo does before building the trainer
    return cfg


def build(trainer_mode: str, cfg: Any) -> tuple[Any, AgentLoop]:
    from torch.utils.data import DataLoader
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base
    from verl.utils.dataset.rl_dataset import collate_fn

    trainer_base.Tracking = Tracking
    trainer = get_trainer_cls(trainer_mode)(cfg)
    loop = AgentLoop(int(cfg.actor_rollout_ref.rollout.n), asynchronous=trainer_mode != "sync")
    # what PPOTrainer._setup builds (workers, servers, checkpoint engines), stood in for
    trainer.tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1, decode=lambda ids, **kw: str(list(ids)))
    gen_batch = cfg.data.gen_batch_size or cfg.data.train_batch_size
    trainer.train_dataloader = DataLoader(dataset(64), batch_size=gen_batch, shuffle=True, drop_last=True,
                                          collate_fn=collate_fn, generator=torch.Generator().manual_seed(1))
    trainer.train_dataloader_it = None
    trainer.val_dataloader = DataLoader(dataset(6), batch_size=int(cfg.data.val_batch_size), collate_fn=collate_fn)
    trainer.steps_per_epoch = 64 // cfg.data.train_batch_size
    trainer.total_training_steps = int(cfg.trainer.total_training_steps)
    trainer.actor_rollout_wg = ActorGroup()
    trainer.ref_in_actor = False
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[object()])
    trainer.checkpoint_manager = Weights(loop)
    trainer.standalone_checkpoint_manager = Weights(loop)
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
    if trainer_mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.current_mode = HybridEngineMode.TRAINER
    trainer._init_dump_executor()
    trainer._load_checkpoint()
    trainer.on_init_end()
    trainer.replay_buffer.poll_interval = 0.001
    return trainer, loop


def main(argv: list[str]) -> None:
    mode, trainer_mode, dump_dir, out = argv[:4]
    steps = int(argv[4]) if len(argv) > 4 else 4
    batch = int(argv[5]) if len(argv) > 5 else 4
    val_batch = int(argv[6]) if len(argv) > 6 else 0
    sync_steps = int(argv[7]) if len(argv) > 7 else 1
    threshold = int(argv[8]) if len(argv) > 8 else 2
    from rollout_mock.adapters.verl import wrap_verl_rollout

    cfg = config(trainer_mode, mode, dump_dir, steps, 4, val_batch, sync_steps, threshold)
    trainer, loop = build(trainer_mode, cfg)
    wrapper = wrap_verl_rollout(trainer)  # the one line
    if batch != 4:  # the sampler asks for another count than the dump's (after the pre-flight check)
        trainer.config.data.train_batch_size = batch
        trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size = batch
    versions: list[Any] = []
    real_update = trainer._update_actor

    def update_actor(batch_meta: Any, metrics: dict[str, Any]) -> Any:
        versions.append([(t["min_global_steps"], t["max_global_steps"]) for t in batch_meta.tags])
        return real_update(batch_meta, metrics)

    trainer._update_actor = update_actor
    from rollout_mock.errors import RolloutMockError

    try:
        trainer.fit(loop)
    except RolloutMockError as exc:
        loop.close()
        torch.save({"error": type(exc).__name__, "message": str(exc), "step": exc.step}, out)
        sys.exit(3)
    loop.close()
    if wrapper is not None:
        wrapper.close()
    metrics = [(step, {k: float(v) for k, v in m.items() if not any(w in k for w in WALL_CLOCK)
                       and isinstance(v, (int, float)) or hasattr(v, "item") and not any(w in k for w in WALL_CLOCK)})
               for step, m in Tracking.logs]
    import transfer_queue as tq

    left = sorted(tag["global_steps"] for tag in tq.kv_list("train").get("train", {}).values() if tag.get("is_prompt"))
    torch.save({"params": {k: v.clone() for k, v in trainer.actor_rollout_wg.model.state_dict().items()},
                "metrics": metrics, "generated": loop.generated, "versions": versions, "prompts_left": left}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
