"""One structural comparison engine (rollout_mock.codec.structure) for ``diff`` and check mode,
with one tolerance rule (rollout_mock.text.within_tolerance) for them and ``verify``.

Before: ``compare_batches`` existed twice, in wrap/check.py and compare/batch_diff.py, with
different walks (check mode took a dataclass for one value, diff walked it) and different
tolerance rules (check mode counted two equal infinities as different under a tolerance; diff
never applied a tolerance to a plain float).
"""

from __future__ import annotations

import enum
import math
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import compare_batches
from rollout_mock.codec.structure import kind_of, leaves, node_fields
from rollout_mock.config import CheckServes, CheckSettings
from rollout_mock.config.model import Tolerance
from rollout_mock.text import within_tolerance, within_tolerance_array
from rollout_mock.wrap.check import score_batches
from rollout_mock.wrap.matching import digest_request


@dataclass
class Turn:
    reward: float
    text: str


class Record:
    """A record that lists its fields with ``to_dict()``."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def to_dict(self) -> dict[str, Any]:
        return dict(self.fields)


def settings(**tolerances: Tolerance) -> CheckSettings:
    return CheckSettings(CheckServes.RECORDED, None, tuple(tolerances.items()))


def batch(reward: float, text: str = "a") -> dict[str, Any]:
    return {"turns": [Turn(1.0, "x"), Turn(reward, text)], "meta": {"deep": {"er": {"k": Record(v=reward)}}}}


def test_check_mode_and_diff_name_the_same_deep_keys() -> None:
    """Check mode walks what diff walks: a dataclass's fields, a record's ``to_dict()``."""
    diffs, _ = compare_batches(batch(0.5), batch(2.0))
    assert sorted(d.key for d in diffs) == ["meta.deep.er.k.v", "turns[1].reward"]
    scored = score_batches(batch(2.0), batch(0.5), settings())
    assert sorted(k["key"] for k in scored["keys"]) == ["meta.deep.er.k.v", "turns[].reward"]
    assert scored["keys"][1]["detail"] == "0.5 recorded, 2.0 live"


def test_equal_infinities_are_within_a_tolerance_in_check_mode() -> None:
    """Log-probs of masked tokens are -inf on both sides: equal, with or without a tolerance."""
    recorded = {"logprobs": torch.tensor([[-math.inf, -0.5, -1.0]])}
    live = {"logprobs": torch.tensor([[-math.inf, -0.5 + 1e-7, -1.0]])}
    scored = score_batches(live, recorded, settings(logprobs=Tolerance(atol=1e-5)))
    assert scored["equal"] and scored["match"] == 1.0
    exact = score_batches(live, recorded, settings())
    assert not exact["equal"] and exact["keys"][0]["match"] == pytest.approx(2 / 3)


def test_a_plain_float_within_the_tolerance_is_close_in_diff() -> None:
    (key,) = compare_batches({"meta": {"lr": 1.0}}, {"meta": {"lr": 1.0 + 1e-9}}, atol=1e-6)[0]
    assert key.status == "close" and key.key == "meta.lr"
    (key,) = compare_batches({"meta": {"lr": 1.0}}, {"meta": {"lr": 1.0 + 1e-3}}, atol=1e-6)[0]
    assert key.status == "different"


def test_one_tolerance_rule_for_scalars_and_arrays() -> None:
    values = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, 1.0 + 1e-9, 2.0]
    a = np.array([x for x in values for _ in values])
    b = np.array([y for _ in values for y in values])
    for rtol, atol in ((0.0, 0.0), (0.0, 1e-6), (1e-3, 0.0)):
        scalar = [within_tolerance(float(x), float(y), rtol, atol) for x, y in zip(a, b)]
        assert within_tolerance_array(a, b, rtol, atol).tolist() == scalar


def test_the_in_run_verdict_uses_the_same_rule(tmp_path: Any) -> None:
    """An expected infinity matches only itself, whatever the tolerance (it took 1e308 for +inf
    under an rtol: ``|inf - 1e308| <= rtol * inf``)."""
    from rollout_mock.compare.expected import ExpectedMetrics
    from rollout_mock.config import RolloutMockConfig
    from rollout_mock.storage.store import expected_path

    path = expected_path(str(tmp_path), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"step": 0, "loss": "Infinity", "kl": 1.0}\n')
    config = RolloutMockConfig(enable=True, mode="mock", dump_dir=str(tmp_path),
                               verdict={"action": "warn", "rtol": 1e-3})
    verdict = ExpectedMetrics(config, writes=False)
    verdict.observe(0, {"loss": 1e308, "kl": 1.0005})
    assert (verdict.compared, verdict.diverged) == (2, 1) and verdict.first is not None
    assert verdict.first[1] == "loss"


# ----------------------------------------------------------------------------- the one dispatch
@dataclass
class Lazy:
    """A dataclass whose field ``b`` is set by nobody (``init=False``, no default)."""

    a: int
    b: int = field(init=False)


class Spy:
    """An object with ``keys()``/``[key]`` and ``to_dict()`` that counts the calls it gets."""

    calls = 0

    def keys(self) -> set[str]:
        Spy.calls += 1
        return {"k"}

    def __getitem__(self, key: str) -> int:
        Spy.calls += 1
        return 1

    def to_dict(self) -> dict[str, int]:
        Spy.calls += 1
        return {"k": 1}


class Color(enum.Enum):
    RED = 1


@pytest.mark.parametrize(("value", "kind"), [
    ([1], "list"), ((1,), "tuple"), (True, "scalar"), (None, "scalar"), (b"x", "scalar"),
    (torch.zeros(1), "tensor"), (np.zeros(1), "ndarray"), (np.array([{}], dtype=object), "object_array"),
    (np.float32(1), "numpy_scalar"), (Color.RED, "enum"), ({"a": 1}, "mapping"), ({1}, "set"),
    (Turn(1.0, "x"), "dataclass"), (types.SimpleNamespace(a=1), "namespace"), (len, "callable"), (Turn, "callable"),
    (Spy(), "object"), (Record(v=1), "object"),
])
def test_kind_of_is_the_dispatch_of_both_walks(value: Any, kind: str) -> None:
    assert kind_of(value) == kind


def test_kind_of_runs_no_user_code() -> None:
    """The dispatch the request digest runs on every value asks no object for its keys or fields;
    the engine's walk reads them (an object with keys() is walked as a mapping)."""
    Spy.calls = 0
    assert kind_of(Spy()) == "object" and Spy.calls == 0
    assert digest_request({"spy": Spy()}).nodes[0].info == {"k": "object", "t": "Spy"} and Spy.calls == 0
    assert [path for path, _ in leaves({"spy": Spy()})] == [("spy", "k")] and Spy.calls > 0


def test_a_batch_type_is_walked_through_its_parts_by_both_walks() -> None:
    """kind_of names a registered batch type (here an object carrying only ``meta_info``); the
    engine's leaves and the request's nodes are its parts, as node_fields gives them."""
    class Call:
        def __init__(self, temperature: float) -> None:
            self.meta_info = {"temperature": temperature}

    assert kind_of(Call(1.0)) == "batch:request"
    assert dict(node_fields(Call(1.0), "batch:request")) == {"meta_info": {"temperature": 1.0}}
    assert [path for path, _ in leaves(Call(1.0))] == [("meta_info", "temperature")]
    request = digest_request({"call": Call(1.0)})
    assert [n.path for n in request.nodes] == ["call", "call.meta_info", "call.meta_info.temperature"]


def test_the_engine_reads_an_unset_dataclass_field_as_none() -> None:
    """A dataclass field nobody set compares as ``None`` (the request digest read it so already);
    the engine's walk raised AttributeError on it before."""
    found, _ = compare_batches({"v": Lazy(1)}, {"v": Lazy(2)})
    assert [(d.key, d.a, d.b) for d in found] == [("v.a", "1", "2")]
    assert [path for path, _ in leaves(Lazy(1))] == [("a",), ("b",)]
