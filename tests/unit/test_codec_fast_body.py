"""Plain Python values are packed by ormsgpack (issue 36): the same msgpack bytes as msgpack's packer,
and it refuses (and msgpack's packer takes) every value it would change: tuples, sets, enums,
decimals, datetimes, numpy scalars, subclasses of int/float/str/list/dict, non-str keys."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import importlib
import io
import math
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_mock import RolloutMockError, UnsafePickleError, codec

encode_module = importlib.import_module("rollout_mock.codec.encode")


class Level(enum.IntEnum):
    LOW = 1


class Scale(float, enum.Enum):
    HALF = 0.5


class Tokens(list):  # type: ignore[type-arg]
    pass


class Count(int):
    pass


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


plain = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats()
    | st.text() | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=40)
    | st.dictionaries(st.text(max_size=4) | st.integers(-(2**63), 2**64 - 1), inner, max_size=4),
    max_leaves=200,
)


def _fast(value: Any) -> bytes | None:
    """What the body's fast packer makes of ``value`` (None: it refuses it)."""
    try:
        return ormsgpack.packb(value, option=encode_module._PLAIN)
    except TypeError:
        return None


@settings(max_examples=200, deadline=None)
@given(value=st.lists(plain, max_size=5) | st.dictionaries(st.text(max_size=4), plain, max_size=4))
def test_the_fast_packer_writes_plain_values_as_msgpack_does(value: Any) -> None:
    reference = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack(value)
    assert _fast(value) in (reference, None)  # the same bytes, or refused (non-str keys)
    assert _same(codec.decode(codec.encode_bytes([value])), [value])


class Slotted(int):
    __slots__ = ()


@pytest.mark.parametrize("odd", [
    (1, 2), (), set(), frozenset(), {1}, Level.LOW, Scale.HALF, decimal.Decimal("1.5"), fractions.Fraction(1, 3),
    datetime.timedelta(seconds=1), datetime.datetime(2024, 1, 2), Count(3), Slotted(4), np.float64(0.5), np.int64(2),
    np.str_("a"), 1j, 2**64, Tokens([1]), collections.OrderedDict(a=1), {1: 2}, "a\ud800",
], ids=repr)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_value_the_fast_packer_would_change_is_refused_in_a_long_list_of_numbers(odd: Any, where: str) -> None:
    numbers: list[Any] = [i * 0.5 if i % 3 else i for i in range(64)]
    numbers.insert({"first": 0, "middle": 32, "last": 64}[where], odd)
    assert _fast(numbers) is None and _fast({"tokens": numbers}) is None
    assert _fast([x for x in numbers if x is not odd]) is not None


@pytest.mark.parametrize("odd", [(1, 2), (), frozenset({1}), Level.LOW, Scale.HALF, datetime.timedelta(days=2),
                                 decimal.Decimal("2.5"), Tokens([3]), collections.OrderedDict(b=2), Slotted(5)],
                         ids=repr)
def test_such_values_keep_their_type_through_a_step(odd: Any) -> None:
    batch = [{"tokens": [*range(40), odd, *range(40)], "logprobs": [-0.5] * 50}]
    loaded = codec.decode(codec.encode_bytes(batch), trusted=True)
    assert _same(loaded, batch)
    assert type(loaded[0]["tokens"][40]) is type(odd)


def test_sample_dicts_are_packed_by_the_fast_packer(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {"tokens": list(range(1000)), "mask": [True, False] * 100, "logprobs": [-0.25] * 1000,
              "meta": {"source": "math", "score": None}, "text": "é" * 10, "blob": b"\x00\x01"}
    class Unused:
        def pack(self, value: Any) -> bytes:
            raise AssertionError(f"msgpack's packer was asked for {type(value).__name__}")

    monkeypatch.setattr(encode_module, "_msgpack", lambda default, surrogates: Unused())
    data = codec.encode_bytes([sample, sample])
    assert _same(codec.decode(data), [sample, sample])


def test_lone_surrogates_and_huge_ints_fall_back_to_msgpack() -> None:
    batch = [{"text": "a\ud800b", "big": 2**70, "tokens": list(range(100))}]
    assert _same(codec.decode(codec.encode_bytes(batch)), batch)


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Label(str):
    pass


def _slime_like() -> list[dict[str, Any]]:
    return [{"index": i, "prompt": "solve x", "tokens": list(range(i, i + 300)), "loss_mask": [1] * 200,
             "rollout_log_probs": [-0.5 - i / 64] * 200, "reward": 0.5, "status": "completed", "aborted": False,
             "metadata": {"source": "math", "extra": {"turns": 1, "score": None}}} for i in range(16)]


@pytest.mark.parametrize("odd", [(1, 2), {3}, Level.LOW, np.float64(0.25), Label("x"), True,
                                 collections.OrderedDict(a=1), Point(1, 2.0), Count(7)], ids=repr)
@pytest.mark.parametrize("where", ["sample", "metadata", "tokens", "loss_mask", "logprobs"])
def test_an_odd_value_in_a_slime_batch_keeps_its_type_through_the_dump_mode_capture(odd: Any, where: str) -> None:
    """What the dump-mode call captures of sample dicts is exact: a packer that writes tuples,
    sets, enums, numpy scalars, subclasses and dataclasses as plain msgpack (msgspec does) must
    not take them, wherever they sit (a sample's value, its nested metadata, inside a long list of
    token ids, of mask ones or of log-probs); the capture writes the bytes a direct encode does."""
    samples = _slime_like()
    target = samples[7]
    if where == "sample":
        target["odd"] = odd
    elif where == "metadata":
        target["metadata"]["extra"]["odd"] = odd
    else:
        target[{"tokens": "tokens", "loss_mask": "loss_mask", "logprobs": "rollout_log_probs"}[where]][150] = odd
    for pool in (None, codec.BufferPool()):  # the pooled body (the dump-mode call's) and the plain one
        buffer = io.BytesIO()
        captured = codec.capture(samples, pool=pool)
        codec.encode(captured, buffer)
        captured.release()
        assert buffer.getvalue() == codec.encode_bytes(samples)
        loaded = codec.decode(buffer.getvalue(), trusted=True)
        assert _same(loaded, samples)


def _body_addresses(captured: codec.Capture) -> list[int]:
    assert captured.body is not None
    first, count = captured.body
    return [np.frombuffer(view, np.uint8).ctypes.data for view, _ in captured.chunks[first: first + count]]


@pytest.mark.parametrize("batch", [
    pytest.param([{"tokens": list(range(i, i + 3000)), "logprobs": [-0.5] * 3000, "text": "x" * 500}
                  for i in range(400)], id="samples over several 4 MiB chunks"),
    pytest.param({"ids": list(range(300_000)), "rows": [[1, 2], [3]] * 5000, "text": "a"}, id="lists in a dict"),
    pytest.param([{"t": "a\ud800"}, {"t": "b"}] * 50, id="lone surrogates"),
    pytest.param([[{"x": 1}]] * 20 + [{"odd": (1, 2)}] + [[{"x": 2}]] * 20, id="a tuple after packed slices"),
])
def test_the_pooled_capture_packs_the_body_into_reused_buffers_with_the_same_bytes(batch: Any) -> None:
    """With a pool (the dump-mode call), the body is packed a slice at a time into the pool's
    4 MiB buffers: ormsgpack's own output for a whole batch was fresh memory at every call (a
    page fault per 4 KiB). The next capture packs into the same buffers, and the file's bytes are
    a direct encode's, also when a slice is refused after others were copied."""
    pool = codec.BufferPool()
    addresses = []
    for _ in range(2):
        captured = codec.capture(batch, pool=pool)
        buffer = io.BytesIO()
        codec.encode(captured, buffer)
        assert buffer.getvalue() == codec.encode_bytes(batch)
        addresses.append(_body_addresses(captured))
        captured.release()
    assert addresses[0] == addresses[1]


# --------------------------------------------------------------------------- decoding many small maps
decode_module = importlib.import_module("rollout_mock.codec.decode")


def _records(n: int = 300) -> list[dict[str, Any]]:
    """verl's ``extra_info`` column: one small map of scalars per row."""
    return [{"index": i, "split": "train", "answer": str(i % 97), "score": i / 7, "ok": i % 2 == 0, "none": None}
            for i in range(n)]


def _equal(a: Any, b: Any) -> bool:
    """Same value, same types all the way down (an object array item by item)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and (
            all(_equal(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1), strict=True)) if a.dtype == object
            else bool(np.array_equal(a, b)))
    if isinstance(a, (set, frozenset)):
        return a == b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return _same(a, b)


class _Paths:
    """Counts the body values the cached-keys path decoded, and the ones it sent to msgpack's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fast = self.slow = 0
        real = decode_module.BodyReader._cached_keys

        def spy(reader: Any, data: memoryview) -> Any:
            value = real(reader, data)
            if value is decode_module._SLOW_PATH:
                self.slow += 1
            else:
                self.fast += 1
            return value

        monkeypatch.setattr(decode_module.BodyReader, "_cached_keys", spy)


@pytest.mark.parametrize("column", [
    pytest.param(lambda rows: np.array(rows + [None], dtype=object)[:-1], id="object array (verl)"),
    pytest.param(lambda rows: rows, id="list"),
])
def test_many_small_maps_are_decoded_by_ormsgpack(column: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long column of small maps of scalars decodes through ormsgpack (one str per distinct key,
    where msgpack-python makes and interns one per key), to the same value."""
    paths = _Paths(monkeypatch)
    value = column(_records())
    loaded = codec.decode(codec.encode_bytes({"extra_info": value}))["extra_info"]
    assert _equal(loaded, value)
    assert (paths.fast, paths.slow) == (1, 0)


@pytest.mark.parametrize("value", [
    pytest.param([{"tokens": list(range(64)), "logprobs": [-0.5] * 64}] * 300, id="maps of lists (slime)"),
    pytest.param(list(range(20_000)), id="numbers"),
    pytest.param(_records(100), id="too few maps"),
    pytest.param(_records(300)[:40], id="too small"),
])
def test_other_values_keep_msgpacks_path(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _Paths(monkeypatch)
    assert _equal(codec.decode(codec.encode_bytes({"v": value}))["v"], value)
    assert (paths.fast, paths.slow) == (0, 0)


@pytest.mark.parametrize("odd", [
    pytest.param((1, "a"), id="tuple"), pytest.param({1, 2}, id="set"), pytest.param(frozenset({"a"}), id="frozenset"),
    pytest.param(np.array([{"x": 1}, (2,)], dtype=object), id="object array"), pytest.param({1: "a"}, id="int key"),
    pytest.param({b"k": 1}, id="bytes key"), pytest.param(2**70, id="huge int"), pytest.param(b"\x00raw", id="bytes"),
    pytest.param(np.arange(6, dtype=np.int16).reshape(2, 3), id="ndarray"), pytest.param(2.5, id="float"),
])
@pytest.mark.parametrize("where", [0, 150, 299])
@pytest.mark.parametrize("array", [True, False], ids=["object array", "list"])
def test_a_value_only_msgpacks_path_decodes_keeps_its_type(odd: Any, where: int, array: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers (tuples, sets, object arrays) below the head of the value, non-string keys,
    extensions with work behind them (arrays): the cached-keys path hands the value to
    msgpack's; huge ints and bytes stay on it. Either way the value comes back with its types. (A first map holding more than
    scalars sends the value to msgpack's path at once.)"""
    paths = _Paths(monkeypatch)
    rows: list[Any] = _records()
    rows[where] = {**rows[where], "odd": odd}
    value: Any = rows
    if array:
        value = np.empty(len(rows), dtype=object)
        value[:] = rows
    loaded = codec.decode(codec.encode_bytes({"extra_info": value}))["extra_info"]
    assert _equal(loaded, value)
    if where == 0 and type(odd) is not float:  # the first map holds more than scalars: msgpack's path
        assert (paths.fast, paths.slow) == (0, 0)
        return
    assert paths.fast + paths.slow == 1
    assert paths.slow == (isinstance(odd, (tuple, set, frozenset, np.ndarray))
                          or type(odd) is dict and not all(type(k) is str for k in odd))


def _body_file(body: bytes) -> bytes:
    """A version-4 step whose root is one body value: ``body``."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "adversarial"))
    import adversarial_corpus

    return adversarial_corpus.v4(adversarial_corpus.mp(body), body)


def _outcome(blob: bytes) -> tuple[str, Any]:
    try:
        return "value", codec.decode(codec.BytesSource(blob, "<test>"))
    except RolloutMockError as exc:
        return "refused", type(exc)


_ITEMS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.binary(max_size=4) | st.builds(msgpack.ExtType, st.integers(0, 12), st.binary(max_size=12)),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=3) | st.integers(-(2**63), 2**64 - 1) | st.none(), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(item=_ITEMS, where=st.integers(0, 299), cut=st.integers(0, 6), junk=st.binary(max_size=6),
       marker=st.booleans())
def test_both_paths_decode_any_body_alike(item: Any, where: int, cut: int, junk: bytes, marker: bool) -> None:
    """Differential: a column of small maps with any msgpack item in it (any extension code and
    payload, any key type), cut short or with bytes after it, decodes to the same value, or is
    refused with the same error, whichever path takes it."""
    head = [msgpack.ExtType(6, b""), [300]] if marker else []  # an object array's marker and shape
    rows: list[Any] = _records()
    rows[where] = item
    body = msgpack.packb([*head, *rows], use_bin_type=True)
    body = (body[: len(body) - cut] + junk) if cut or junk else body
    blob = _body_file(body)
    fast = _outcome(blob)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode_module, "_many_small_maps", lambda data: False)
        slow = _outcome(blob)
    assert fast[0] == slow[0] and (_equal(fast[1], slow[1]) if fast[0] == "value" else fast[1] is slow[1])


def test_a_pickle_blob_in_a_column_of_maps_is_refused_as_such() -> None:
    """A node extension (here a pickle blob in the 200th map) sends the value to msgpack's
    path, which runs its hook once: the safe loader's refusal is an UnsafePickleError."""
    blob_node = msgpack.ExtType(8, msgpack.packb({"$": "pickle", "what": "os.system", "c": [0, 0]}))
    rows: list[Any] = _records()
    rows[200] = {"payload": blob_node}
    with pytest.raises(UnsafePickleError):
        codec.decode(codec.BytesSource(_body_file(msgpack.packb(rows)), "<test>"))


def test_an_interrupt_in_an_extension_is_raised_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt inside the extension hook (a big int's) ends the load at once:
    ormsgpack turns it into a ValueError, which is not taken for bytes it refuses (the value
    decoded again by msgpack, the hook run twice)."""
    calls = []

    def interrupted(reader: Any, code: int, payload: bytes) -> Any:
        calls.append(code)
        raise KeyboardInterrupt

    monkeypatch.setattr(decode_module.BodyReader, "ext", interrupted)
    rows: list[Any] = _records()
    rows[200] = {"big": 2**70}
    with pytest.raises(KeyboardInterrupt):
        codec.decode(codec.encode_bytes({"v": rows}))
    assert len(calls) == 1


def test_a_trusted_pickle_in_a_column_of_maps_is_unpickled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trusted load unpickles each blob once, also when the value it sits in then goes to
    msgpack's path (a tuple after it): the cached-keys path never runs a hook with effects."""
    import pickle

    unpickled = []
    real = pickle.loads

    def counting(data: bytes, *args: Any, **kwargs: Any) -> Any:
        unpickled.append(len(data))
        return real(data, *args, **kwargs)

    rows: list[Any] = _records()
    rows[100] = {**rows[100], "when": fractions.Fraction(1, 3)}  # an opaque pickle blob
    rows[200] = {**rows[200], "pair": (1, 2)}
    blob = codec.encode_bytes({"v": rows})
    monkeypatch.setattr(pickle, "loads", counting)
    loaded = codec.decode(blob, trusted=True)["v"]
    assert _equal(loaded, rows)
    assert len(unpickled) == 1
