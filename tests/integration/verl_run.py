"""A verl run's rollout side, from the trainer's start-up on (used by test_frameworks_verl.py in a
subprocess).

python verl_run.py OUT_JSON MODE DUMP_DIR {one-line|by-hand} [--seed N]

``Trainer`` stands in for verl 0.9.1's ``RayPPOTrainer`` where it meets the rollout, written from
``verl/trainer/ppo/ray_trainer.py`` with verl's real ``DataProto``: ``fit`` validates before
training (``global_steps`` 0), then per step draws prompts from a loader shuffled by
``data.seed``, gives each a fresh ``uuid4`` uid, keeps the reward keys in the generation batch
(``_get_gen_batch``), repeats it ``rollout.n`` times, calls
``async_rollout_manager.generate_sequences`` and unions the output into the batch; every
``trainer.test_freq`` steps ``_validate`` runs with the same ``global_steps``. The manager's
output carries its request's ``non_tensor_batch`` (a colocated reward model in 0.9.1), and its
responses are drawn from the OS's entropy: a replay equals the dump run only by reading it.
The rollout is wrapped by the docs' one line or by-hand snippet (docs/frameworks/verl.md).
OUT_JSON gets every call's responses, or the rollout_mock error ``{"error", "message"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks" / "verl.md"
QUESTIONS = [f"What is {i} plus {2 * i}?" for i in range(12)]


class AgentLoopManager:
    def __init__(self) -> None:
        self.calls = 0

    def generate_sequences(self, prompts: Any) -> Any:
        self.calls += 1
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        out = DataProto.from_dict(tensors={"responses": torch.randint(0, 100, (len(prompts), 3), generator=g)},
                                  meta_info={"timing": {"gen": 0.1}})
        for key, value in prompts.non_tensor_batch.items():
            out.non_tensor_batch[key] = value.copy()
        return out

    def wake_up(self) -> None:
        return None


class Trainer:
    def __init__(self, block: dict[str, Any], seed: int) -> None:
        self.config = OmegaConf.create({
            "rollout_mock": block,
            "data": {"train_batch_size": 4, "seed": seed, "shuffle": True, "max_prompt_length": 8},
            "actor_rollout_ref": {"rollout": {"name": "vllm", "n": 2, "temperature": 1.0,
                                              "val_kwargs": {"n": 1, "do_sample": False}}},
            "trainer": {"test_freq": 2, "val_before_train": True, "total_training_steps": 4},
        })
        self.async_rollout_manager = AgentLoopManager()
        self.tokenizer = None
        self.global_steps = 0
        generator = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(len(QUESTIONS), generator=generator).tolist()
        self.responses: list[list[list[int]]] = []

    def _batch(self, rows: list[int]) -> Any:
        raw = np.empty(len(rows), dtype=object)
        raw[:] = [[{"role": "user", "content": QUESTIONS[i]}] for i in rows]
        batch = DataProto.from_dict(
            tensors={"input_ids": torch.tensor([[i, i + 1] for i in rows])},
            non_tensors={"raw_prompt": raw, "extra_info": np.array([{"index": i} for i in rows], dtype=object)})
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in rows], dtype=object)
        return batch

    def _generate(self, batch: Any, meta: dict[str, Any], n: int) -> Any:
        gen_batch = DataProto.from_dict(non_tensors={k: v.copy() for k, v in batch.non_tensor_batch.items()},
                                        meta_info=meta)
        output = self.async_rollout_manager.generate_sequences(gen_batch.repeat(repeat_times=n, interleave=True))
        output.meta_info.pop("timing", None)
        self.responses.append(output.batch["responses"].tolist())
        return batch.repeat(repeat_times=n, interleave=True).union(output)

    def _validate(self) -> None:
        batch = self._batch(list(range(4)))
        self._generate(batch, {"validate": True, "do_sample": False, "global_steps": self.global_steps}, 1)

    def fit(self) -> None:
        self._validate()
        for step in range(self.config.trainer.total_training_steps):
            self.global_steps += 1
            batch = self._batch(self.order[4 * step % 12: 4 * step % 12 + 4])
            self._generate(batch, {"global_steps": self.global_steps}, self.config.actor_rollout_ref.rollout.n)
            if self.global_steps % self.config.trainer.test_freq == 0:
                self._validate()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode")
    parser.add_argument("dump_dir")
    parser.add_argument("how", choices=["one-line", "by-hand"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shuffle-seed", type=int, default=None, help="another loader order, same data.seed")
    args = parser.parse_args()
    import rollout_mock
    from rollout_mock.adapters.verl import wrap_verl_rollout

    trainer = Trainer({"enable": True, "mode": args.mode, "dump_dir": args.dump_dir}, args.seed)
    if args.shuffle_seed is not None:
        trainer.order = torch.randperm(len(QUESTIONS), generator=torch.Generator().manual_seed(args.shuffle_seed)).tolist()
    closers: list[Any] = []
    try:
        if args.how == "one-line":
            closers.append(wrap_verl_rollout(trainer))
        else:
            code = re.search(r"<!-- verl-by-hand -->\s*```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
            assert code is not None, "the by-hand snippet is missing from docs/frameworks/verl.md"
            namespace: dict[str, Any] = {"trainer": trainer, "config": trainer.config}
            exec(compile(code.group(1), str(DOC), "exec"), namespace)  # noqa: S102 - the documented snippet
            closers += list(namespace["splits"].values())
        trainer.fit()
    except rollout_mock.RolloutMockError as exc:
        Path(args.out).write_text(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 3
    finally:
        for closer in closers:
            closer.close()
    Path(args.out).write_text(json.dumps({"responses": trainer.responses,
                                          "live_calls": trainer.async_rollout_manager.calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
