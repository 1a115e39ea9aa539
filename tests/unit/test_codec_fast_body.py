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
from typing import Any

import msgpack
import numpy as np
import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_mock import codec

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
