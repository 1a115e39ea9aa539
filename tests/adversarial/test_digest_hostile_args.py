"""The request digest and arguments it cannot read (issue 37, round 5 items 9 and 12).

Before: the digest walked into user objects and failed with their errors, out of the training
call: ``TypeError`` for a namespace with ``__slots__`` or a ``Mock(spec=dict)``, the user's own
exception from a mapping key's or an enum's ``__str__``, ``KeyError`` from a mapping whose
``__getitem__`` lies, ``ValueError`` for a 5,000-digit int (at the index write). Now such a value
is digested by its type name, with one log line naming it, and the call proceeds (in dump and in
mock mode, which then match). Item 9: a dict of 300,000 str -> int items cost 16-18x
``copy.deepcopy``; the test counts the Python-level work (no clock).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import rollout_mock.codec.request as request_record
import rollout_mock.wrap.matching as matching
from rollout_mock import MockScheduler
from rollout_mock.wrap.matching import digest_request


class Boom(Exception):
    pass


class Namespace:  # the name the digest reads with vars(): __slots__ has no __dict__
    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a = 1


class BadKey:
    def __lt__(self, other: Any) -> bool:
        raise Boom("no order")

    def __str__(self) -> str:
        raise Boom("no text")

    def __hash__(self) -> int:
        return 1


class BadEnum(enum.Enum):
    A = 1

    def __str__(self) -> str:
        raise Boom("enum text")


class Liar(Mapping[str, int]):
    def __getitem__(self, key: str) -> int:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(["a", "b"])

    def __len__(self) -> int:
        return 2


class Exploding:
    def __getattr__(self, name: str) -> Any:
        raise Boom(f"no {name}")


HUGE = 10**5000


def hostile() -> dict[str, Any]:
    return {
        "slots": Namespace(),
        "spec_dict": mock.Mock(spec=dict),
        "bad_keys": {BadKey(): 1, "x": 2},
        "bad_enum": BadEnum.A,
        "liar": Liar(),
        "exploding": Exploding(),
        "huge_int": HUGE,
        "huge_in_list": [HUGE, 1, 2],
        "huge_in_dict": {"a": HUGE},
        "huge_key": {HUGE: 1},
    }


@pytest.mark.parametrize("name", sorted(hostile()))
def test_each_hostile_argument_is_digested(name: str, caplog: pytest.LogCaptureFixture) -> None:
    request_record._WARNED_UNREADABLE.clear()
    args = {"data": hostile()[name], "n": 3}
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        first = digest_request(args)
        second = digest_request({"data": hostile()[name], "n": 3})
    assert first.digest == second.digest  # the same in a dump run and a mock run
    import json

    json.dumps(first.to_json(), allow_nan=False)  # the index can hold it
    warned = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warned) <= 1  # once per path


class Source:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": [global_step]}


def test_dump_and_mock_proceed_with_hostile_arguments(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    request_record._WARNED_UNREADABLE.clear()
    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    with MockScheduler(Source(), config) as dump:
        for step in range(2):
            dump.get_batch(hostile(), global_step=step)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d"), "on_mismatch": "error"}
    with caplog.at_level(logging.WARNING, logger="rollout_mock"), MockScheduler(None, config, spec=Source) as replay:
        for step in range(2):
            assert replay.get_batch(hostile(), global_step=step) == {"x": [step]}


def test_a_big_plain_dict_is_not_walked_key_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """300,000 str -> int items: a few C calls, and only the first MAX_NODES fields walked
    (before: one Python call per key, plus one fnmatch per key and volatile pattern)."""
    calls: list[int] = []
    real_value = request_record._RequestFold.value

    def counted(self: Any, *args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return real_value(self, *args, **kwargs)

    monkeypatch.setattr(request_record._RequestFold, "value", counted)
    fnmatches: list[int] = []
    real_fnmatch = request_record.fnmatch.fnmatchcase
    monkeypatch.setattr(request_record.fnmatch, "fnmatchcase", lambda *a: fnmatches.append(1) or real_fnmatch(*a))
    big = {f"key_{i:07d}": i for i in range(300_000)}
    request = digest_request({"data": big})
    assert len(calls) <= matching.MAX_NODES + 2 and len(fnmatches) < 100
    assert [n.path for n in request.nodes][:2] == ["data", "data.key_0000000"]
    assert request.digest == digest_request({"data": dict(big)}).digest
    changed = dict(big)
    changed["key_0150000"] = -1
    assert digest_request({"data": changed}).digest != request.digest


def test_a_volatile_key_in_a_big_dict_is_still_left_out() -> None:
    big = {f"key_{i:07d}": i for i in range(1000)}
    volatile = ["*uuid*"]  # a framework's declared pattern (volatile fields are per framework)
    a = digest_request({"data": {**big, "trace_uuid": 1}}, volatile=volatile)
    b = digest_request({"data": {**big, "trace_uuid": 2}}, volatile=volatile)
    c = digest_request({"data": {**big, "trace_uid": 2}}, volatile=volatile)
    assert a.digest == b.digest != c.digest
