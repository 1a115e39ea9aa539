"""Hypothesis: arbitrary nested batches round-trip exactly through every store and capture().

Exactly means: same types, dtypes, shapes and bit patterns (NaN payloads and -0.0 included).
"""

from __future__ import annotations

import io
import math
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rollout_mock import DirectoryStore, MemoryStore, codec
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")
PROPS = settings(max_examples=60, deadline=None)

TORCH_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.bool, torch.int8,
                torch.uint8, torch.int16, torch.int32, torch.int64, torch.complex64, torch.complex128]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))  # [] is 0-d; a 0 is empty
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytearray(draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize)))
    if dtype is torch.bool:
        raw = bytearray(b & 1 for b in raw)
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    tensor = flat.view(dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
    view = draw(st.sampled_from(["plain", "transpose", "step", "expand"]))
    if view == "transpose" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, -1)
    elif view == "step" and tensor.dim() >= 1:
        tensor = tensor[::2]
    elif view == "expand" and tensor.dim() == 0:
        tensor = tensor.expand(3).clone()  # (expanded views share memory: not writable)
    return tensor


object_items = st.recursive(
    st.none() | st.text(max_size=5) | st.integers() | st.booleans(),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=5,
)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    numel = math.prod(shape)
    kind = draw(st.sampled_from(["float32", "int64", "bool", "U", "object"]))
    if kind == "object":
        items = draw(st.lists(object_items, min_size=numel, max_size=numel))
        array = np.empty(numel, dtype=object)
        for index, item in enumerate(items):
            array[index] = item
        array = array.reshape(shape)
    elif kind == "U":
        array = np.array(draw(st.lists(st.text(max_size=4), min_size=numel, max_size=numel)), dtype="U4").reshape(shape)
    else:
        dtype = np.dtype(kind)
        raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
        array = np.frombuffer(raw, dtype=np.uint8).copy()
        if kind == "bool":
            array &= 1
        array = array.view(dtype).reshape(shape)
    if array.ndim >= 1 and draw(st.booleans()):
        array = array[::-1] if array.ndim == 1 else array.T
    return array


leaves = (
    tensors()
    | arrays()
    | st.none()
    | st.integers(min_value=-(2**130), max_value=2**130)
    | st.floats(allow_nan=True)
    | st.text()
    | st.binary(max_size=8)
    | st.booleans()
    | tensors().map(lambda t: TensorDict({"t": t}, batch_size=[]))
)

batches = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a non-empty tensor (NaN payloads and -0.0 compare exactly)."""
    return tensor.detach().clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def assert_same(expected: Any, actual: Any, where: str = "batch") -> None:
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert actual.requires_grad == expected.requires_grad, where
        if expected.numel():
            assert torch.equal(bits(actual), bits(expected)), f"{where}: values differ"
    elif isinstance(expected, TensorDict):
        assert actual.batch_size == expected.batch_size and set(actual.keys()) == set(expected.keys()), where
        for key in expected.keys():
            assert_same(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        if expected.dtype == object:
            assert actual.tolist() == expected.tolist(), where
            for a, b in zip(actual.reshape(-1), expected.reshape(-1)):
                assert type(a) is type(b), where
        else:
            assert actual.tobytes() == expected.tobytes(), where
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for index, (a, b) in enumerate(zip(expected, actual)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert struct.pack("<d", actual) == struct.pack("<d", expected), where
    else:
        assert actual == expected, where


@PROPS
@given(batch=batches)
def test_directory_store_round_trip(batch: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = DirectoryStore(Path(tmp))
        store.open_writer(STREAM)
        store.save(STREAM, 0, batch, BatchInfo.of(batch))
        store.close()
        assert_same(batch, DirectoryStore(Path(tmp)).load(STREAM, 0))


@PROPS
@given(batch=batches)
def test_memory_store_round_trip(batch: Any) -> None:
    store = MemoryStore()
    store.save(STREAM, 0, batch, BatchInfo.of(batch))
    assert_same(batch, store.load(STREAM, 0))


@PROPS
@given(batch=batches)
def test_capture_writes_the_bytes_of_a_direct_encode(batch: Any) -> None:
    """One write path: what the writer thread writes of a capture is byte for byte the direct
    encode of the batch, and loads back exactly."""
    data = codec.encode_bytes(codec.capture(batch))
    assert data == codec.encode_bytes(batch)
    assert_same(batch, codec.decode(data))
    pooled = codec.capture(batch, pool=codec.BufferPool())  # the dump-mode call's: the body in pooled buffers
    assert codec.encode_bytes(pooled) == data
    pooled.release()


@settings(max_examples=20, deadline=None)
@given(tensor=tensors())
def test_capture_is_independent_of_later_mutation(tensor: torch.Tensor) -> None:
    original = tensor.clone()
    cap = codec.capture({"t": tensor})
    for value in (0, 1):  # at least one of them changes the caller's tensor
        tensor.fill_(value)
        assert_same({"t": original}, codec.decode(codec.encode_bytes(cap)))


# --------------------------------------------------------------------------- header version 4 (msgpack body)
_hashable = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**130), max_value=2**130) | st.floats(allow_nan=False)
    | st.text(max_size=4) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
python_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**130), max_value=2**130) | st.floats(allow_nan=True)
    | st.text() | st.binary(max_size=8) | tensors(),
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.sets(_hashable, max_size=3)
    | st.frozensets(_hashable, max_size=3)
    | st.dictionaries(_hashable, inner, max_size=3)
    | st.lists(inner, min_size=1, max_size=4).map(lambda items: _object_array(items)),
    max_leaves=10,
)


def _object_array(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        array[i] = item
    return array


def _assert_exact(expected: Any, actual: Any, where: str = "value") -> None:
    """Exact types everywhere: int/bool/float, str/bytes, tuple/list, set/frozenset, dict keys and order."""
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, (set, frozenset)):
        assert actual == expected, where
    elif isinstance(expected, dict):
        assert [type(k) for k in actual] == [type(k) for k in expected] and list(actual) == list(expected), where
        for key in expected:
            _assert_exact(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, np.ndarray) and expected.dtype == object:
        assert actual.dtype == object and actual.shape == expected.shape, where
        for i, (a, b) in enumerate(zip(expected.reshape(-1), actual.reshape(-1))):
            _assert_exact(a, b, f"{where}[{i}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, b) in enumerate(zip(expected, actual)):
            _assert_exact(a, b, f"{where}[{i}]")
    else:
        assert_same(expected, actual, where)


@PROPS
@given(value=python_values)
def test_body_values_round_trip_with_exact_types(value: Any) -> None:
    """Lists of Python values live in the msgpack body (header version 4): types come back exactly,
    through a file and through the dump-mode capture."""
    batch = [value]
    _assert_exact(batch, codec.decode(codec.encode_bytes(batch)))
    for pool in (None, codec.BufferPool()):
        buffer = io.BytesIO()
        codec.encode(codec.capture(batch, pool=pool), buffer)
        _assert_exact(batch, codec.decode(buffer.getvalue()))


@PROPS
@given(strings=st.lists(st.text(), min_size=1, max_size=12), start=st.integers(0, 12), stop=st.integers(0, 12))
def test_string_columns_round_trip_whole_and_by_rows(strings: list[str], start: int, stop: int) -> None:
    array = np.array(strings + [""], dtype=object)[:-1]
    data = codec.encode_bytes({"s": array})
    assert codec.decode(data)["s"].tolist() == strings
    assert codec.decode(data, rows=slice(start, stop))["s"].tolist() == strings[start:stop]
