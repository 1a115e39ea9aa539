"""CUDA batches without a GPU (issue 29): the staging of device tensors through pinned buffers in
dump mode, and the placement of replayed tensors on a device in mock mode, run against a fake
device runtime (:class:`FakeBackend`) whose copies land only when an event is waited for, as a
CUDA copy on a side stream lands only when it has run. What it checks: the same file bytes as the
CPU path, the order of stream waits/events, the writer thread waiting for the copies, buffer
reuse and bounds, the recorded device, the ``device:`` option, and the prefetch overlap.
The same paths on a real GPU: tests/gpu/test_gpu_staging.py."""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S

from rollout_mock import ConfigError, MockScheduler, load_config, open_dump
from rollout_mock.codec import BufferPool, capture, decode, encode_bytes
from rollout_mock.codec.device import DevicePlacement, StagedCopies
from rollout_mock.codec.format import check_tree
from rollout_mock.config import config_parts
from rollout_mock.storage.reader import Prefetcher

#: (``rollout_mock.codec.encode`` as an attribute is the function the package re-exports)
encode_module = importlib.import_module("rollout_mock.codec.encode")
device_module = importlib.import_module("rollout_mock.codec.device")
SENTINEL = 0xAB


class FakeStream:
    def __init__(self, name: str, backend: FakeBackend) -> None:
        self.name, self.backend = name, backend
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __repr__(self) -> str:
        return self.name

    def wait_stream(self, other: FakeStream) -> None:
        self.backend.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.backend.log.append(("wait_event", self.name, event.name, threading.current_thread().name))


class FakeEvent:
    def __init__(self, name: str, backend: FakeBackend) -> None:
        self.name, self.backend = name, backend
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(self, stream: FakeStream) -> None:
        self.copies, stream.queue = stream.queue, []
        self.backend.log.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        for dst, src in self.copies:  # the copies run now: they read the source as it is now
            dst.copy_(src)
        self.copies = []
        self.backend.log.append(("synchronize", self.name, threading.current_thread().name))


class FakeBackend:
    """A device runtime whose 'device' tensors are CPU tensors (``stages`` picks them) and whose
    copies are queued on streams and run when an event recorded after them is synchronized."""

    def __init__(self, *, stages: Any = None, available: bool = True, devices: int = 2) -> None:
        self._stages = stages or (lambda t: True)
        self._available, self.devices = available, devices
        self.log: list[tuple[Any, ...]] = []
        self.streams: dict[Any, FakeStream] = {}
        self.pinned_allocs: list[int] = []
        self.recorded_streams: list[tuple[int, str]] = []
        self.on_device: dict[int, Any] = {}  # id(tensor) -> device, for tensors made by to_device
        self._events = 0

    def stages(self, tensor: torch.Tensor) -> bool:
        return bool(self._stages(tensor))

    def available(self) -> bool:
        return self._available

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return 0

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.pinned_allocs.append(nbytes)
        return torch.full((nbytes,), SENTINEL, dtype=torch.uint8)

    def _stream(self, name: str) -> FakeStream:
        return self.streams.setdefault(name, FakeStream(name, self))

    def current_stream(self, device: Any) -> FakeStream:
        return self._stream(f"current:{device}")

    def side_stream(self, device: Any, direction: str) -> FakeStream:
        return self._stream(f"side:{device}:{direction}")

    def event(self) -> FakeEvent:
        self._events += 1
        return FakeEvent(f"e{self._events}", self)

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, stream: FakeStream) -> None:
        stream.queue.append((dst, src))
        self.log.append(("copy", stream.name, tuple(src.shape)))
        self.recorded_streams.append((id(src), stream.name))

    def to_device(self, src: torch.Tensor, device: Any, stream: FakeStream) -> torch.Tensor:
        out = torch.empty_like(src)
        stream.queue.append((out, src))
        self.on_device[id(out)] = device
        self.log.append(("to_device", stream.name, device))
        return out

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self.recorded_streams.append((id(tensor), stream.name))


def batch_of_every_kind() -> dict[str, Any]:
    """Big tensors (chunks of their own), small ones (the body's shared chunks), a strided view,
    a conjugate view, a Parameter, bools, bfloat16, empty tensors, numpy and strings."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(600, 1000, generator=g)
    return {
        "big": big,
        "strided": big[:, ::3],
        "conj": torch.randn(300, 200, dtype=torch.complex64, generator=g).conj(),
        "param": torch.nn.Parameter(torch.randn(17, 5, generator=g), requires_grad=False),
        "empty": torch.empty(0, 4),
        "samples": [{"ids": torch.arange(100) + i, "mask": torch.rand(100, generator=g) > 0.5,
                     "lp": torch.randn(100, generator=g).to(torch.bfloat16), "i": i} for i in range(40)],
        "mid": [torch.randn(40_000, generator=g)],  # 160 KB: a body tensor between 64 KiB and 1 MiB
        "array": np.arange(12.0).reshape(3, 4),
        "text": np.array(["a", "bb", "ccc"], dtype=object),
        "meta": {"step": 3},
    }


# --------------------------------------------------------------------------- dump mode: staging


def test_staged_capture_writes_the_same_bytes_as_the_cpu_path() -> None:
    batch = batch_of_every_kind()
    fake = FakeBackend()
    cap = capture(batch, pool=BufferPool(keep=1, backend=fake))
    copies = [entry for entry in fake.log if entry[0] == "copy"]
    assert len(copies) >= 40 * 3 + 4  # every non-empty tensor went through the staging path
    assert encode_bytes(cap) == encode_bytes(batch)


def test_the_call_only_queues_copies_and_the_bytes_are_read_after_the_event() -> None:
    """Nothing reads a staged tensor's bytes before the event is waited for: at capture time the
    pinned buffers are untouched, and a copy that ran later (a write before it, in the fake)
    is what gets written."""
    fake = FakeBackend()
    batch = {"big": torch.zeros(512, 1024), "small": [torch.zeros(16) for _ in range(3)]}
    cap = capture(batch, pool=BufferPool(keep=1, backend=fake))
    assert all(entry[0] != "synchronize" for entry in fake.log)
    assert fake.pinned_allocs and all(bool((b == SENTINEL).all()) for b in cap.pinned)  # no byte copied yet
    batch["big"].fill_(7.0)  # in CUDA terms: a value written before the side stream ran the copy
    batch["small"][1].fill_(3.0)
    loaded = decode(encode_bytes(cap))
    assert torch.all(loaded["big"] == 7.0) and torch.all(loaded["small"][1] == 3.0)


def test_stream_order_side_waits_for_the_producer_and_the_producer_for_the_copies() -> None:
    fake = FakeBackend()
    batch = {"a": torch.randn(300, 1000), "b": torch.randn(1000, 300).t(), "c": torch.randn(300, 1000)}
    cap = capture(batch, pool=BufferPool(keep=1, backend=fake))
    kinds = [(entry[0], entry[1]) for entry in fake.log]
    side, producer = "side:cpu:d2h", "current:cpu"
    assert kinds == [
        ("wait_stream", side), ("copy", side),  # ordered after the producer's queued kernels
        ("wait_stream", side), ("copy", side),  # "b" was made contiguous on the device: wait again
        ("copy", side),
        ("record", "e1"), ("wait_event", producer),  # later producer kernels run after the copies
    ]
    assert fake.log[0][2] == producer
    assert len(fake.recorded_streams) == 3  # every source is kept alive for the side stream
    cap.finish()
    assert fake.log[-1][0] == "synchronize"


def test_the_writer_thread_waits_for_the_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBackend()
    monkeypatch.setattr(device_module, "CUDA", fake)  # the BufferPool default
    batch = {"x": torch.zeros(256, 1024), "ids": [torch.arange(10)]}

    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> Any:
            batch["x"].fill_(float(global_step))
            return batch

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "max_pending": 1}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(3):
            sched.get_batch(None, global_step=step)
            sched.interceptor.flush()  # the next step's fill must not race the fake's late copy
    waits = [entry for entry in fake.log if entry[0] == "synchronize"]
    assert len(waits) == 3 and {entry[2] for entry in waits} == {"rollout-mock-writer"}
    dump = open_dump(tmp_path)
    for step in range(3):
        assert torch.all(dump.load(step)["x"] == float(step))


def test_pinned_buffers_are_reused_grown_and_bounded() -> None:
    fake = FakeBackend()
    pool = BufferPool(keep=2, backend=fake)
    step = {"x": torch.randn(1000, 1000)}
    first = capture(step, pool=pool)
    first.finish()
    first.release()
    allocated = len(fake.pinned_allocs)
    assert pool.pinned_bytes >= 4_000_000 and pool.free_bytes == 0  # pinned, kept apart
    second = capture({"x": torch.randn(1050, 1000)}, pool=pool)  # 5% larger: the headroom fits it
    assert len(fake.pinned_allocs) == allocated and pool.pinned_bytes == 0
    second.finish()
    second.release()
    third = capture({"x": torch.randn(3000, 1000)}, pool=pool)  # grown: a new buffer
    assert len(fake.pinned_allocs) == allocated + 1
    third.finish()
    third.release()
    for _ in range(3):
        cap = capture({"x": torch.randn(3000, 1000)}, pool=pool)
        cap.finish()
        cap.release()
    assert len(fake.pinned_allocs) == allocated + 1  # reused from then on
    assert pool.pinned_bytes <= pool.keep * max(fake.pinned_allocs)  # keep captures' worth at most


def test_max_pending_bounds_the_pinned_memory_of_a_dump_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBackend()
    monkeypatch.setattr(device_module, "CUDA", fake)  # the BufferPool default

    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return {"x": torch.full((512, 1024), float(global_step))}

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "max_pending": 2}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(8):
            sched.get_batch(None, global_step=step)
        pool = sched.interceptor._buffers
        assert pool is not None and pool.keep == 2
    one = 512 * 1024 * 4
    assert len(fake.pinned_allocs) <= 2 * 2  # pending captures plus the pool's keep, never one a step
    assert pool.pinned_bytes <= 2 * max(fake.pinned_allocs) and pool.pinned_bytes >= one


def test_a_capture_released_unwritten_waits_for_its_copies_first() -> None:
    fake = FakeBackend()
    pool = BufferPool(keep=1, backend=fake)
    cap = capture({"x": torch.ones(256, 1024)}, pool=pool)
    cap.release()  # e.g. on_disk_full=skip fired while it waited for the writer
    assert fake.log[-1][0] == "synchronize" and pool.pinned_bytes > 0


def test_a_capture_that_fails_waits_for_the_copies_it_queued() -> None:
    fake = FakeBackend()

    class Unrecordable:
        def __reduce__(self) -> Any:
            raise RuntimeError("no")

    with pytest.raises(TypeError, match="cannot record"):
        capture({"x": torch.ones(256, 1024), "z": [Unrecordable()]}, pool=BufferPool(keep=1, backend=fake))
    assert ("copy", "side:cpu:d2h", (256 * 1024 * 4,)) in fake.log
    assert fake.log[-1][0] == "synchronize"


def test_tensors_the_backend_does_not_stage_keep_the_cpu_path() -> None:
    fake = FakeBackend(stages=lambda t: False)
    batch = batch_of_every_kind()
    cap = capture(batch, pool=BufferPool(keep=1, backend=fake))
    assert fake.log == [] and fake.pinned_allocs == [] and cap.staged is None
    assert encode_bytes(cap) == encode_bytes(batch)


def test_staged_copies_need_no_wait_when_nothing_was_staged() -> None:
    copies = StagedCopies(FakeBackend())
    copies.close()
    copies.wait()
    assert copies.events == [] and copies.copies == 0


# --------------------------------------------------------------------------- the recorded device


def recorded_on_cuda(monkeypatch: pytest.MonkeyPatch, index: int = 1) -> None:
    """Make the encoder believe every tensor is on ``cuda:index``."""
    monkeypatch.setattr(encode_module, "cuda_index", lambda tensor: index)


def test_each_tensor_records_its_cuda_device_in_nodes_and_body(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded_on_cuda(monkeypatch, 1)
    data = encode_bytes({"big": torch.randn(300, 1000), "small": [torch.arange(5)]})
    header = data[: data.index(b'"chunks"')]
    assert b'"cuda":1' in header  # the structural node of "big"
    placement = DevicePlacement("auto", backend=FakeBackend())
    placed = placement.load(lambda step: decode(data), 0, 0)
    fake = placement.backend
    assert isinstance(fake, FakeBackend)
    assert fake.on_device[id(placed.batch["big"])] == 1
    assert fake.on_device[id(placed.batch["small"][0])] == 1  # the body tensor's flag and byte


def test_auto_leaves_tensors_recorded_on_the_cpu_and_old_files_there() -> None:
    fake = FakeBackend()
    batch = {"x": torch.randn(300, 1000), "small": [torch.arange(5)]}
    placed = DevicePlacement("auto", backend=fake).load(lambda step: decode(encode_bytes(batch)), 0, 0)
    assert fake.on_device == {} and placed.events == {}
    assert torch.equal(placed.batch["x"], batch["x"])


def test_auto_places_rows_taken_after_decoding_like_the_tensor_they_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial load that selects rows after decoding (an HMAC-keyed dump) hands out views: they
    go where the tensor they view was recorded; a fresh tensor of the reader's stays on the CPU."""
    recorded_on_cuda(monkeypatch, 1)
    data = encode_bytes({"x": torch.randn(300, 1000)})
    fake = FakeBackend()

    def load(step: int) -> Any:
        whole = decode(data)
        return {"x": whole["x"][10:20], "fresh": whole["x"][[1, 2]]}

    placed = DevicePlacement("auto", backend=fake).load(load, 0, 0)
    assert fake.on_device[id(placed.batch["x"])] == 1
    assert id(placed.batch["fresh"]) not in fake.on_device


@pytest.mark.parametrize("bad", ["x", -1, 1 << 20, 1.0, None])
def test_a_recorded_device_that_is_not_an_index_is_refused(bad: Any) -> None:
    node = {"$": "tensor", "dtype": "float32", "shape": [1], "c": [0, 1], "cuda": bad}
    with pytest.raises(ValueError, match="expected an integer"):
        check_tree(node, [[0, 4, 4, 0, 0, 0]])
    assert check_tree({**node, "cuda": 7}, [[0, 4, 4, 0, 0, 0]]) == 4


# --------------------------------------------------------------------------- mock mode: placement


def test_placement_reads_into_pinned_memory_and_hands_off_on_the_callers_streams() -> None:
    fake = FakeBackend()
    batch = {"x": torch.randn(300, 1000), "p": torch.nn.Parameter(torch.ones(3), requires_grad=False),
             "rows": [torch.arange(4) for _ in range(3)], "array": np.arange(3), "meta": {"k": "v"}}
    data = encode_bytes(batch)
    placement = DevicePlacement("cuda:1", backend=fake)
    placed = placement.load(lambda step: decode(data), 0, placement.target())
    assert fake.pinned_allocs  # the decoder's chunk reads went to pinned memory
    out = placed.batch
    assert fake.on_device[id(out["x"])] == 1 and fake.on_device[id(out["rows"][2])] == 1
    assert type(out["p"]) is torch.nn.Parameter and not out["p"].requires_grad
    assert out["array"] is not None and out["meta"] == {"k": "v"}
    sync = [entry for entry in fake.log if entry[0] == "synchronize"]
    assert len(sync) == 1  # the copies are waited for where the load ran
    assert torch.equal(out["x"], batch["x"]) and torch.equal(out["rows"][2], torch.arange(4))
    fake.recorded_streams.clear()
    assert placement.hand_off(placed) is out
    assert fake.log[-1][:3] == ("wait_event", "current:1", sync[0][1])
    assert {stream for _, stream in fake.recorded_streams} == {"current:1"}
    assert len(fake.recorded_streams) == 5  # x, p and three rows


def test_placement_moves_dataproto_and_tensordict_leaves() -> None:
    verl = pytest.importorskip("verl")
    from tensordict import TensorDict

    fake = FakeBackend()
    td = TensorDict({"ids": torch.arange(8).view(4, 2), "lp": torch.randn(4, 2)}, batch_size=[4])
    proto = verl.DataProto(batch=td, non_tensor_batch={"uid": np.array(list("abcd"), dtype=object)},
                           meta_info={"global_step": 2})
    data = encode_bytes({"proto": proto, "td": td.clone(), "locked": td.clone().lock_()})
    placed = DevicePlacement("cuda", backend=fake).load(lambda step: decode(data), 0, 0)
    out = placed.batch
    # through the type's own map_tensors (registered by the adapter): a locked one stays locked
    assert out["locked"].is_locked and fake.on_device[id(out["locked"]["ids"])] == 0
    assert type(out["proto"]) is type(proto)
    assert fake.on_device[id(out["proto"].batch["ids"])] == 0
    assert fake.on_device[id(out["td"]["lp"])] == 0
    assert list(out["proto"].non_tensor_batch["uid"]) == list("abcd") and out["proto"].meta_info["global_step"] == 2
    assert torch.equal(out["proto"].batch["lp"], td["lp"])


def test_prefetch_copies_the_next_step_on_the_worker_and_hands_it_off_on_the_caller() -> None:
    fake = FakeBackend()
    steps = {s: encode_bytes({"x": torch.full((300, 1000), float(s))}) for s in range(3)}
    placement = DevicePlacement("cuda", backend=fake)
    prefetcher = Prefetcher(lambda s: decode(steps[s]), lambda s: s + 1 if s + 1 in steps else None, place=placement)
    try:
        first = prefetcher.get(0)
        assert torch.all(first["x"] == 0.0) and fake.on_device[id(first["x"])] == 0
        pending = prefetcher._pending[1]
        pending.result(timeout=HANG_S)  # step 1 was loaded and copied in the background...
        synced = [entry for entry in fake.log if entry[0] == "synchronize"]
        assert synced[-1][2].startswith("rollout-mock-prefetch")  # ...and waited for there
        before = len(fake.log)
        second = prefetcher.get(1)
        handed = fake.log[before:]
        assert handed[0][:2] == ("wait_event", "current:0") and handed[0][3] == threading.current_thread().name
        assert torch.all(second["x"] == 1.0) and prefetcher.hits == 1
    finally:
        prefetcher.close()


# --------------------------------------------------------------------------- the device option


@pytest.mark.parametrize(("given", "stored"), [("cpu", "cpu"), (" CUDA ", "cuda"), ("cuda:3", "cuda:3"),
                                               ("auto", "auto")])
def test_device_option_is_parsed_and_reaches_the_replayer(given: str, stored: str) -> None:
    config = load_config({"enable": True, "mode": "mock", "dump_dir": "d", "device": given})
    assert config.device == stored and config_parts(config).replay.device == stored
    assert load_config({"enable": True, "mode": "mock", "dump_dir": "d"}).device == "cpu"


@pytest.mark.parametrize("given", ["gpu", "cuda:", "cuda:-1", "cuda:x", "mps", ""])
def test_a_bad_device_is_a_config_error_naming_the_choices(given: str) -> None:
    with pytest.raises(ConfigError, match=r"rollout_mock\.device: .*cpu, cuda, cuda:N .* or auto"):
        load_config({"enable": True, "mode": "mock", "dump_dir": "d", "device": given})


def test_placement_for_setting_checks_the_machine() -> None:
    assert DevicePlacement.for_setting("cpu") is None
    with pytest.raises(ConfigError, match="CUDA is not available here.*set `device: cpu`"):
        DevicePlacement.for_setting("cuda", backend=FakeBackend(available=False))
    with pytest.raises(ConfigError, match=r"only 2 CUDA device\(s\) are visible"):
        DevicePlacement.for_setting("cuda:2", backend=FakeBackend(devices=2))
    assert DevicePlacement.for_setting("auto", backend=FakeBackend(available=False)) is not None


def _dump(tmp_path: Path, steps: int = 2) -> None:
    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return {"x": torch.full((4, 3), float(global_step)), "small": [torch.arange(3)]}

    with MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path)}) as sched:
        for step in range(steps):
            sched.get_batch(None, global_step=step)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_device_cuda_without_cuda_fails_when_the_replay_starts(tmp_path: Path) -> None:
    _dump(tmp_path)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "cuda"}
    with pytest.raises(ConfigError, match="device: 'cuda' but CUDA is not available") as info:
        MockScheduler(None, config)
    assert info.value.mode == "mock"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a machine without CUDA")
def test_auto_without_cuda_replays_a_cuda_dump_on_the_cpu_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    recorded_on_cuda(monkeypatch, 0)
    _dump(tmp_path, 3)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "auto"}
    with caplog.at_level(logging.WARNING, logger="rollout_mock"), MockScheduler(None, config) as sched:
        batches = [sched.get_batch(None, global_step=step) for step in range(3)]
    assert [float(b["x"][0, 0]) for b in batches] == [0.0, 1.0, 2.0]
    assert all(b["x"].device.type == "cpu" for b in batches)
    warned = [r for r in caplog.records if "device: auto" in r.getMessage()]
    assert len(warned) == 1 and "stay on the CPU" in warned[0].getMessage()


def test_device_cuda_replays_through_the_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole mock path with the fake runtime: MockScheduler -> Replayer -> Prefetcher -> placement."""
    _dump(tmp_path, 3)
    fake = FakeBackend()
    import rollout_mock.codec.device as device_module

    monkeypatch.setattr(device_module, "CUDA", fake)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "device": "cuda"}
    with MockScheduler(None, config) as sched:
        batches = [sched.get_batch(None, global_step=step) for step in range(3)]
    for step, batch in enumerate(batches):
        assert fake.on_device[id(batch["x"])] == 0 and fake.on_device[id(batch["small"][0])] == 0
        assert torch.all(batch["x"] == float(step))
    assert sum(entry[0] == "wait_event" for entry in fake.log) == 3
