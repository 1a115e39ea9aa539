"""Format 2: round trips, partial loads, format-1 compatibility, batch classes by structure."""

from __future__ import annotations

import importlib.util
import io
import math
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cpu_seconds, requires
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rollout_mock import CorruptStepError, UnsafePickleError, codec
from rollout_mock.codec import Batch, BytesSource, FileSource
from rollout_mock.codec.format import MAX_DEPTH

ZSTD = requires("zstandard")
VERL = requires("verl")

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.requires_grad == b.requires_grad
                and torch.equal(a.detach().reshape(-1).view(torch.uint8) if a.numel() else a.detach(),
                                b.detach().reshape(-1).view(torch.uint8) if b.numel() else b.detach()))
    if isinstance(a, np.ndarray):
        if a.dtype.kind == "O":
            return b.dtype.kind == "O" and a.shape == b.shape and all(same(x, y) for x, y in zip(a.flat, b.flat))
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a).__name__ == "TensorDict":
        return list(a.keys()) == list(b.keys()) and a.batch_size == b.batch_size and all(same(a[k], b[k]) for k in a.keys())
    return type(a) is type(b) and a == b


def roundtrip(obj: Any, compression: str = "none") -> Any:
    return codec.decode(codec.encode_bytes(obj, compression=compression))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "compression", ["none", pytest.param("zstd", marks=ZSTD), pytest.param("lz4", marks=requires("lz4"))]
)
def test_every_dtype_bit_exact(dtype: torch.dtype, compression: str) -> None:
    raw = torch.randint(0, 256, (3000 * 16,), dtype=torch.uint8)
    full = raw[: (raw.numel() // dtype.itemsize) * dtype.itemsize].view(dtype) if dtype is not torch.bool else raw % 2 == 0
    batch = {"t": full.reshape(-1, 2)[:, :1], "e": torch.empty(0, 3, dtype=dtype), "s": full[0].clone()}
    out = roundtrip(batch, compression)
    assert same(out["t"], batch["t"].contiguous()) and same(out["e"], batch["e"]) and same(out["s"], batch["s"])
    assert out["s"].dim() == 0


def test_tensor_details() -> None:
    t = torch.randn(4, 4, requires_grad=True)
    t.grad = torch.ones(4, 4)
    p = torch.nn.Parameter(torch.randn(2))
    c = torch.randn(3, dtype=torch.complex64).conj()
    ro = np.arange(5)
    ro.flags.writeable = False
    out = roundtrip({"t": t, "p": p, "c": c, "ro": ro, "nc": np.arange(12).reshape(3, 4).T,
                     "be": np.arange(3, dtype=">i4")})
    # data, not autograd state: leaves that do not require grad; a Parameter keeps its class
    assert not out["t"].requires_grad and out["t"].is_leaf and out["t"].grad is None
    assert torch.equal(out["t"], t.detach())
    assert type(out["p"]) is torch.nn.Parameter and not out["p"].requires_grad and torch.equal(out["p"], p.detach())
    assert torch.equal(out["c"], c.resolve_conj()) and not out["c"].is_conj()
    assert not out["ro"].flags.writeable and out["be"].dtype == np.dtype(">i4")
    assert np.array_equal(out["nc"], np.arange(12).reshape(3, 4).T)


def test_nested_tensor_components() -> None:
    nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.jagged)
    out = roundtrip({"n": nt})["n"]
    assert out.is_nested and [x.tolist() for x in out.unbind()] == [[0, 1, 2], [0, 1, 2, 3, 4]]


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 200), 1 << 200), st.floats(allow_nan=True),
                     st.text(max_size=5), st.binary(max_size=5000), st.complex_numbers(allow_nan=False))
_values = st.recursive(_scalars, lambda c: st.one_of(
    st.lists(c, max_size=4), st.tuples(c, c), st.dictionaries(st.text(max_size=3), c, max_size=4),
    st.dictionaries(st.integers(), c, max_size=3),
    st.lists(c, max_size=3).map(lambda v: np.array(v + [None], dtype=object)[:-1] if v else np.empty(0, object))),
    max_leaves=20)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=_values)
def test_nested_containers_roundtrip(value: Any) -> None:
    assert same(roundtrip({"v": value}), {"v": value})


def make_td(n: int = 10) -> TensorDict:
    return TensorDict({"ids": torch.arange(n * 3).reshape(n, 3), "lp": torch.randn(n, 3).bfloat16()}, batch_size=[n])


def make_dp(n: int = 10) -> Any:
    from verl.protocol import DataProto

    nt = {"uid": np.array([f"u{i}" for i in range(n)], dtype=object)}
    return DataProto(batch=make_td(n), non_tensor_batch=nt, meta_info={"step": 3})


@VERL
@ZSTD
def test_real_verl_dataproto_safe_no_registration(tmp_path: Path) -> None:
    from verl.protocol import DataProto

    dp = make_dp()
    path = tmp_path / "s.pkl"
    with open(path, "wb") as f:
        codec.encode(dp, f, compression="zstd")
    out = codec.decode(FileSource(path))
    assert type(out) is DataProto and out.meta_info == {"step": 3}
    assert same(out.batch, dp.batch) and same(out.non_tensor_batch["uid"], dp.non_tensor_batch["uid"])
    assert type(pickle.loads(path.read_bytes())) is DataProto  # also a valid pickle


@VERL
@pytest.mark.parametrize("rows", [slice(2, 7), slice(None, None, 3), range(1, 9, 2), slice(-5, None), slice(5, 5)])
def test_partial_loads_equal_slicing(tmp_path: Path, rows: Any) -> None:
    dp = make_dp(40)
    path = tmp_path / "s.pkl"
    path.write_bytes(codec.encode_bytes(dp))
    view = codec.open_step(path)
    assert view.format_version == 2 and view.keys() == ["ids", "lp", "uid"]
    part = view.load(keys=["lp", "uid"], rows=rows)
    sl = slice(rows.start, rows.stop, rows.step) if isinstance(rows, range) else rows
    assert list(part.batch.keys()) == ["lp"] and same(part.batch["lp"], dp.batch["lp"][sl])
    assert same(part.non_tensor_batch["uid"], dp.non_tensor_batch["uid"][sl])


def test_partial_load_reads_only_covering_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    big = {"x": torch.arange(4 << 20, dtype=torch.int32).reshape(-1, 1024)}  # 16 MiB: 4 chunks
    data = bytearray(codec.encode_bytes(big))
    view = codec.open_step(BytesSource(data))
    # corrupt the last chunk: reading the first rows must still work (it is not read)
    data[-100] ^= 0xFF
    assert torch.equal(view.load(rows=slice(0, 10))["x"], big["x"][:10])
    with pytest.raises(CorruptStepError, match="CRC-32"):
        view.load(rows=slice(-10, None))


@VERL
def test_format1_files_load_bit_identically() -> None:
    dp = make_dp()
    batch = {"dp": dp, "np": np.float32(2.5), "m": {1: (b"x", 2**70, float("nan"))}, "p": torch.nn.Parameter(torch.ones(2))}
    old = codec.dumps_v1(batch)
    assert codec.sniff_version(old[:32]) == 1
    out = codec.decode(old)
    assert type(out["dp"]) is type(dp) and same(out["dp"].batch, dp.batch) and type(out["p"]) is torch.nn.Parameter
    assert same(out["m"], batch["m"]) and out["np"] == np.float32(2.5)
    trusted = codec.decode(old, trusted=True)
    assert same(trusted["dp"].batch, dp.batch)


def test_format1_tensordicts_build_through_the_registered_class() -> None:
    """Format 1's ``_rebuild_tensordict`` calls (nested, named) are built by the class the adapter
    registers (safe and trusted); items other than tensors or such instances are refused."""
    inner = TensorDict({"b": torch.arange(6).view(3, 2)}, batch_size=[3])
    td = TensorDict({"a": torch.ones(3, 1), "inner": inner}, batch_size=[3], names=["rows"])
    old = codec.dumps_v1({"td": td})
    for out in (codec.decode(old)["td"], codec.decode(old, trusted=True)["td"]):
        assert type(out) is TensorDict and out.names == ["rows"] and out.batch_size == torch.Size([3])
        assert torch.equal(out["inner", "b"], inner["b"]) and type(out["inner"]) is TensorDict
    from rollout_mock.codec.legacy import _Machine

    machine = _Machine.__new__(_Machine)
    with pytest.raises(ValueError, match="must be tensors or tensordict instances"):
        machine._rebuild_tensordict({"a": "text"}, [1], None, None)
    with pytest.raises(ValueError, match="device"):
        machine._rebuild_tensordict({"a": torch.ones(1)}, [1], "cuda", None)


def test_opaque_blob_needs_trust() -> None:
    data = codec.encode_bytes({"meta": {"f": len}, "o": io.StringIO("x")})
    with pytest.raises(UnsafePickleError, match="trusted=True"):
        codec.decode(data)
    assert codec.decode(data, trusted=True)["meta"]["f"] is len


@VERL
def test_capture_is_independent_of_later_mutation() -> None:
    dp = make_dp()
    cap = codec.capture(dp)
    dp.batch["ids"] += 100
    buf = io.BytesIO()
    codec.encode(cap, buf)
    assert torch.equal(codec.decode(buf.getvalue()).batch["ids"], torch.arange(30).reshape(10, 3))


def test_unknown_class_falls_back_to_batch_and_batch_class() -> None:
    class Mine:
        pass

    import dataclasses
    import types

    @dataclasses.dataclass
    class Proto:
        batch: Any = None
        non_tensor_batch: Any = None
        meta_info: Any = None

    module = types.ModuleType("rm_gone_module")
    Proto.__module__, Proto.__qualname__ = module.__name__, "Proto"
    module.Proto = Proto
    sys.modules[module.__name__] = module
    try:
        data = codec.encode_bytes(Proto(make_td(), {}, {"k": 1}))
        assert type(codec.decode(data)) is Proto  # structural: no registration needed
    finally:
        del sys.modules[module.__name__]
    gone = codec.decode(data)  # the module is gone (and a load never imports one)
    assert type(gone) is Batch and gone.source_class == "rm_gone_module:Proto" and "rm_gone_module" not in sys.modules
    assert same(gone.batch["ids"], make_td()["ids"]) and gone.meta_info == {"k": 1}
    out = codec.decode(codec.encode_bytes(Batch({"a": torch.ones(2)}, {}, {"k": 1}, source_class="x:Y")))
    assert type(out) is Batch and out.source_class == "x:Y" and len(out) == 2 and torch.equal(out["a"], torch.ones(2))
    own = codec.decode(codec.encode_bytes(Batch(make_td(), {}, {"step": 3}, source_class="x:Y")), batch_class=Mine)
    assert type(own) is Mine and own.meta_info == {"step": 3}


@pytest.fixture
def roll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    double = Path(__file__).resolve().parents[1] / "doubles" / "roll_protocol.py"
    spec = importlib.util.spec_from_file_location("_roll_double", double)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_as_roll(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from roll.distributed.scheduler.protocol import DataProto

    yield DataProto
    for name in [m for m in sys.modules if m == "roll" or m.startswith("roll.")]:
        del sys.modules[name]


def test_roll_dataproto_with_proxy_fields(roll: Any) -> None:
    DataProto = roll
    dp = DataProto.from_dict({"ids": torch.arange(6).reshape(3, 2)}, {"uid": ["a", "b", "c"]}, {"s": 1})
    data = codec.encode_bytes(dp)  # its __getstate__ (torch.save) is never called
    out = codec.decode(data)
    assert type(out) is DataProto and torch.equal(out.batch["ids"], dp.batch["ids"])
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"] and out.meta_info == {"s": 1}
    assert out._remote_batch is None
    del sys.modules["roll.distributed.scheduler.protocol"]
    fallback = codec.decode(data)
    assert type(fallback) is Batch and fallback.source_class == "roll.distributed.scheduler.protocol:DataProto"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 5_000, 1_000_000])
def test_deep_header_nesting_is_refused_quickly(depth: int) -> None:
    from rollout_mock.codec.format import _parse_header, check_tree

    text = b"[" * depth + b"]" * depth
    flat = b"[" + b"0," * (depth - 1) + b"0]"  # the same size without nesting: this machine's baseline
    baseline = cpu_seconds(lambda: check_tree(_parse_header(flat), []))

    def refuse() -> None:
        with pytest.raises(ValueError, match="nest"):
            check_tree(_parse_header(text), [])

    assert cpu_seconds(refuse) < max(1.0, 10 * baseline)  # CPU time: a busy machine does not inflate it


def test_header_nesting_at_the_limit_is_accepted() -> None:
    from rollout_mock.codec.format import _parse_header, check_tree

    text = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert check_tree(_parse_header(text), []) == 0


def _header_of(data: bytes) -> dict[str, Any]:
    import json

    from rollout_mock.codec.format import CONTAINER_HEAD, PREFIX_LEN

    _, header_len, *_ = CONTAINER_HEAD.unpack_from(data, PREFIX_LEN)
    start = PREFIX_LEN + CONTAINER_HEAD.size
    return json.loads(data[start: start + header_len])


def _encode_v3(obj: Any) -> bytes:
    """A step as rollout_mock wrote it before header version 4 (version-2 nodes, JSON items)."""
    from codec_v2_writer import encode_v2

    return encode_v2(obj)


def test_large_object_arrays_keep_their_items_in_a_data_chunk() -> None:
    """Version-3 files (JSON item chunks) keep loading, partially too."""
    texts = [f"prompt {i} – 数学 \U0001f600" for i in range(100)] + ["lone \udc80 surrogate", None, 7, 2.5, True, ""]
    strings = np.array(texts, dtype=object)
    small = np.array(["a", "b"], dtype=object)  # under JSON_ITEMS_MIN: inline
    mixed = np.array([{"k": 1}] * 40, dtype=object)  # not plain scalars: inline
    data = _encode_v3({"s": strings, "small": small, "mixed": mixed})
    header = _header_of(data)
    assert header["version"] == 3
    assert "c" in header["root"]["s"] and "items" not in header["root"]["s"]
    assert "items" in header["root"]["small"] and "items" in header["root"]["mixed"]
    out = codec.decode(data)
    assert out["s"].dtype == object and list(out["s"]) == texts
    assert list(out["small"]) == ["a", "b"] and list(out["mixed"]) == [{"k": 1}] * 40
    assert list(codec.decode(data, rows=slice(95, 102))["s"]) == texts[95:102]
    assert _header_of(_encode_v3({"s": small, "t": torch.ones(3)}))["version"] == 2


def test_string_columns_and_body_values() -> None:
    """Header version 4: object arrays of str are one UTF-8 buffer + offsets; others a body value."""
    texts = [f"prompt {i} – 数学 \U0001f600" for i in range(100)] + ["lone \udc80 surrogate", ""]
    ascii_texts = np.array([f"uid-{i}" for i in range(50)], dtype=object).reshape(25, 2)
    mixed = np.array([{"k": 1}, None, 7, 2.5, True, "x"] * 7, dtype=object)
    data = codec.encode_bytes({"s": np.array(texts, dtype=object), "u": ascii_texts, "mixed": mixed})
    header = _header_of(data)
    assert header["version"] == 4
    assert header["root"]["s"]["$"] == "strs" and header["root"]["s"].get("sp")
    assert header["root"]["u"]["$"] == "strs" and "sp" not in header["root"]["u"]
    assert header["root"]["mixed"]["$"] == "mp" and "body" in header
    out = codec.decode(data)
    assert out["s"].dtype == object and out["s"].tolist() == texts
    assert out["u"].shape == (25, 2) and out["u"].tolist() == ascii_texts.tolist()
    assert [type(x) for x in out["mixed"]] == [type(x) for x in mixed] and out["mixed"].tolist() == mixed.tolist()
    assert codec.decode(data, rows=slice(95, 102))["s"].tolist() == texts[95:102]
    assert codec.decode(data, rows=range(3, 20, 4))["u"].tolist() == ascii_texts[3:20:4].tolist()
    assert codec.decode(data, rows=slice(5, 5))["u"].shape == (0, 2)


def test_partial_rows_of_a_string_column_read_only_those_rows() -> None:
    texts = np.array([f"{i:06d}" * 1000 for i in range(4096)], dtype=object)  # 24 MB
    data = codec.encode_bytes({"p": texts})
    reads: list[int] = []

    class Counting(codec.BytesSource):
        def read_range(self, offset: int, length: int) -> Any:
            reads.append(length)
            return super().read_range(offset, length)

    out = codec.decode(Counting(data), rows=slice(100, 104))
    assert out["p"].tolist() == texts[100:104].tolist()
    assert sum(reads) < 5 << 20  # the header and the chunks of those rows (4 MiB each), not 24 MB


def test_object_array_items_in_a_chunk_are_checked_by_crc() -> None:
    strings = np.array([f"text {i}" for i in range(64)], dtype=object)
    data = bytearray(codec.encode_bytes({"s": strings}))
    at = bytes(data).rindex(b"text 63")
    data[at] = ord("T")
    with pytest.raises(CorruptStepError, match="CRC"):
        codec.decode(bytes(data))


def test_string_columns_are_split_into_chunks() -> None:
    texts = np.array([("x" * 250_000) + str(i) for i in range(40)], dtype=object)  # 10 MB of text
    cap = codec.capture({"t": texts})
    from rollout_mock.codec.format import DeferredChunk

    # the strings are packed by the writer, a chunk at a time, not by the dump-mode call
    assert [type(view) for view, _ in cap.chunks[:3]] == [DeferredChunk] * 3
    buffer = io.BytesIO()
    codec.encode(cap, buffer)
    data = buffer.getvalue()
    header = _header_of(data)
    first, count = header["root"]["t"]["c"]
    assert count >= 3 and all(row[2] <= 4 << 20 for row in header["chunks"])  # 4 MiB chunks
    assert list(codec.decode(data)["t"]) == list(texts)
    assert data == codec.encode_bytes({"t": texts})


def test_small_tensors_share_chunks_and_load_as_views() -> None:
    """6,000 small tensors in a list: a few shared chunks (one CRC and one read each), exact values."""
    trajectories = [{"ids": torch.arange(i % 50 + 1), "lp": torch.randn(3, dtype=torch.bfloat16),
                     "m": torch.tensor([True, False])} for i in range(2000)]
    data = codec.encode_bytes(trajectories)
    header = _header_of(data)
    assert header["version"] == 4 and len(header["chunks"]) <= 4
    out = codec.decode(data)
    assert len(out) == 2000
    for got, want in zip(out, trajectories):
        assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    # views of one chunk read (no copy per tensor), each with a storage of its own size
    first, second = out[0]["ids"], out[1]["ids"]
    assert first.untyped_storage().nbytes() == first.nbytes and second.untyped_storage().nbytes() == second.nbytes
    assert 0 < abs(second.data_ptr() - first.data_ptr()) < 4 << 20
    rows = codec.decode(data, rows=slice(10, 12), keys=["m"])
    assert [list(r) for r in rows] == [["m"], ["m"]] and torch.equal(rows[1]["m"], trajectories[11]["m"])
    assert codec.open_step(data).keys() == ["ids", "lp", "m"]


def test_body_with_non_string_keys_and_large_tensors() -> None:
    """A non-str key sends the body value through the checked slow path: tensors decoded in the
    first pass are not counted twice (a legitimate file is never taken for a reference bomb)."""
    batch = [torch.arange(3_000_000), {1: "x", (2, 3): [4.5]}, {frozenset({1}): None}]
    out = codec.decode(codec.encode_bytes(batch))
    assert torch.equal(out[0], batch[0]) and out[1] == batch[1] and out[2] == batch[2]
    assert [type(k) for k in out[1]] == [int, tuple]
