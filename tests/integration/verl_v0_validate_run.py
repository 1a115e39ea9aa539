"""verl V0's real ``RayPPOTrainer._validate`` with 3 validation batches per validation, in its own
process (test_frameworks_verl.py).

    python tests/integration/verl_v0_validate_run.py MODE DUMP_DIR OUT

Two validations (``global_steps`` 0 and 2), each over a validation set of 6 prompts in batches of
2 (``data.val_batch_size`` < the set: three ``generate_sequences`` calls with one step). The
rollout stand-in answers with random tokens (seeded from ``os.urandom``: every process differs),
so only a faithful replay gives the dump run's metrics. Writes (torch.save) the metrics of both
validations and how many batches the rollout generated; a rollout_mock error as {"error", ...}.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from verl_v1 import dataset, install_imports  # noqa: E402

install_imports()

from omegaconf import OmegaConf  # noqa: E402


class Rollout:
    """``async_rollout_manager``: generate_sequences(DataProto) -> responses and rm_scores."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        self.calls = 0

    def generate_sequences(self, prompts: Any) -> Any:
        from verl.protocol import DataProto

        self.calls += 1
        count = len(prompts)
        responses = torch.randint(2, 30, (count, 3), generator=self.generator)
        scores = torch.zeros(count, 3)
        scores[:, -1] = (responses[:, -1] % 2).float()
        return DataProto.from_dict(
            tensors={"prompts": torch.zeros(count, 4, dtype=torch.long), "responses": responses, "rm_scores": scores},
            non_tensors={"__num_turns__": np.array([2] * count, dtype=object)})


def main(argv: list[str]) -> None:
    mode, dump_dir, out = argv[:3]
    from torch.utils.data import DataLoader
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn

    from rollout_mock.adapters.verl import wrap_verl_rollout
    from rollout_mock.errors import RolloutMockError

    trainer = object.__new__(RayPPOTrainer)  # what init_workers builds, stood in for
    trainer.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"val_kwargs": {"n": 2, "do_sample": False}, "agent": {"num_workers": 1}}},
        "data": {"val_batch_size": 2},
        "trainer": {"validation_data_dir": None, "log_val_generations": 0},
        "rollout_mock": {"enable": True, "mode": mode, "dump_dir": dump_dir},
    })
    trainer.tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1, decode=lambda ids, **kw: str(ids.tolist()))
    trainer.val_dataloader = DataLoader(dataset(6), batch_size=2, collate_fn=collate_fn, shuffle=False)
    trainer.use_rm = False
    trainer.async_rollout_manager = rollout = Rollout()
    trainer.actor_rollout_wg = None
    wrapper = wrap_verl_rollout(trainer)  # the one line
    metrics = []
    try:
        for global_steps in (0, 2):
            trainer.global_steps = global_steps
            metrics.append({k: float(v) for k, v in trainer._validate().items()})
        assert wrapper is not None
        wrapper.close()
    except RolloutMockError as exc:
        torch.save({"error": type(exc).__name__, "message": str(exc), "step": exc.step}, out)
        sys.exit(3)
    torch.save({"metrics": metrics, "generated": rollout.calls}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
