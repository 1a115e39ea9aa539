"""Transient reads (string columns, the body) go to a bounded, reused scratch memory, and the
body is decoded with the cyclic garbage collector paused (docs/performance.md, the load section)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HANG_S

from rollout_mock import CorruptStepError, codec

# the module, not the function ``rollout_mock.codec.decode`` that shadows its name
decode_module: Any = sys.modules["rollout_mock.codec.decode"]
Scratch = decode_module.Scratch


def _step(n: int, width: int, tag: str) -> tuple[dict[str, Any], bytes]:
    batch = {
        "big": np.array([f"{tag}{i:05d}" + "é" * width for i in range(n)], dtype=object),
        "small": np.array([f"{tag}-a", f"{tag}-b"], dtype=object),
        "samples": [{"tokens": [i, i + 1], "log_probs": [-0.0, float("nan")], "pair": (tag, i),
                     "tags": {tag}, "raw": tag.encode() * 3} for i in range(4)],
    }
    return batch, codec.encode_bytes(batch)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)  # -0.0 and nan as written
    return bool(a == b)


class Leases:
    """One scratch of ``cap`` bytes, handed to every load (instead of the process's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cap: int) -> None:
        self.scratch = Scratch(cap)
        self.leased = self.returned = 0
        monkeypatch.setattr(decode_module, "lease_scratch", self.lease)
        monkeypatch.setattr(decode_module, "return_scratch", self.give_back)

    def lease(self) -> Any:
        self.leased += 1
        return self.scratch

    def give_back(self, scratch: Any) -> None:
        assert scratch is self.scratch
        scratch.drop(0)
        self.returned += 1


def test_a_column_larger_than_the_cap_gets_memory_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = 256 << 10
    leases = Leases(monkeypatch, cap)
    batch, data = _step(200, 1000, "p")  # a ~400 KB string column: over the cap
    assert _same(codec.decode(data), batch)
    scratch = leases.scratch
    assert 0 < scratch.peak <= cap  # the small column and the body went there, the big one did not
    assert scratch.nbytes <= cap
    assert leases.leased == leases.returned == 1 and scratch.top == 0


def test_the_scratch_never_hands_out_more_than_its_cap() -> None:
    scratch = Scratch(1 << 20)
    assert scratch.take((1 << 20) + 1) is None  # a hostile size: refused, nothing allocated
    assert scratch.nbytes == 0
    first = scratch.take(600 << 10)
    assert first is not None and first.nbytes == 600 << 10
    assert scratch.take(600 << 10) is None  # would end past the cap
    top = scratch.top
    inner = scratch.take(100)
    assert inner is not None
    scratch.drop(top)
    again = scratch.take(100)
    assert again is not None and again.ctypes.data == inner.ctypes.data  # the same (touched) memory
    assert scratch.nbytes == 1 << 20 and scratch.peak <= 1 << 20


def test_the_process_keeps_a_bounded_number_of_scratch_buffers() -> None:
    leased = []
    try:
        for _ in range(decode_module.SCRATCH_BUFFERS + 3):
            leased.append(decode_module.lease_scratch())
        held = [s for s in leased if s is not None]
        assert len(held) <= decode_module.SCRATCH_BUFFERS
        assert leased[-1] is None
        assert all(s.cap == decode_module.SCRATCH_BYTES for s in held)
    finally:
        for s in leased:
            if s is not None:
                decode_module.return_scratch(s)


def test_values_do_not_share_the_scratch_with_the_next_load(monkeypatch: pytest.MonkeyPatch) -> None:
    leases = Leases(monkeypatch, 8 << 20)
    first, first_data = _step(50, 100, "a")
    second, second_data = _step(50, 100, "b")
    out = codec.decode(first_data)
    address = leases.scratch.take(1).ctypes.data  # type: ignore[union-attr]
    leases.scratch.drop(0)
    assert _same(codec.decode(second_data), second)
    assert leases.scratch.take(1).ctypes.data == address  # type: ignore[union-attr]  # reused
    assert _same(out, first)  # the first load's strings, bytes and lists are copies of their own


def test_a_corrupt_column_in_the_scratch_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    leases = Leases(monkeypatch, 8 << 20)
    _, data = _step(50, 100, "a")
    broken = bytearray(data)
    at = bytes(broken).index(b"a00007")
    broken[at] ^= 0x01
    with pytest.raises(CorruptStepError, match="CRC-32"):
        codec.decode(bytes(broken))
    assert leases.returned == 1 and leases.scratch.top == 0  # given back after the failure too


def _watch_collector(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[bool]:
    seen: list[bool] = []
    lists = decode_module.BodyReader.lists

    def watched(items: list[Any]) -> Any:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("planted failure")
        return lists(items)

    monkeypatch.setattr(decode_module.BodyReader, "lists", staticmethod(watched))
    return seen


def test_the_body_is_decoded_with_the_collector_paused_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    batch, data = _step(4, 10, "g")
    seen = _watch_collector(monkeypatch)
    assert gc.isenabled()
    assert _same(codec.decode(data), batch)
    assert seen and not any(seen)
    assert gc.isenabled()


def test_the_collector_is_restored_after_a_failing_body(monkeypatch: pytest.MonkeyPatch) -> None:
    _, data = _step(4, 10, "g")
    seen = _watch_collector(monkeypatch, fail=True)
    with pytest.raises(CorruptStepError, match="planted failure"):
        codec.decode(data)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    batch, data = _step(4, 10, "g")
    gc.disable()
    try:
        assert _same(codec.decode(data), batch)
        assert not gc.isenabled()
    finally:
        gc.enable()


_REFAULTS = r"""
import resource, sys
import numpy as np
from rollout_mock import codec
if sys.argv[1] == "load":
    codec.decode(codec.encode_bytes({"s": np.array(["x"], dtype=object)}))  # a first load
def faults_of_strings():
    strings = [("%06d" % i) * 700 for i in range(9000)]  # 38 MB of 4 KB strings, as verl's columns
    del strings  # freed: the heap keeps their memory, or hands it back to the kernel
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    strings = [("%06d" % i) * 700 for i in range(9000)]
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults_of_strings())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or __import__("platform").libc_ver()[0] != "glibc",
                    reason="glibc's dynamic mmap/trim thresholds")
def test_after_a_first_load_freed_strings_are_reused_not_faulted_in_again() -> None:
    """The first load raises glibc's dynamic thresholds once (:func:`settle_allocator`: a block
    of just under 32 MiB allocated and freed, never touched): 38 MB of strings freed and made
    again then reuse the heap's memory instead of faulting in ~9,300 new pages, as they do in a
    fresh process that never freed a large block. Page faults are counted, not time (in fresh
    processes: the thresholds only ever rise)."""
    import subprocess

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _REFAULTS, mode], capture_output=True, text=True, check=True,
                             timeout=HANG_S)
        return int(out.stdout.split()[-1])

    assert faults("fresh") > 6000  # what a load's strings cost without it
    assert faults("load") < 1000
    assert decode_module.SETTLE_BYTES <= 32 << 20  # glibc raises its thresholds up to 32 MiB only


def _load_and_write_in_child(path: str, out: str, queue: Any) -> None:
    loaded = codec.decode(path)["s"]
    Path(out).write_bytes(codec.encode_bytes({"s": loaded}))
    from rollout_mock import DirectoryStore
    from rollout_mock.storage import BatchInfo
    from rollout_mock.storage.manifest import StreamId

    store = DirectoryStore(Path(out).parent / "store")
    batch = {"s": loaded}
    store.save(StreamId("train"), 0, batch, BatchInfo.of(batch))  # head last: the codec's threads
    queue.put(len(store.load(StreamId("train"), 0)["s"]))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_loads_and_writes_after_its_parent_did(tmp_path: Path) -> None:
    """A child forked after the parent loaded and wrote (a DataLoader worker) has none of the
    parent's threads: the codec's thread pools are made anew there. Before, the child's load
    queued its decode for a thread that did not exist and waited forever."""
    import multiprocessing

    from rollout_mock import DirectoryStore
    from rollout_mock.storage import BatchInfo
    from rollout_mock.storage.manifest import StreamId

    texts = np.array(["word " * 1000 + str(i) for i in range(4000)], dtype=object)  # 20 MB: mapped, on the threads
    path = tmp_path / "step.bin"
    path.write_bytes(codec.encode_bytes({"s": texts}))
    assert len(codec.decode(path)["s"]) == 4000  # the parent's decoder thread and pool exist now
    parent = DirectoryStore(tmp_path / "parent")
    parent.save(StreamId("train"), 0, {"s": texts}, BatchInfo.of({"s": texts}))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_load_and_write_in_child, args=(str(path), str(tmp_path / "out.bin"), queue))
    child.start()
    try:
        assert queue.get(timeout=HANG_S) == 4000  # (the bound only ends a hang)
        child.join(timeout=HANG_S)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    assert codec.decode(tmp_path / "out.bin")["s"].tolist() == texts.tolist()
