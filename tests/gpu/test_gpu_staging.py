"""On a real GPU (issue 29): CUDA batches recorded through pinned buffers on a side stream, replayed
onto the device, and a dump -> mock training loop on CUDA that stays bit-identical.

The same logic without a GPU (a fake runtime whose copies land only when an event is waited for):
tests/unit/test_device_staging.py. Sizes are small (a few MB); the 1 GB figures are in
benchmarks/bench_gpu.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

from rollout_mock import MockScheduler, open_dump
from rollout_mock.codec import BufferPool, capture, decode, encode, encode_bytes
from rollout_mock.determinism import FINGERPRINT_ENV_VARS, PROFILE_VAR, SEED_VAR, TF32_VAR

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_batch(step: int, *, big_rows: int = 512) -> dict[str, Any]:
    """CUDA tensors of every layout the encoder meets: big ones (chunks of their own), a strided
    view, small ones (the body's shared chunks), bf16, bools, a Parameter, an empty tensor; and
    a CPU tensor and plain values beside them."""
    g = torch.Generator().manual_seed(step)
    big = torch.randn(big_rows, 1024, generator=g).cuda()
    return {
        "big": big,
        "strided": big[:, ::2],
        "ids": torch.randint(0, 50_000, (64, 128), generator=g).cuda(),
        "samples": [{"lp": torch.randn(32, generator=g).to(torch.bfloat16).cuda(),
                     "mask": (torch.rand(32, generator=g) > 0.5).cuda()} for _ in range(8)],
        "param": torch.nn.Parameter(torch.randn(7, 3, generator=g).cuda(), requires_grad=False),
        "empty": torch.empty(0, 4, device="cuda"),
        "cpu_ids": torch.arange(10) + step,
        "meta": {"step": step},
    }


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(value.detach().cpu(), requires_grad=False)
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    return value


def assert_same(got: Any, want: Any, *, device: str | None = None) -> None:
    """Bit for bit (torch.equal, dtypes equal); ``device``: every tensor of ``got`` is there."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), type(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        if device is not None:
            assert got.device.type == device, (got.device, device)
        assert torch.equal(got.cpu(), want.cpu())
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_same(got[key], want[key], device=device)
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b, device=device)
    else:
        assert got == want


# --------------------------------------------------------------------------- dump mode: staging


def test_staged_capture_uses_reused_pinned_buffers_and_writes_the_unstaged_bytes() -> None:
    pool = BufferPool(keep=2)
    buffers: list[set[int]] = []
    for step in range(3):
        batch = cuda_batch(step)
        cap = capture(batch, pool=pool)
        assert cap.pinned and all(buffer.is_pinned() for buffer in cap.pinned)
        buffers.append({buffer.data_ptr() for buffer in cap.pinned})
        staged = io.BytesIO()
        encode(cap, staged)
        cap.release()
        # the same bytes as the encoder without a pool (which copies with .cpu())
        assert staged.getvalue() == encode_bytes(batch)
        assert_same(decode(staged.getvalue()), to_cpu(batch), device="cpu")
    assert buffers[1] == buffers[0] and buffers[2] == buffers[0]  # the same pinned memory every step


def test_the_file_equals_the_dump_of_the_cpu_copy_but_for_the_recorded_device() -> None:
    batch = cuda_batch(0)
    pool = BufferPool(keep=1)
    cap = capture(batch, pool=pool)
    out = io.BytesIO()
    encode(cap, out)
    cap.release()
    assert_same(decode(out.getvalue()), decode(encode_bytes(to_cpu(batch))), device="cpu")
    assert b'"cuda":0' in out.getvalue()  # the device "big" was recorded on (device: auto)


def test_a_batch_changed_or_freed_right_after_the_dump_call_is_recorded_as_returned(tmp_path: Path) -> None:
    """In place on the producer's stream (and freed, its memory reused) as soon as the call returns,
    with no synchronisation: the recorded step holds the values the call returned."""
    expected: dict[int, dict[str, torch.Tensor]] = {}
    stream = torch.cuda.Stream()  # the rollout's own stream: the producer is the current one

    class Rollout:
        def get_batch(self, data: Any, global_step: int) -> Any:
            x = torch.full((4096, 4096), float(global_step), device="cuda")  # 64 MB: a copy that takes time
            ids = torch.arange(1000, device="cuda") * (global_step + 1)
            expected[global_step] = {"x": x.cpu(), "ids": ids.cpu()}
            return {"x": x, "ids": ids}

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "max_pending": 2}
    with torch.cuda.stream(stream), MockScheduler(Rollout(), config) as sched:
        for step in range(4):
            batch = sched.get_batch(None, global_step=step)
            batch["x"].mul_(-3.0).add_(1.0)  # queued at once on the producer's stream
            batch["ids"].zero_()
            del batch
            reuse = torch.full((4096, 4096), -7.0, device="cuda")  # may take the freed memory
            del reuse
        sched.interceptor.flush()
    torch.cuda.synchronize()
    dump = open_dump(tmp_path)
    for step in range(4):
        assert_same(dump.load(step), expected[step], device="cpu")


def test_a_capture_then_an_in_place_change_encodes_the_values_at_capture_time() -> None:
    pool = BufferPool(keep=1)
    batch = {"x": torch.randn(2048, 2048, device="cuda"), "small": [torch.arange(100, device="cuda")]}
    want = to_cpu(batch)
    cap = capture(batch, pool=pool)
    batch["x"].fill_(float("nan"))
    batch["small"][0].fill_(-1)
    out = io.BytesIO()
    encode(cap, out)  # on this thread: finish() waits for the copy events
    cap.release()
    assert_same(decode(out.getvalue()), want, device="cpu")


# --------------------------------------------------------------------------- mock mode: placement


def _dump_cuda_steps(path: Path, steps: int) -> dict[int, dict[str, Any]]:
    batches = {step: cuda_batch(step, big_rows=256) for step in range(steps)}

    class Rollout:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return batches[global_step]

    with MockScheduler(Rollout(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as sched:
        for step in range(steps):
            sched.get_batch(None, global_step=step)
    return {step: to_cpu(batch) for step, batch in batches.items()}


@pytest.mark.parametrize("prefetch", [True, False])
def test_device_cuda_replays_every_tensor_onto_the_current_device(tmp_path: Path, prefetch: bool) -> None:
    recorded = _dump_cuda_steps(tmp_path, 3)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "cuda", "prefetch": prefetch}
    with MockScheduler(None, config) as sched:
        for step in range(3):
            batch = sched.get_batch(None, global_step=step)
            assert_same(batch, recorded[step], device="cuda")  # the CPU-recorded tensor too
            assert type(batch["param"]) is torch.nn.Parameter


def test_device_cuda_n_and_auto_put_tensors_where_they_belong(tmp_path: Path) -> None:
    recorded = _dump_cuda_steps(tmp_path, 2)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "auto"}
    with MockScheduler(None, config) as sched:
        for step in range(2):
            batch = sched.get_batch(None, global_step=step)
            cpu_ids = batch.pop("cpu_ids")
            assert cpu_ids.device.type == "cpu" and torch.equal(cpu_ids, recorded[step]["cpu_ids"])
            assert_same(batch, {k: v for k, v in recorded[step].items() if k != "cpu_ids"}, device="cuda")
            assert batch["big"].device == torch.device("cuda", 0)
    config["device"] = "cuda:0"
    with MockScheduler(None, config) as sched:
        assert_same(sched.get_batch(None, global_step=1), recorded[1], device="cuda")


def test_a_replayed_batch_is_usable_on_another_current_stream(tmp_path: Path) -> None:
    """The hand-off makes the caller's current stream wait for the copies."""
    recorded = _dump_cuda_steps(tmp_path, 2)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "cuda"}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), MockScheduler(None, config) as sched:
        for step in range(2):
            batch = sched.get_batch(None, global_step=step)
            total = batch["big"].double().sum()  # queued on ``stream``
            assert float(total) == float(recorded[step]["big"].double().sum())


# --------------------------------------------------------------------------- dump -> mock, bit for bit

LOOP = textwrap.dedent(
    """
    import json, sys
    mode, dump_dir, out = sys.argv[1:4]
    from rollout_mock.determinism import apply
    apply(seed=0)  # before CUDA starts
    import torch
    from rollout_mock import MockScheduler

    class Rollout:
        '''Samples on the GPU: the batch is CUDA tensors.'''
        def __init__(self):
            self.g = torch.Generator(device="cuda")
            self.g.manual_seed(1)

        def get_batch(self, data, global_step):
            ids = torch.randint(0, 512, (64, 32), device="cuda", generator=self.g)
            rewards = torch.randn(64, device="cuda", generator=self.g)
            return {"input_ids": ids, "rewards": rewards, "mask": ids > 8, "meta": {"step": global_step}}

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {"enable": True, "mode": mode, "dump_dir": dump_dir, "device": "cuda"}
    devices = set()
    with MockScheduler(Rollout() if mode == "dump" else None, config) as sched:
        for step in range(5):
            batch = sched.get_batch(None, global_step=step)
            devices.update(str(batch[k].device) for k in ("input_ids", "rewards", "mask"))
            logits = model(batch["input_ids"])  # embedding backward: repeated indices
            picked = torch.nn.functional.one_hot(batch["input_ids"], 512)
            logp = (logits.log_softmax(-1) * picked).sum(-1)
            loss = -((logp * batch["mask"]).sum(-1) * batch["rewards"]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out)
    print(json.dumps({"devices": sorted(devices), "loss": loss.item().hex()}))
    """
)


def _loop(script: Path, mode: str, dump_dir: Path, out: Path) -> dict[str, Any]:
    hidden = {*FINGERPRINT_ENV_VARS, SEED_VAR, PROFILE_VAR, TF32_VAR}
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    done = subprocess.run([sys.executable, str(script), mode, str(dump_dir), str(out)],
                          capture_output=True, text=True, env=env, timeout=HANG_S, check=False)
    assert done.returncode == 0, f"{mode} run failed:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dump_then_mock_with_device_cuda_trains_to_the_same_bits(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP, encoding="utf-8")
    dump_dir = tmp_path / "dump"
    dumped = _loop(script, "dump", dump_dir, tmp_path / "dump.pt")
    mocked = _loop(script, "mock", dump_dir, tmp_path / "mock.pt")
    assert dumped["devices"] == ["cuda:0"] and mocked["devices"] == ["cuda:0"]
    assert mocked["loss"] == dumped["loss"]
    first = torch.load(tmp_path / "dump.pt")
    second = torch.load(tmp_path / "mock.pt")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
