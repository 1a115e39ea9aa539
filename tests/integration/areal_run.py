"""One AReaL-style asynchronous training run, in its own process (test_frameworks_areal.py).

    python tests/integration/areal_run.py MODE METHOD DUMP_DIR OUT [COUNT]

MODE: dump | mock; METHOD: wait (the trainer submits prompts, three batches ahead at the start,
then ``wait(COUNT)``) or prepare_batch. A producer thread (tests/doubles/areal_async.py) with
``max_head_offpolicyness=2`` generates in the background with its own timing; the trainer trains a
tiny torch model on what it consumed, weighting each token by its staleness (its ``versions``),
then ``set_version(step + 1)``. Writes (torch.save) the parameters, the metrics per step, how many
trajectories were generated and the versions consumed; a rollout_mock error as {"error", ...} (exit 3).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from areal_async import VOCAB, AsyncRolloutEngine, Loader  # noqa: E402

from rollout_mock.adapters.areal import wrap_areal  # noqa: E402
from rollout_mock.errors import RolloutMockError  # noqa: E402

STEPS = 5
BATCH = 4


def main(argv: list[str]) -> None:
    mode, method, dump_dir, out = argv[:4]
    count = int(argv[4]) if len(argv) > 4 else BATCH
    engine = AsyncRolloutEngine(batch_size=BATCH, max_head_offpolicyness=2) if mode == "dump" else None
    global_step = 0
    rollout = wrap_areal(engine, {"enable": True, "mode": mode, "dump_dir": dump_dir}, step=lambda: global_step)
    loader = Loader([[(i * 3 + j) % (VOCAB - 1) + 1 for j in range(2 + i % 3)] for i in range(40)], BATCH)
    prompts = iter(loader)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics: list[dict[str, float]] = []
    consumed: list[Any] = []
    try:
        for global_step in range(STEPS):
            if method == "wait":
                for _ in range(3 if global_step == 0 else 1):
                    for item in next(prompts):
                        rollout.submit(item, workflow=None)
                batch = rollout.wait(count)
            else:
                batch = rollout.prepare_batch(loader, workflow=None)
            optimizer.zero_grad()
            losses, staleness = [], []
            for traj in batch:
                ids = traj["input_ids"].long()
                logp = model(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
                mask = traj["loss_mask"][:, 1:].float()
                stale = (global_step - traj["versions"][:, 1:]).clamp(min=0).float() * mask
                weight = 0.8 ** stale
                advantage = (traj["rewards"] - traj["rewards"].mean())[:, None]
                losses.append(-(weight * logp * advantage * mask).sum() / mask.sum())
                staleness.append(stale.max())
            loss = torch.stack(losses).mean()
            loss.backward()
            optimizer.step()
            metrics.append({"loss": loss.item(), "max_staleness": float(torch.stack(staleness).max())})
            consumed.append([traj["versions"].tolist() for traj in batch])
            rollout.set_version(global_step + 1)
    except RolloutMockError as exc:
        if engine is not None:
            engine.destroy()
        torch.save({"error": type(exc).__name__, "message": str(exc), "step": exc.step}, out)
        sys.exit(3)
    rollout.close()
    if engine is not None:
        engine.destroy()
    torch.save({"params": {k: v.clone() for k, v in model.state_dict().items()}, "metrics": metrics,
                "generated": engine.generated if engine is not None else 0, "versions": consumed}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
