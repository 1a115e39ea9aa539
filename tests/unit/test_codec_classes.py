"""The structural-class tags of the codec (rollout_mock.codec.classes): partial loads, hostile
headers, and older readers refusing version-4 files cleanly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

tensordict = pytest.importorskip("tensordict")
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict

from rollout_mock.codec import BytesSource, decode, encode_bytes
from rollout_mock.codec import format as codec_format
from rollout_mock.codec.format import check_tree
from rollout_mock.errors import CorruptStepError


def load(data: bytes, **kwargs: Any) -> Any:
    return decode(BytesSource(data, "t"), trusted=False, **kwargs)


def batch() -> TensorDict:
    ids = torch.nested.nested_tensor([torch.arange(n) for n in (2, 4, 1, 3)], layout=torch.jagged)
    td = TensorDict({"ids": ids, "x": torch.arange(8).reshape(4, 2)}, [4])
    td["uid"] = NonTensorStack.from_list(["a", "b", "c", "d"])
    td["meta"] = NonTensorData(np.str_("m"))
    return td


def test_rows_of_jagged_tensors_stacks_and_nontensor_data() -> None:
    td = batch()
    part = load(encode_bytes(td), rows=slice(1, 4, 2))
    assert part.batch_size == torch.Size([2])
    assert [t.tolist() for t in part["ids"].unbind()] == [[0, 1, 2, 3], [0, 1, 2]]
    assert part["uid"] == ["b", "d"] and type(part.get("uid")) is NonTensorStack
    assert part.get("meta").batch_size == torch.Size([2]) and type(part.get("meta").data) is np.str_
    assert torch.equal(part["x"], td["x"][1:4:2])


def test_ragged_dimension_two_rows() -> None:
    nt = torch.nested.nested_tensor_from_jagged(torch.arange(21.).reshape(3, 7), torch.tensor([0, 2, 3, 7]), jagged_dim=2)
    part = load(encode_bytes({"p": nt}), rows=slice(1, 3))["p"]
    assert part._ragged_idx == 2
    assert [t.tolist() for t in part.unbind()] == [t.tolist() for t in nt.unbind()[1:3]]


def test_locked_and_consolidated_state() -> None:
    locked = load(encode_bytes(TensorDict({"a": torch.ones(2)}, [2]).lock_()))
    assert locked.is_locked and not locked.is_consolidated()
    with pytest.raises(RuntimeError):
        locked["b"] = torch.zeros(2)
    cons = load(encode_bytes(TensorDict({"a": torch.ones(2), "b": torch.arange(2)}, [2]).consolidate()))
    assert cons.is_consolidated() and cons.is_locked and cons["b"].tolist() == [0, 1]
    plain = load(encode_bytes(TensorDict({"a": torch.ones(2)}, [2])))
    assert not plain.is_locked and not plain.is_consolidated()


def _header(data: bytes) -> tuple[dict[str, Any], int, int]:
    start = data.index(b'{"format"')
    depth, end = 0, start
    for end in range(start, len(data)):
        depth += {ord("{"): 1, ord("}"): -1}.get(data[end], 0)
        if depth == 0:
            break
    return json.loads(data[start: end + 1]), start, end + 1


def test_version_four_only_when_a_class_tag_is_used() -> None:
    assert _header(encode_bytes({"x": torch.ones(2), "s": "plain"}))[0]["version"] <= 4
    for obj in ({"s": np.str_("x")}, NonTensorData(1), TensorDict({}, []).lock_(),
                torch.nested.nested_tensor([torch.ones(2)], layout=torch.jagged)):
        assert _header(encode_bytes(obj))[0]["version"] == 4, obj


def test_older_reader_refuses_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec_format, "HEADER_VERSIONS", (2, 3))
    with pytest.raises(CorruptStepError, match="newer rollout_mock"):
        load(encode_bytes({"uid": NonTensorStack.from_list(["a"])}))


@pytest.mark.parametrize("node, message", [
    ({"$": "npstr", "v": 3}, "npstr"),
    ({"$": "npbytes", "hex": "abc"}, "npbytes"),
    ({"$": "nontensor", "data": 1, "batch_size": [-1], "device": None}, "integer"),
    ({"$": "nontensor", "data": 1, "batch_size": [], "device": "cuda:0"}, "device"),
    ({"$": "nontensor", "data": 1, "batch_size": [], "locked": "yes"}, "locked"),
    ({"$": "tdstack", "cls": "os.system", "stack_dim": 0, "items": []}, "class"),
    ({"$": "tdstack", "cls": "lazy", "stack_dim": 99, "items": []}, "stack_dim"),
    ({"$": "njt", "values": 1, "offsets": 2, "lengths": None, "ragged": 1, "sym": 1}, "tensor node"),
    ({"$": "njt", "values": None, "offsets": None, "ragged": 0, "sym": 1}, "ragged"),
    ({"$": "njt", "values": None, "offsets": None, "ragged": 1, "sym": 1, "order": [0, 0]}, "order"),
    ({"$": "tensordict", "batch_size": [], "items": [], "locked": 1}, "state"),
])
def test_hostile_class_nodes_are_refused(node: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_tree(node, [])


def test_stack_items_must_be_tensordicts() -> None:
    """A tdstack whose items are plain values is refused, not handed to tensordict."""
    good = encode_bytes(NonTensorStack.from_list(["a", "b"]))
    doc, start, end = _header(good)
    doc["root"]["items"] = [1, 2]
    text = json.dumps(doc, separators=(",", ":")).encode()
    assert len(text) <= end - start
    with pytest.raises(CorruptStepError):
        load(_rewrite_header(good, start, end, text))


def _rewrite_header(data: bytes, start: int, end: int, text: bytes) -> bytes:
    """``data`` with its JSON header replaced (padded with spaces) and the header CRC updated."""
    from rollout_mock.codec.format import CONTAINER_HEAD, PREFIX_LEN, crc32

    text = text + b" " * (end - start - len(text))
    out = bytearray(data)
    out[start:end] = text
    magic, header_len, offset, length, _, reserved = CONTAINER_HEAD.unpack_from(out, PREFIX_LEN)
    header = bytes(out[PREFIX_LEN + CONTAINER_HEAD.size: PREFIX_LEN + CONTAINER_HEAD.size + header_len])
    CONTAINER_HEAD.pack_into(out, PREFIX_LEN, magic, header_len, offset, length, crc32(header), reserved)
    return bytes(out)


def test_njt_offsets_outside_values_are_refused() -> None:
    good = encode_bytes(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged))
    doc, start, end = _header(good)
    text = json.dumps(doc, separators=(",", ":")).encode()
    assert load(_rewrite_header(good, start, end, text)).size(0) == 2  # the rewrite itself is sound
    offsets = doc["root"]["offsets"]
    assert offsets["$"] == "tensor"
    values = doc["root"]["values"]
    doc["root"]["values"], doc["root"]["offsets"] = offsets, values  # int64 offsets as values
    text = json.dumps(doc, separators=(",", ":")).encode()
    with pytest.raises(CorruptStepError, match="inconsistent values/offsets|do not fit"):
        load(_rewrite_header(good, start, end, text))


# --------------------------------------------------------------------------- tensordict's classes, as before
def _nontensordata() -> dict[str, Any]:
    td = TensorDict({"x": torch.arange(8).reshape(4, 2)}, [4])
    td["meta"] = NonTensorData({"temperature": 0.7, "tags": ["a", "b"]}, batch_size=[4])
    td["name"] = NonTensorData(np.str_("m"))
    return {"td": td, "bare": NonTensorData("alone", batch_size=[2]).lock_(), "scalar": NonTensorData(3)}


def _nontensorstack() -> dict[str, Any]:
    return {"uid": NonTensorStack.from_list(["a", "b", "c", "d"]),
            "turns": NonTensorStack.from_list([["x", "y"], ["z", "w"]]),
            "locked": NonTensorStack.from_list([1, 2, 3]).lock_(), "empty": NonTensorStack.from_list([])}


def _lazystack() -> dict[str, Any]:
    parts = [TensorDict({"a": torch.full((3,), float(i)), "b": torch.arange(3) + i}, [3]) for i in range(4)]
    return {"dim0": LazyStackedTensorDict(*parts, stack_dim=0), "dim1": LazyStackedTensorDict(*parts, stack_dim=1),
            "locked": LazyStackedTensorDict(*parts[:2], stack_dim=0).lock_()}


CLASS_CASES = {"nontensordata": _nontensordata, "nontensorstack": _nontensorstack, "lazystack": _lazystack}
#: SHA-256 of each case's step file as ``DirectoryStore.save`` wrote it while codec/classes.py still
#: named these classes (commit fa49395): described by adapters/frameworks.py, they write the same bytes.
CLASS_FILES = {
    "nontensordata": "9cb767767a1d5f40aeb33dda24b144370732648aab5bf08609247e6d39b68eb5",
    "nontensorstack": "d8f9d4c76d4b1c965c3b7493fd64dc870c90f1372b5dc86082de5b3c90abe487",
    "lazystack": "73f8038f5eaac2611150b1ae3de1f9e5d63e7277ee0a441bfccf29eb0a8d1fa2",
}


@pytest.mark.parametrize("name", list(CLASS_CASES))
def test_tensordicts_classes_write_the_bytes_they_always_wrote(name: str, tmp_path: Path) -> None:
    from rollout_mock import DirectoryStore
    from rollout_mock.storage import BatchInfo
    from rollout_mock.storage.manifest import StreamId

    batch, stream = CLASS_CASES[name](), StreamId("train")
    store = DirectoryStore(tmp_path)
    store.save(stream, 0, batch, BatchInfo.of(batch))
    data = store.path_of(stream, 0).read_bytes()
    store.close()
    assert hashlib.sha256(data).hexdigest() == CLASS_FILES[name]
    back = load(data)  # a file of either version loads as the same classes, and writes the same bytes again
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in batch.items()}
    assert encode_bytes(back) == encode_bytes(batch)


def test_rows_of_stacks_along_either_dimension_and_of_nontensor_data() -> None:
    """Rows of a stack along dimension 0 are its items; along another, each item's rows; rows
    of non-tensor data cut its batch size, never its value."""
    part = load(encode_bytes({**_lazystack(), **_nontensordata()}), rows=slice(1, 3))
    assert [t["a"][0].item() for t in part["dim0"].tensordicts] == [1.0, 2.0] and part["dim0"].batch_size == (2, 3)
    assert part["dim1"].batch_size == (2, 4) and part["dim1"]["b"].tolist() == [[1, 2, 3, 4], [2, 3, 4, 5]]
    assert part["bare"].batch_size == (1,) and part["bare"].data == "alone" and part["bare"].is_locked
    assert part["td"].get("meta").data == {"temperature": 0.7, "tags": ["a", "b"]}
    assert part["td"].get("meta").batch_size == (2,) and part["scalar"].data == 3
