"""Every call, end to end, each run in its own process (its own hash seed, its own timings): an
asyncio agent loop of 8 concurrent episodes x 3 turns per step whose calls finish in a random
order in both runs, and a producer thread feeding a trainer that consumes what is ready; the
mock run trains bit-identical parameters and logs bit-identical metrics (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_S

AGENT = textwrap.dedent('''
    import asyncio, json, random, sys, time
    import torch
    from rollout_mock import MockScheduler

    mode, dump_dir, out, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rng = random.Random(seed)                     # timings differ between the two runs

    class Engine:                                 # the inference engine: random replies, random latency
        def __init__(self):
            self.sampler = random.Random(1234 + seed)
        async def generate(self, messages):
            await asyncio.sleep(rng.random() / 200)
            n = self.sampler.randrange(3, 9)
            return {"tokens": torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(self.sampler.randrange(10**9))),
                    "reward": self.sampler.random()}

    torch.manual_seed(0)
    model = torch.nn.Embedding(50, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = []
    cfg = {"enable": True, "mode": mode, "dump_dir": dump_dir}

    async def episode(engine, step, i):
        messages, tokens, rewards = [f"task {step}.{i % 4}"], [], []   # pairs of episodes share a task
        for turn in range(3):
            await asyncio.sleep(rng.random() / 200)
            reply = await engine.generate(list(messages))
            messages.append(reply["tokens"].tolist())
            tokens.append(reply["tokens"]); rewards.append(reply["reward"])
        return torch.cat(tokens), sum(rewards)

    async def main():
        engine = MockScheduler(Engine() if mode == "dump" else None, cfg, methods=["generate"], spec=Engine)
        with engine:
            for step in range(3):
                with engine.at_step(step):
                    episodes = await asyncio.gather(*(episode(engine, step, i) for i in range(8)))
                loss = sum(model(t).pow(2).mean() * r for t, r in episodes)
                opt.zero_grad(); loss.backward(); opt.step()
                metrics.append(float(loss))
    asyncio.run(main())
    json.dump({"metrics": metrics, "params": model.weight.detach().flatten().tolist()}, open(out, "w"))
''')

PRODUCER = textwrap.dedent('''
    import json, queue, random, sys, threading, time
    import torch
    from rollout_mock import MockScheduler

    mode, dump_dir, out, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    STALENESS = 2
    rng = random.Random(seed)

    class Rollout:
        """AReaL-style: a producer thread generates trajectories under the current weight version
        (at most STALENESS versions behind); wait(count) returns what is ready."""
        def __init__(self):
            self.version, self.ready, self.stop = 0, queue.Queue(), False
            self.sampler = random.Random(7)
            self.slots = threading.Semaphore(8)
            threading.Thread(target=self.produce, daemon=True).start()
        def produce(self):
            while not self.stop:
                self.slots.acquire()
                time.sleep(rng.random() / 500)
                v = self.version
                n = self.sampler.randrange(2, 6)
                self.ready.put({"input_ids": torch.tensor([self.sampler.randrange(50) for _ in range(n)]),
                                "versions": torch.full((n,), v, dtype=torch.int32),
                                "rewards": torch.tensor(self.sampler.random())})
        def wait(self, count):
            batch = []
            while len(batch) < count:
                item = self.ready.get(timeout=60)
                self.slots.release()
                if self.version - int(item["versions"][0]) <= STALENESS:
                    batch.append(item)
            return batch
        def set_version(self, version):
            self.version = version

    def provenance(batch):
        return {"versions": [int(t["versions"].min()) for t in batch]}

    torch.manual_seed(0)
    model = torch.nn.Embedding(50, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = {"enable": True, "mode": mode, "dump_dir": dump_dir}
    real = Rollout() if mode == "dump" else None
    metrics = []
    with MockScheduler(real, cfg, methods=["wait"], spec=Rollout, provenance=provenance) as rollout:
        for step in range(4):
            with rollout.at_step(step):
                batch = rollout.wait(4) + rollout.wait(2)       # two consumptions per step
            loss = sum(model(t["input_ids"]).pow(2).mean() * t["rewards"] for t in batch)
            opt.zero_grad(); loss.backward(); opt.step()
            metrics.append([float(loss), [int(t["versions"][0]) for t in batch]])
            if real is not None:
                real.set_version(step + 1)
    if real is not None:
        real.stop = True
    json.dump({"metrics": metrics, "params": model.weight.detach().flatten().tolist()}, open(out, "w"))
''')


def _run(script: Path, mode: str, dump: Path, out: Path, seed: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), mode, str(dump), str(out), str(seed)], env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.mark.parametrize("name", ["agent", "producer"])
def test_dump_then_mock_in_separate_processes_is_bit_identical(tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(AGENT if name == "agent" else PRODUCER)
    dump = tmp_path / "dump"
    dumped = _run(script, "dump", dump, tmp_path / "dump.json", 1)
    replayed = _run(script, "mock", dump, tmp_path / "mock.json", 2)
    assert replayed == dumped
    # a third run that asks for more calls per step than recorded is stopped, naming the step
    changed = script.read_text().replace("range(8)", "range(9)").replace("rollout.wait(2)", "rollout.wait(2) + rollout.wait(1)")
    script.write_text(changed)
    env = {**os.environ, "PYTHONHASHSEED": "3"}
    done = subprocess.run([sys.executable, str(script), "mock", str(dump), str(tmp_path / "x.json"), "3"], env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode != 0 and "ReplayMismatchError" in done.stderr and "step 0" in done.stderr
