"""Plain Python values are packed by ormsgpack (issue 36): the same msgpack bytes as msgpack's packer,
and it refuses (and msgpack's packer takes) every value it would change: tuples, sets, enums,
decimals, datetimes, numpy scalars, subclasses of int/float/str/list/dict, non-str keys."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import fractions
import importlib
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
