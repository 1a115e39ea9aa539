"""The body is decoded with the cyclic garbage collector off, on any number of threads at once, and
the decoded batch goes straight to the collector's oldest generation (docs/performance.md, the load
section); the collector is left as each caller had it."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import HANG_S

from rollout_mock import codec

# the module, not the function ``rollout_mock.codec.decode`` that shadows its name
decode_module: Any = sys.modules["rollout_mock.codec.decode"]


def _batch(tag: str) -> dict[str, Any]:
    return {"samples": [{"tokens": [i, i + 1, i + 2], "log_probs": [-0.5, -0.25], "tag": tag} for i in range(50)]}


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector enabled and unfrozen before and after the test, whatever the test does."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
        else:
            gc.disable()


def _in_oldest_generation(objects: list[Any]) -> bool:
    oldest = {id(x) for x in gc.get_objects(generation=2)}
    return all(id(x) in oldest for x in objects)


def test_a_decoded_batch_goes_straight_to_the_oldest_generation(collector: None) -> None:
    data = codec.encode_bytes(_batch("a"))
    gc.collect()  # young generations empty: after the decode, one young collection at most has run
    out = codec.decode(data)
    lists = [sample["tokens"] for sample in out["samples"]]
    assert _in_oldest_generation([out["samples"], *out["samples"], *lists])  # the root dict is not the body's
    assert gc.get_count()[0] < 50  # the decode's ~200 containers are not counted as young
    assert gc.isenabled()


def test_objects_the_caller_froze_stay_frozen(collector: None) -> None:
    data = codec.encode_bytes(_batch("b"))
    sentinel = [object()]  # a tracked container the caller froze
    gc.freeze()  # as before a fork: unfreezing would move these back where collections walk them
    assert gc.get_freeze_count() > 0
    out = codec.decode(data)
    # still frozen: in no generation (the freeze count itself may drop, as frozen objects die)
    assert gc.get_freeze_count() > 0
    assert not any(sentinel is x for generation in range(3) for x in gc.get_objects(generation=generation))
    assert not _in_oldest_generation(out["samples"])  # the batch stays young: nothing was moved
    assert gc.isenabled()


def test_a_disabled_collector_moves_nothing_and_stays_disabled(collector: None) -> None:
    data = codec.encode_bytes(_batch("c"))
    gc.collect()
    gc.disable()
    out = codec.decode(data)
    assert not gc.isenabled()
    assert not _in_oldest_generation(out["samples"])


class _Gate:
    """Holds each named thread's body decode inside its first marked list until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = {name: threading.Event() for name in ("a", "b")}
        self.release = {name: threading.Event() for name in ("a", "b")}
        self.seen: dict[str, list[bool]] = {"a": [], "b": []}
        lists = decode_module.BodyReader.lists

        def held(items: list[Any]) -> Any:
            name = threading.current_thread().name
            if name in self.entered and not self.entered[name].is_set():
                self.entered[name].set()
                assert self.release[name].wait(HANG_S), "the test never released the decode"
            if name in self.seen:
                self.seen[name].append(gc.isenabled())
            return lists(items)

        monkeypatch.setattr(decode_module.BodyReader, "lists", staticmethod(held))

    def start(self, name: str, data: bytes, results: dict[str, Any]) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, codec.decode(data)), name=name)
        thread.start()
        assert self.entered[name].wait(HANG_S)
        return thread


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "caller-disabled"])
@pytest.mark.parametrize("first_done", ["a", "b"])
def test_overlapping_loads_on_two_threads_leave_the_collector_as_it_was(
        collector: None, monkeypatch: pytest.MonkeyPatch, enabled: bool, first_done: str) -> None:
    data = {name: codec.encode_bytes(_batch(name)) for name in ("a", "b")}
    gate = _Gate(monkeypatch)
    if not enabled:
        gc.disable()
    results: dict[str, Any] = {}
    threads = {name: gate.start(name, data[name], results) for name in ("a", "b")}  # both inside a decode
    assert not gc.isenabled()
    last_done = "b" if first_done == "a" else "a"
    gate.release[first_done].set()
    threads[first_done].join(HANG_S)
    assert first_done in results and not threads[first_done].is_alive()
    assert not gc.isenabled()  # the other decode is still running: the collector stays off
    gate.release[last_done].set()
    threads[last_done].join(HANG_S)
    assert last_done in results and not threads[last_done].is_alive()
    assert gc.isenabled() is enabled
    assert not any(gate.seen["a"] + gate.seen["b"])
    assert results == {name: _batch(name) for name in ("a", "b")}
    if enabled:
        assert _in_oldest_generation([*results["a"]["samples"], *results["b"]["samples"]])
