"""``wrap_trl`` replaying a malformed record (issue 37, round 4's leftover 3).

Before: a record without its ``generate`` part raised ``KeyError: 'generate'`` out of the
training call, ``rewards_per_func`` given as a string ``AttributeError: 'str' object has no
attribute 'to'``, a metrics delta of the wrong shape ``TypeError``/``AttributeError``. Each is now
one :class:`CorruptStepError` naming the split, the step and the field.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rollout_mock.adapters.trl import _METHOD, RECORD_FORMAT, _Source, trl_settings, wrap_trl
from rollout_mock.errors import CorruptStepError
from rollout_mock.wrap.scheduler import MockScheduler


class FakeTrainer:
    """The members of a TRL GRPOTrainer that wrap_trl reads."""

    def __init__(self) -> None:
        self.args = SimpleNamespace(gradient_accumulation_steps=1, steps_per_generation=1)
        self.num_iterations = 1
        self.state = SimpleNamespace(global_step=0, num_input_tokens_seen=0)
        self.model = SimpleNamespace(training=True)
        self.accelerator = SimpleNamespace(num_processes=1, device="cpu")
        self._metrics: dict[str, dict[str, list[Any]]] = {"train": {}, "eval": {}}
        self._pending_metrics: dict[str, list[Any]] = {}
        self._pending_extra_logs: dict[str, list[Any]] = {}
        self._step = 0
        self.callbacks: list[Any] = []

    def _generate(self, prompts: Any) -> Any:
        raise AssertionError("mock mode must not generate")

    def _calculate_rewards(self, *args: Any) -> Any:
        raise AssertionError("mock mode must not score")

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)


def good() -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "mode": "train", "global_step": 0, "micro_step": 0,
            "generate": {"output": [[1, 2]], "tuple": False, "metrics": {}, "num_input_tokens_before": 0,
                         "num_input_tokens_seen": 2, "rng": None},
            "rewards": {"rewards_per_func": torch.ones(1, 1), "pending_metrics": {}, "pending_extra_logs": {},
                        "rng": None}}


def without(record: dict[str, Any], part: str, name: str | None = None) -> dict[str, Any]:
    if name is None:
        del record[part]
    else:
        del record[part][name]
    return record


def with_(record: dict[str, Any], part: str, name: str, value: Any) -> dict[str, Any]:
    record[part][name] = value
    return record


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "no_generate": (without(good(), "generate"), "generate: missing"),
    "generate_a_list": ({**good(), "generate": [1, 2]}, "generate: missing or not a mapping"),
    "no_output": (without(good(), "generate", "output"), "generate.output: missing"),
    "tuple_a_string": (with_(good(), "generate", "tuple", "yes"), "generate.tuple: expected bool"),
    "tokens_a_string": (with_(good(), "generate", "num_input_tokens_seen", "2"), "generate.num_input_tokens_seen"),
    "tokens_before_a_float": (with_(good(), "generate", "num_input_tokens_before", 0.5),
                              "generate.num_input_tokens_before"),
    "metrics_a_list": (with_(good(), "generate", "metrics", [1]), "generate.metrics: expected Mapping"),
    "metrics_append_a_string": (with_(good(), "generate", "metrics", {"loss": {"append": "abc"}}),
                                "generate.metrics['loss'].append: expected a list"),
    "metrics_unknown_change": (with_(good(), "generate", "metrics", {"loss": {"frob": 1}}), "generate.metrics['loss']"),
    "rewards_a_string": (with_(good(), "rewards", "rewards_per_func", "1,2"),
                         "rewards.rewards_per_func: expected Tensor, got str"),
    "rewards_not_a_mapping": ({**good(), "rewards": 3}, "rewards: missing or not a mapping"),
    "pending_metrics_key_int": (with_(good(), "rewards", "pending_metrics", {1: {"set": []}}),
                                "rewards.pending_metrics"),
}


def record_dump(path: Path, record: dict[str, Any], trainer: FakeTrainer) -> None:
    source = _Source()
    config = {"enable": True, "mode": "dump", "dump_dir": str(path)}
    with MockScheduler(source, config, split="train", methods=(_METHOD,), spec=_Source,
                       rollout_settings=trl_settings(trainer)) as scheduler:
        source.pending = record
        scheduler.rollout(["p"], global_step=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_record_is_a_corrupt_step(tmp_path: Path, case: str) -> None:
    record, field = CASES[case]
    trainer = FakeTrainer()
    record_dump(tmp_path / "d", record, trainer)
    wrap_trl(trainer, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d"), "replay_rng": False})
    with pytest.raises(CorruptStepError) as caught:
        trainer._generate(["p"])
        trainer._calculate_rewards(None, None, None, None)
    message = str(caught.value)
    assert "train step 0" in message and field in message and "\n" not in message
    assert caught.value.step == 0 and caught.value.split == "train"


def test_a_good_record_replays(tmp_path: Path) -> None:
    trainer = FakeTrainer()
    record_dump(tmp_path / "d", good(), trainer)
    wrap_trl(trainer, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d"), "replay_rng": False})
    assert trainer._generate(["p"]) == [[1, 2]]
    assert torch.equal(trainer._calculate_rewards(None, None, None, None), torch.ones(1, 1))
    assert trainer.state.num_input_tokens_seen == 2
