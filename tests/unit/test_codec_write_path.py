"""One write path (issue 27): the dump-mode capture is written as captured, byte for byte what a
direct encode of the batch writes, and what rollout_mock wrote before captures were written
directly (the SHA-256 of each shape's step file, taken with the previous encoder)."""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import DirectoryStore, MemoryStore, codec
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")


# --------------------------------------------------------------------------- the four shapes
def tensors() -> dict[str, Any]:
    """~14 MB of tensors: steps over 8 MB take the writer's head-last path."""
    ids = (torch.arange(256 * 4096, dtype=torch.int64) * 7919 % 151_000).reshape(256, 4096)
    return {"input_ids": ids, "logprobs": (ids % 1000).to(torch.float32) / -1000.0,
            "attention_mask": ids % 5 != 0, "rewards": torch.linspace(-1, 1, 256)}


def slime() -> list[dict[str, Any]]:
    """slime's sample dicts: token and log-prob lists, strings, nested metadata."""
    out = []
    for i in range(64):
        n = 100 + (i * 37) % 400
        out.append({"index": i, "prompt": f"prompt {i} " * (n // 10), "response": "ok " * n,
                    "tokens": [(i * 31 + j * 17) % 150_000 for j in range(n)], "reward": i / 64 - 0.5,
                    "rollout_log_probs": [-(j % 97) / 97 for j in range(n)], "loss_mask": [1] * n,
                    "status": "completed", "metadata": {"source": "math", "tags": ["a", "b"], "score": None}})
    return out


def verl() -> Any:
    """verl's DataProto with object arrays of strings (string columns) and of dicts (the body)."""
    from verl.protocol import DataProto

    rows = 512
    prompts = np.array([f"question {i}: " + "x" * (64 + i % 300) for i in range(rows)], dtype=object)
    uid = np.array([f"{i // 8:08x}-uid" for i in range(rows)], dtype=object)
    extra = np.array([{"index": i, "split": "train"} for i in range(rows)], dtype=object)
    ids = torch.arange(rows * 64, dtype=torch.int64).reshape(rows, 64)
    return DataProto.from_dict(tensors={"input_ids": ids, "response_mask": ids % 3 == 0},
                               non_tensors={"raw_prompt": prompts, "uid": uid, "extra_info": extra},
                               meta_info={"global_step": 3, "temperature": 1.0})


def areal() -> list[dict[str, torch.Tensor]]:
    """AReaL's trajectories: many small tensors (shared chunks in the body)."""
    out = []
    for i in range(128):
        n = 200 + (i * 53) % 700
        ids = (torch.arange(n, dtype=torch.int32) * (i + 3) % 150_000).reshape(1, n)
        out.append({"input_ids": ids, "logprobs": ids.to(torch.float32) / -150_000, "loss_mask": ids % 2,
                    "attention_mask": torch.ones(1, n, dtype=torch.bool), "rewards": torch.tensor([i / 128])})
    return out


SHAPES = {"tensors": tensors, "slime": slime, "verl": verl, "areal": areal}
#: SHA-256 of each shape's step file as ``DirectoryStore.save(batch)`` wrote it before captures
#: were written directly (commit 67b6133): the step files of this version are the same bytes.
BEFORE = {
    "tensors": "ba1e36ba79309f8bd966bae24ae1de31da33f2617ea662ab03d2fa0896a5b4fe",
    "slime": "e6f7cd8630a6b03550ad4d552e6667556dd154c7598fa52b3175c0e8a0f791c9",
    "verl": "3b4a715ee816d82d8b7ee6d58229c17ffd12a347d5d7fb4227b4dd0509644287",
    "areal": "888c8f3dff57bfa734c40af3d338b3c6d9fedd7abeed922d39bed975b0cc826e",
}


def build(name: str) -> Any:
    if name == "verl":
        pytest.importorskip("verl.protocol")
    return SHAPES[name]()


def saved(tmp_path: Path, batch: Any, info: BatchInfo) -> bytes:
    store = DirectoryStore(tmp_path)
    store.save(STREAM, 0, batch, info)
    data = store.path_of(STREAM, 0).read_bytes()
    store.close()
    return data


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_capture_is_written_as_the_direct_encode_and_as_before(name: str, tmp_path: Path) -> None:
    batch = build(name)
    info = BatchInfo.of(batch)
    pool = codec.BufferPool()
    cap = codec.capture(batch, pool=pool)
    captured = saved(tmp_path / "capture", cap, info)  # what the dump-mode writer thread writes
    cap.release()
    direct = saved(tmp_path / "direct", batch, info)  # background: false
    assert captured == direct
    assert codec.encode_bytes(codec.capture(batch)) == codec.encode_bytes(batch)  # a plain sink too
    assert hashlib.sha256(direct).hexdigest() == BEFORE[name]
    store = MemoryStore()  # and through a backend without a file sink
    store.save(STREAM, 0, codec.capture(batch), info)
    assert codec.encode_bytes(store.load(STREAM, 0)) == codec.encode_bytes(batch)


@pytest.mark.parametrize("name", ["slime", "areal"])
def test_a_list_captured_item_by_item_is_the_lists_capture(name: str, tmp_path: Path) -> None:
    """A CaptureList (what the calls of a step beyond its first are captured into, one call at a
    time on the calling threads) writes the bytes of the whole list's encode, so the writer
    thread writes the calls as one list without encoding them again."""
    items = build(name)
    pool = codec.BufferPool()
    joined = codec.CaptureList(pool=pool)
    assert [joined.add(item) for item in items] == list(range(len(items))) and len(joined) == len(items)
    assert joined.nbytes > 0
    cap = joined.close()
    data = saved(tmp_path, cap, BatchInfo.of(items))
    cap.release()
    assert data == saved(tmp_path / "direct", items, BatchInfo.of(items))
    assert hashlib.sha256(data).hexdigest() == BEFORE[name]
    with pytest.raises(RuntimeError, match="after close"):
        joined.add(items[0])


def test_a_list_item_is_independent_of_its_batch_and_a_refused_one_is_left_out() -> None:
    batch = {"ids": torch.arange(6), "text": ["a", "b"], "nested": {"t": torch.ones(3)}}
    joined = codec.CaptureList()
    joined.add(batch)
    with pytest.raises(TypeError, match="cannot record"):
        joined.add({"x": torch.zeros(4), "meta": [{"lock": threading.Lock()}]})
    batch["ids"].add_(100)
    batch["text"].append("c")
    batch["nested"]["t"].zero_()
    joined.add({"second": 2.5})
    loaded = codec.decode(codec.encode_bytes(joined.close()))
    assert len(loaded) == 2 and loaded[1] == {"second": 2.5} and loaded[0]["text"] == ["a", "b"]
    assert torch.equal(loaded[0]["ids"], torch.arange(6)) and torch.equal(loaded[0]["nested"]["t"], torch.ones(3))


def test_the_capture_is_independent_of_the_batch_and_of_reused_buffers(tmp_path: Path) -> None:
    """The caller mutates its batch and the pool's buffers are reused by the next capture while an
    earlier capture waits to be written: what is written is the batch as it was captured."""
    pool = codec.BufferPool(keep=1)
    batch = areal()
    expected = codec.encode_bytes(batch)
    first = codec.capture(batch, pool=pool)
    for trajectory in batch:
        trajectory["logprobs"].add_(1)
    assert codec.encode_bytes(first) == expected
    first.release()
    second = codec.capture(areal(), pool=pool)  # reuses the first capture's buffers
    assert codec.encode_bytes(second) == expected


# --------------------------------------------------------------------------- nothing vanishes
def _nested() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.arange(6.0).reshape(2, 3), torch.ones(4, 3)])  # strided layout


NESTED = {"root": _nested, "in a dict": lambda: {"x": _nested(), "y": torch.ones(2)},
          "in a list": lambda: [_nested(), 1], "in a list of dicts": lambda: [{"x": _nested()}],
          "in a TensorDict": lambda: __import__("tensordict").TensorDict({"x": _nested()}, batch_size=[2])}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
@pytest.mark.parametrize("where", list(NESTED))
def test_strided_nested_tensors_are_recorded_on_both_write_paths(where: str, background: bool, tmp_path: Path) -> None:
    """Issue 28: a strided nested tensor (no ``shape``) with ``background: false`` must be
    recorded, or the call must fail; it is recorded, and replays equal."""
    from rollout_mock import MockScheduler

    class Rollout:
        def get_batch(self, data: object, global_step: int) -> Any:
            return NESTED[where]()

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "background": background}
    with MockScheduler(Rollout(), config) as mock:
        mock.get_batch(None, 0)
    with MockScheduler(Rollout(), {**config, "mode": "mock"}) as mock:
        replayed = mock.get_batch(None, 0)
    assert codec.encode_bytes(replayed) == codec.encode_bytes(NESTED[where]())


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_a_step_that_cannot_be_recorded_fails_the_call(background: bool, tmp_path: Path) -> None:
    """No ``except`` on the write path swallows a failure: a value that cannot be recorded at all
    (not data, and not picklable) fails the dump-mode call, on either path, and no step is written."""
    import threading

    from rollout_mock import MockScheduler, open_dump

    class Rollout:
        def get_batch(self, data: object, global_step: int) -> Any:
            return {"x": torch.ones(3), "meta": [{"lock": threading.Lock()}]}

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "background": background}
    with MockScheduler(Rollout(), config) as mock:
        with pytest.raises(TypeError, match="cannot record"):
            mock.get_batch(None, 0)
    assert open_dump(tmp_path).steps(STREAM) == []


def test_tensors_that_require_grad_are_recorded_as_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30: no PyTorch '.grad of a non-leaf tensor' warning from the codec; one warning of
    ours; replay returns leaves with requires_grad=False."""
    import warnings

    from rollout_mock import MockScheduler

    weights = torch.ones(4, requires_grad=True)
    batch = {"logprobs": weights * 2, "values": [weights * 3], "leaf": weights}  # non-leaf tensors

    class Rollout:
        def get_batch(self, data: object, global_step: int) -> Any:
            return batch

    sys.modules["rollout_mock.codec.encode"]._warned.discard("grad")  # warned once per process
    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "background": False}
    with warnings.catch_warnings(record=True) as seen, MockScheduler(Rollout(), config) as mock:
        warnings.simplefilter("always")
        mock.get_batch(None, 0)
        mock.get_batch(None, 1)
    assert not [w for w in seen if ".grad" in str(w.message)], [str(w.message) for w in seen]
    ours = [r for r in caplog.records if "requires grad" in r.getMessage()]
    assert len(ours) == 1 and "requires_grad=False" in ours[0].getMessage()
    with MockScheduler(Rollout(), {**config, "mode": "mock"}) as mock:
        replayed = mock.get_batch(None, 1)
    for tensor in (replayed["logprobs"], replayed["values"][0], replayed["leaf"]):
        assert tensor.is_leaf and not tensor.requires_grad and tensor.grad_fn is None
    assert torch.equal(replayed["logprobs"], batch["logprobs"].detach())


@pytest.mark.parametrize("errors", [None, "surrogatepass"])
def test_string_columns_pack_as_msgpack_packs_them(errors: str | None) -> None:
    """The column packers write exactly what msgpack.packb writes, for every string header size
    (fixstr, str8, str16, str32) and non-ASCII text: msgspec (what :class:`_Column` packs its
    slices with) and, with lone surrogates, the sized-once msgpack packer."""
    import msgpack

    from rollout_mock.codec.encode import _FAST, _packed_surrogates

    flat = ["", "a" * 31, "b" * 32, "é" * 200, "c" * 70_000, "日本語", "x" * 255, "y" * 65_535]
    if errors:
        flat.append("lone \ud800 surrogate")
    expected = msgpack.packb(flat, use_bin_type=True, unicode_errors=errors)
    if errors is None:
        assert _FAST.encode(flat) == expected
        return
    assert _packed_surrogates(flat, len(expected)) == expected
    assert _packed_surrogates(flat, 1) == expected  # a short size hint only costs a regrowth
