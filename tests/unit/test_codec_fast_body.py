"""Plain Python values are packed by msgspec (issue 36): the same msgpack bytes as msgpack's packer,
and only values msgspec cannot change go to it (it writes tuples, sets, enums, decimals, datetimes
and subclasses of list/dict as plain arrays, maps and values)."""

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


@settings(max_examples=200, deadline=None)
@given(value=st.lists(plain, max_size=5) | st.dictionaries(st.text(max_size=4), plain, max_size=4))
def test_msgspec_packs_plain_values_as_msgpack_does(value: Any) -> None:
    assert encode_module._plain_value(value)
    reference = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack(value)
    assert encode_module._FAST.encode(value) == reference


@pytest.mark.parametrize("odd", [
    (1, 2), (), set(), frozenset(), {1}, Level.LOW, Scale.HALF, decimal.Decimal("1.5"), fractions.Fraction(1, 3),
    datetime.timedelta(seconds=1), datetime.datetime(2024, 1, 2), Count(3), np.float64(0.5), np.int64(2), 1j,
    Tokens([1]), collections.OrderedDict(a=1), bytearray(b"x"),
], ids=repr)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_value_msgspec_would_change_is_found_in_a_long_list_of_numbers(odd: Any, where: str) -> None:
    numbers: list[Any] = [i * 0.5 if i % 3 else i for i in range(64)]
    numbers.insert({"first": 0, "middle": 32, "last": 64}[where], odd)
    assert not encode_module._plain_value(numbers)
    assert not encode_module._plain_value({"tokens": numbers})


@pytest.mark.parametrize("odd", [(1, 2), (), frozenset({1}), Level.LOW, Scale.HALF, datetime.timedelta(days=2),
                                 decimal.Decimal("2.5"), Tokens([3]), collections.OrderedDict(b=2)], ids=repr)
def test_such_values_keep_their_type_through_a_step(odd: Any) -> None:
    batch = [{"tokens": [*range(40), odd, *range(40)], "logprobs": [-0.5] * 50}]
    loaded = codec.decode(codec.encode_bytes(batch), trusted=True)
    assert _same(loaded, batch)
    assert type(loaded[0]["tokens"][40]) is type(odd)


def test_long_lists_of_numbers_are_packed_by_msgspec() -> None:
    sample = {"tokens": list(range(1000)), "mask": [True, False] * 100, "logprobs": [-0.25] * 1000,
              "meta": {"source": "math", "score": None}, "text": "é" * 10}
    assert encode_module._plain_value([sample, sample])
    data = codec.encode_bytes([sample])
    assert _same(codec.decode(data), [sample])


def test_lone_surrogates_and_huge_ints_fall_back_to_msgpack() -> None:
    batch = [{"text": "a\ud800b", "big": 2**70, "tokens": list(range(100))}]
    assert _same(codec.decode(codec.encode_bytes(batch)), batch)
