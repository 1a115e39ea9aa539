"""A plain PyTorch loop with three faults planted in its rollouts (used by test_explain.py).

python explain_run.py MODE DUMP_DIR [--steps N] [--log0 S] [--fp16 S] [--zerovar S]

The scheduler returns per step: ``x`` [6, 4], ``rewards`` [6], ``mask`` [6] (1.0) and ``scale``
[6] (1.0). Planted in the rollouts: at --log0 a zero in ``mask`` (the loss takes log of p * mask:
log(0)); at --fp16 ``scale`` 1000 (the float16 head overflows: its Linear's matmul makes inf); at
--zerovar equal rewards (the GRPO advantage (r - mean) / std divides 0 by 0). MODE is dump or
mock; the training loop is the same in both; mock replays the recorded rollouts.
"""

from __future__ import annotations

import argparse
import sys

import torch

import rollout_mock


class Rollouts:
    def __init__(self, faults: dict[str, int]) -> None:
        self.faults = faults

    def get_batch(self, step: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        batch = {"x": torch.randn(6, 4, generator=g), "rewards": torch.rand(6, generator=g),
                 "mask": torch.ones(6), "scale": torch.ones(6)}
        if step == self.faults.get("log0"):
            batch["mask"][2] = 0.0
        if step == self.faults.get("fp16"):
            batch["scale"][:] = 1000.0
        if step == self.faults.get("zerovar"):
            batch["rewards"][:] = 0.5
        return batch


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.head16 = torch.nn.Linear(8, 1).half()
        with torch.no_grad():
            self.head16.weight.fill_(60.0)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        h = self.body(x).abs() + 0.5
        return self.head16((h * scale[:, None]).half()).float().squeeze(-1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["dump", "mock"])
    parser.add_argument("dump_dir")
    parser.add_argument("--steps", type=int, default=8)
    for fault in ("log0", "fp16", "zerovar"):
        parser.add_argument(f"--{fault}", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Policy()
    opt = torch.optim.SGD(model.body.parameters(), lr=1e-3)
    faults = {"log0": args.log0, "fp16": args.fp16, "zerovar": args.zerovar}
    real = Rollouts(faults) if args.mode == "dump" else None
    config = {"enable": True, "mode": args.mode, "dump_dir": args.dump_dir}
    with rollout_mock.MockScheduler(real, config, methods=["get_batch"]) as scheduler:
        for step in range(args.steps):
            batch = scheduler.get_batch(step)
            r = batch["rewards"]
            adv = (r - r.mean()) / r.std()                       # zero-variance rewards: 0 / 0
            logits = model(batch["x"], batch["scale"])           # scale 1000: float16 overflow
            p = torch.sigmoid(logits) * batch["mask"]            # a zero in the mask: log(0)
            loss = -(adv * torch.log(p)).mean()
            opt.zero_grad()
            loss.backward()
            if torch.isfinite(loss):
                opt.step()
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
