"""Hugging Face TRL: ``wrap_trl(trainer, config)`` records or replays a trainer's rollouts.

::

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    rollout_mock.wrap_trl(trainer, {"enable": True, "mode": "dump", "dump_dir": "./dumps/run1"})
    trainer.train()

The rollout of TRL's online trainers (``GRPOTrainer``, ``RLOOTrainer``: both generate in
``_generate_and_score_completions``) is two methods, wrapped on the instance:

* ``_generate(prompts)``: tokenisation, ``model.generate`` (or vLLM, or ``rollout_func``),
  decoding, tool calls. Its side effects are part of the rollout too: the completion metrics it
  logs (``num_tokens``, ``completions/*``...), ``state.num_input_tokens_seen`` and the random
  number generators that sampling advanced;
* ``_calculate_rewards(...)``: every reward function and reward model, with what they log through
  ``log_metric`` / ``log_extra``.

Dump mode runs both and records, per generation call, one plain-data record: the return values,
the metric and counter changes, and the generator states each call left behind. Mock mode
serves the record: neither ``model.generate`` nor any reward function runs; the side effects
are re-applied and the generators restored (``replay_rng``), so the training side — old and
reference log-probs, advantages, loss, optimizer — is recomputed on the same numbers and the
same random stream, and ``trainer.state.log_history`` matches the dump run's bit for bit.

The step of a training generation is its index, ``trainer._step // (steps_per_generation *
num_iterations)``, so gradient accumulation, ``steps_per_generation > 1`` and resuming from a
checkpoint all find the right record; evaluation generations go to the ``val`` split, numbered
in call order. A generation call that was not recorded raises
:class:`~rollout_mock.errors.StepNotFoundError` (``on_missing_step`` policies apply).

Covered: TRL 1.x ``GRPOTrainer`` and ``RLOOTrainer`` (the method names above); text prompts
(conversational or not), tool calls and ``rollout_func`` outputs made of plain data. Images in
the generation output (vision-language models) are not plain data and are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout_mock.config import RolloutMockConfig, load_config
from rollout_mock.errors import ConfigError
from rollout_mock.wrap.rng import capture_rng, restore_rng
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["RECORD_FORMAT", "TrlRollout", "wrap_trl"]

#: ``format`` of one recorded generation call.
RECORD_FORMAT = "rollout_mock.trl/1"
_METHOD = "rollout"


def _snapshot(lists: Mapping[str, Any]) -> dict[str, list[Any]]:
    return {key: list(values) for key, values in lists.items()}


def _delta(before: Mapping[str, list[Any]], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What a call did to a ``{name: list}`` metrics dict: items appended, or lists replaced."""
    changes: dict[str, dict[str, Any]] = {}
    for key, values in after.items():
        new = list(values)
        old = before.get(key, [])
        if len(new) >= len(old) and new[: len(old)] == old:
            if len(new) > len(old):
                changes[str(key)] = {"append": new[len(old):]}
        else:
            changes[str(key)] = {"set": new}
    for key in before:
        if key not in after:
            changes[str(key)] = {"delete": True}
    return changes


def _apply(target: Any, changes: Mapping[str, Mapping[str, Any]]) -> None:
    for key, change in changes.items():
        if "append" in change:
            target[key].extend(change["append"])
        elif "set" in change:
            target[key] = list(change["set"])
        else:
            target.pop(key, None)


class _Source:
    """What the :class:`MockScheduler` wraps: in dump mode ``rollout`` returns the record the
    wrapped trainer methods just built; mock mode never calls it."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None

    def rollout(self, global_step: int | None = None) -> dict[str, Any]:
        record, self.pending = self.pending, None
        if record is None:  # pragma: no cover - the wrappers always set it first
            raise RuntimeError("[RolloutMock] TRL: no generation to record")
        return record


class TrlRollout:
    """The state behind :func:`wrap_trl` (``trainer.rollout_mock``): one :class:`MockScheduler`
    per split, the record of the current generation call, :meth:`close`."""

    def __init__(self, trainer: Any, config: RolloutMockConfig) -> None:
        self.trainer = trainer
        self.config = config
        self.rng = config.replay_rng is not False  # auto (null) means on: generation runs in-process
        self._source = _Source()
        self._schedulers: dict[str, MockScheduler] = {}
        self._current: dict[str, Any] | None = None
        self._generate = trainer._generate
        self._calculate_rewards = trainer._calculate_rewards
        trainer._generate = self.generate
        trainer._calculate_rewards = self.calculate_rewards
        self._scheduler("train")  # mock mode: fail now if the dump cannot be opened

    # ------------------------------------------------------------------ helpers
    def _mode(self) -> str:
        return "train" if self.trainer.model.training else "eval"

    def _scheduler(self, split: str) -> MockScheduler:
        scheduler = self._schedulers.get(split)
        if scheduler is None:
            real = self._source if self.config.mode.records else None
            scheduler = MockScheduler(real, self.config, split=split, methods=(_METHOD,), spec=_Source)
            self._schedulers[split] = scheduler
        return scheduler

    def _call(self, mode: str) -> dict[str, Any]:
        """Dump: record ``self._source.pending``; mock: the recorded record of this call."""
        if mode == "train":
            trainer = self.trainer
            every = trainer.args.steps_per_generation * trainer.num_iterations
            result = self._scheduler("train").rollout(global_step=trainer._step // every)
        else:
            result = self._scheduler("val").rollout()
        if not isinstance(result, dict) or result.get("format") != RECORD_FORMAT:
            raise ConfigError(
                f"[RolloutMock] TRL ({self.config.mode.value}): {self.config.dump_dir} holds no TRL "
                f"generation record for this call (got {type(result).__name__}); was it recorded by wrap_trl?",
                mode=self.config.mode.value, path=self.config.dump_dir,
            )
        return result

    # ------------------------------------------------------------------ wrapped methods
    def generate(self, prompts: list[Any]) -> Any:
        trainer = self.trainer
        mode = self._mode()
        if self.config.mode.replays:
            record = self._call(mode)
            _apply(trainer._metrics[mode], record["generate"]["metrics"])
            trainer.state.num_input_tokens_seen = record["generate"]["num_input_tokens_seen"]
            if self.rng and record["generate"]["rng"] is not None:
                restore_rng(record["generate"]["rng"])
            self._current = record
            output = record["generate"]["output"]
            return tuple(output) if record["generate"]["tuple"] else output
        before = _snapshot(trainer._metrics[mode])
        output = self._generate(prompts)
        self._current = {
            "format": RECORD_FORMAT,
            "mode": mode,
            "global_step": int(trainer.state.global_step),
            "micro_step": int(trainer._step),
            "generate": {
                "output": list(output) if isinstance(output, tuple) else output,
                "tuple": isinstance(output, tuple),
                "metrics": _delta(before, trainer._metrics[mode]),
                "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
                "rng": capture_rng() if self.rng else None,
            },
        }
        return output

    def calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        trainer = self.trainer
        record, self._current = self._current, None
        if record is None:
            raise ConfigError(
                "[RolloutMock] TRL: _calculate_rewards was called without a generation before it; "
                "wrap_trl supports trainers that score right after _generate (GRPO, RLOO)",
                mode=self.config.mode.value,
            )
        if self.config.mode.replays:
            rewards = record["rewards"]
            _apply(trainer._pending_metrics, rewards["pending_metrics"])
            _apply(trainer._pending_extra_logs, rewards["pending_extra_logs"])
            if self.rng and rewards["rng"] is not None:
                restore_rng(rewards["rng"])
            return rewards["rewards_per_func"].to(trainer.accelerator.device)
        metrics = _snapshot(trainer._pending_metrics)
        extra = _snapshot(trainer._pending_extra_logs)
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        record["rewards"] = {
            "rewards_per_func": rewards_per_func.detach().cpu().clone(),
            "pending_metrics": _delta(metrics, trainer._pending_metrics),
            "pending_extra_logs": _delta(extra, trainer._pending_extra_logs),
            "rng": capture_rng() if self.rng else None,
        }
        self._source.pending = record
        self._call(record["mode"])
        return rewards_per_func

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        for scheduler in self._schedulers.values():
            if scheduler.interceptor is not None:
                scheduler.interceptor.flush()

    def close(self) -> None:
        """Write everything pending and release the dump (idempotent); called at train end."""
        for scheduler in self._schedulers.values():
            scheduler.close()


def _callback(rollout: TrlRollout) -> Any:
    from transformers import TrainerCallback

    class RolloutMockCallback(TrainerCallback):
        """Flushes the dump at each save and closes it when training ends."""

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rollout.flush()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rollout.close()

    return RolloutMockCallback()


def wrap_trl(trainer: Any, config: Any = None) -> Any:
    """Record (dump) or replay (mock) the rollouts of a TRL ``GRPOTrainer`` / ``RLOOTrainer``.

    Args:
        trainer: the trainer, built and not yet trained.
        config: the ``rollout_mock:`` block: a mapping, a :class:`RolloutMockConfig` or a YAML
            path (see :func:`~rollout_mock.load_config`). ``enable: false`` leaves the trainer alone.

    Returns the same trainer; its ``rollout_mock`` attribute is the :class:`TrlRollout` (its
    ``close()`` runs at the end of ``train()``; call it yourself after an interrupted run).
    See the module docstring for what is recorded and what is recomputed.
    """
    cfg = load_config(config if config is not None else {})
    if not cfg.enable:
        return trainer
    for name in ("_generate", "_calculate_rewards", "_metrics", "_step"):
        if not hasattr(trainer, name):
            raise ConfigError(
                f"[RolloutMock] wrap_trl: {type(trainer).__qualname__} has no {name!r}; wrap_trl supports "
                f"TRL 1.x GRPOTrainer and RLOOTrainer",
                mode=cfg.mode.value,
            )
    if isinstance(getattr(trainer, "rollout_mock", None), TrlRollout):
        raise ConfigError("[RolloutMock] wrap_trl: this trainer is already wrapped", mode=cfg.mode.value)
    rollout = TrlRollout(trainer, cfg)
    trainer.rollout_mock = rollout
    trainer.add_callback(_callback(rollout))
    return trainer

