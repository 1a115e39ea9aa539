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

The record of a training generation is found by its index: the micro-step it runs at divided by
``steps_per_generation * num_iterations``. TRL counts micro-steps in ``trainer._step`` from the
start of ``train()``, also when it resumes from a checkpoint; the micro-step a resumed run starts
at is ``state.global_step * gradient_accumulation_steps``, with ``global_step`` restored from the
checkpoint (read when training begins). So gradient accumulation, ``steps_per_generation > 1``
and a run resumed from a checkpoint (``trainer.train(resume_from_checkpoint=...)``) all find the
record the dump run made at that point (a resume off a generation boundary, where TRL generates
anew, cannot be replayed: :class:`~rollout_mock.errors.ReplayMismatchError`). Evaluation
generations go to the ``val`` split; each records the optimizer step it ran at, and mock mode
serves the ``i``-th generation of an evaluation at step ``g`` the dump run's ``i``-th one at
``g`` (resumed runs included). A generation call that was not recorded raises
:class:`~rollout_mock.errors.StepNotFoundError` (``on_missing_step`` policies apply).

Before anything is generated or trained on, mock mode checks (see docs/faithful-replay.md): the
rollout settings (:data:`SETTINGS`, reward functions..., when ``wrap_trl`` is called:
:class:`~rollout_mock.errors.RolloutSettingsMismatchError` lists every difference); each
generation's prompts against the recorded ones (:class:`~rollout_mock.errors.ReplayMismatchError`);
the live ``state.num_input_tokens_seen`` against the dump run's at that generation (it is then
advanced by the recorded tokens, never overwritten). Check mode (``mode: check``) generates live,
compares the generation with the record and serves the record (or, ``check_serves: live``, the
live generation).

Covered: TRL 1.x ``GRPOTrainer`` and ``RLOOTrainer`` (the method names above); text prompts
(conversational or not), tool calls and ``rollout_func`` outputs made of plain data. Images in
the generation output (vision-language models) are not plain data and are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout_mock.adapters.frameworks import TRL_OUTPUT_NAMES, TRL_RECORD_FORMAT, is_tokenizer, tokenizer_fingerprint
from rollout_mock.config import CheckServes, RolloutMockConfig, load_config
from rollout_mock.errors import ConfigError, CorruptStepError, ReplayMismatchError, StepNotFoundError
from rollout_mock.wrap.rng import capture_rng, restore_rng
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["RECORD_FORMAT", "SETTINGS", "TrlRollout", "trl_settings", "wrap_trl"]

#: ``format`` of one recorded generation call.
RECORD_FORMAT = TRL_RECORD_FORMAT
_METHOD = "rollout"
#: The ``GRPOConfig``/``RLOOConfig`` fields that decide what a generation call produces (those a
#: TRL version lacks are left out): the pre-flight check compares them.
SETTINGS = (
    "num_generations", "num_generations_eval", "per_device_train_batch_size", "per_device_eval_batch_size",
    "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_iterations",
    "max_prompt_length", "max_completion_length", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "generation_kwargs", "chat_template_kwargs", "use_vllm", "vllm_mode",
    "use_transformers_paged", "cache_implementation", "mask_truncated_completions", "reward_weights",
    # what decides the data and the random stream: RNG replay restores the dump run's generator
    # states after each generation, which would hide another seed, so the seeds are compared
    "seed", "data_seed", "shuffle_dataset", "full_determinism",
)
#: The names of the generation's outputs (``_generate``'s tuple), for check mode's comparison.
_OUTPUT_NAMES = TRL_OUTPUT_NAMES


def _name(function: Any) -> str:
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
    return str(name or type(function).__name__)


def trl_settings(trainer: Any) -> dict[str, Any]:
    """The rollout-side settings of a TRL trainer (:data:`SETTINGS`, the reward functions, the
    rollout function, the tools, the number of processes and the fingerprint of its tokenizer
    and chat template, :func:`~rollout_mock.adapters.tokenizer_fingerprint`)."""
    args = trainer.args
    out: dict[str, Any] = {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}
    out["trainer"] = type(trainer).__name__
    out["reward_funcs"] = list(getattr(trainer, "reward_func_names", None) or
                               [_name(f) for f in getattr(trainer, "reward_funcs", None) or []])
    rollout_func = getattr(trainer, "rollout_func", None)
    out["rollout_func"] = None if rollout_func is None else _name(rollout_func)
    out["tools"] = [_name(t) for t in getattr(trainer, "tools", None) or []]
    accelerator = getattr(trainer, "accelerator", None)
    out["num_processes"] = int(getattr(accelerator, "num_processes", 1) or 1)
    tokenizer = getattr(trainer, "processing_class", None)
    if tokenizer is not None and is_tokenizer(tokenizer):
        out["tokenizer"] = tokenizer_fingerprint(tokenizer)
    return out


def _named_output(record: Any) -> Any:
    """What check mode compares of a record: the generation's outputs by name."""
    output = record["generate"]["output"] if isinstance(record, Mapping) and "generate" in record else record
    if isinstance(output, list | tuple):
        return dict(zip(_OUTPUT_NAMES, output))
    return output


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


def _record_problem(record: Mapping[str, Any], part: str) -> str | None:
    """What is wrong with the ``part`` (``"generate"`` or ``"rewards"``) of a record read from a
    dump, as ``"field: why"``; ``None`` when it has the layout :class:`TrlRollout` writes."""
    body = record.get(part)
    if not isinstance(body, Mapping):
        return f"{part}: missing or not a mapping (got {type(body).__name__})"
    if part == "generate":
        required: dict[str, tuple[type, ...]] = {"output": (object,), "tuple": (bool,), "metrics": (Mapping,),
                                                 "num_input_tokens_seen": (int,)}
        optional: dict[str, tuple[type, ...]] = {"num_input_tokens_before": (int,), "rng": (object,)}
    else:
        import torch

        required = {"rewards_per_func": (torch.Tensor,), "pending_metrics": (Mapping,),
                    "pending_extra_logs": (Mapping,)}
        optional = {"rng": (object,)}
    for name, kinds in (*required.items(), *optional.items()):
        if name not in body:
            if name in required:
                return f"{part}.{name}: missing"
            continue
        value = body[name]
        if value is None and name in optional:
            continue
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            return f"{part}.{name}: expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}"
    for name in ("metrics", "pending_metrics", "pending_extra_logs"):
        if name in body and (why := _changes_problem(body[name])):
            return f"{part}.{name}{why}"
    return None


def _changes_problem(changes: Mapping[Any, Any]) -> str | None:
    """A recorded metrics delta (see :func:`_delta`) that :func:`_apply` cannot apply."""
    for key, change in changes.items():
        if not isinstance(key, str):
            return f": a key of type {type(key).__name__}"
        if not isinstance(change, Mapping) or len(change) != 1 or next(iter(change)) not in ("append", "set", "delete"):
            return f"[{key[:80]!r}]: expected {{'append'|'set': [...]}} or {{'delete': True}}"
        kind, values = next(iter(change.items()))
        if kind != "delete" and not isinstance(values, list):
            return f"[{key[:80]!r}].{kind}: expected a list, got {type(values).__name__}"
    return None


class _Source:
    """What the :class:`MockScheduler` wraps (its ``factory`` hands it over when the scheduler
    runs: dump and check mode): ``rollout`` returns the record the wrapped trainer methods just
    built. Mock mode never builds a record: the trainer's ``_generate`` does not run."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None

    def rollout(self, prompts: Any = None, global_step: int | None = None,
                trainer_step: int | None = None) -> dict[str, Any]:
        # ``trainer_step`` (an evaluation's optimizer step) is read from the recorded call's
        # arguments, not here: mock mode finds the i-th evaluation at a step by it (_val_step)
        record, self.pending = self.pending, None
        if record is None:  # mock mode, on_missing_step: record: nothing was generated to record
            raise ConfigError(
                f"[RolloutMock] TRL (mode=mock): generation step {global_step} is not recorded, and wrap_trl does "
                f"not generate in mock mode, so on_missing_step: record has nothing to record; record it in dump "
                f"mode, or set on_missing_step: error or repeat_nearest", mode="mock", step=global_step)
        return record


class TrlRollout:
    """The state behind :func:`wrap_trl` (``trainer.rollout_mock``): one :class:`MockScheduler`
    per split, the record of the current generation call, :meth:`close`."""

    def __init__(self, trainer: Any, config: RolloutMockConfig) -> None:
        self.trainer = trainer
        #: handed on, whole, to the scheduler of each split (each resolves its own parts); this
        #: object reads only the keys below
        self._config = config
        self.mode = config.mode
        #: the dump's location (named in messages)
        self.dump_dir = config.dump_dir
        self.check_serves = config.check_serves
        self.rng = config.replay_rng is not False  # auto (null) means on: generation runs in-process
        self.settings = trl_settings(trainer)
        self._source = _Source()
        self._schedulers: dict[str, MockScheduler] = {}
        self._current: dict[str, Any] | None = None
        #: (split, step) of the record served last (named when it is malformed)
        self._served: tuple[str, int | None] = ("train", None)
        #: eval generations of this run at each optimizer step (the i-th one at step g)
        self._evals: dict[int, int] = {}
        #: (state.global_step, trainer._step) when training began (a resumed run: its checkpoint's step)
        self.start: tuple[int, int] | None = None
        self._val_steps: dict[tuple[int, int], int] | None = None
        self._generate = trainer._generate
        self._calculate_rewards = trainer._calculate_rewards
        self._scheduler("train")  # mock mode: fail now if the dump cannot be opened or the settings differ
        trainer._generate = self.generate
        trainer._calculate_rewards = self.calculate_rewards

    # ------------------------------------------------------------------ helpers
    def _mode(self) -> str:
        return "train" if self.trainer.model.training else "eval"

    def _scheduler(self, split: str) -> MockScheduler:
        scheduler = self._schedulers.get(split)
        if scheduler is None:  # the scheduler decides whether the source is needed (never in mock mode)
            scheduler = MockScheduler(None, self._config, split=split, methods=(_METHOD,), factory=lambda: self._source,
                                      spec=_Source, rollout_settings=self.settings,
                                      check_views={_METHOD: _named_output}, framework="trl")
            self._schedulers[split] = scheduler
        return scheduler

    def generation_index(self) -> int:
        """The index of the current training generation (see the module docstring)."""
        trainer = self.trainer
        accumulation = int(trainer.args.gradient_accumulation_steps)
        if self.start is None:  # train() did not announce itself: infer the start from the step
            micro = int(trainer.state.global_step) * accumulation + int(trainer._step) % accumulation
        else:
            micro = self.start[0] * accumulation + int(trainer._step) - self.start[1]
        every = int(trainer.args.steps_per_generation) * int(trainer.num_iterations)
        if micro % every and self.mode.replays:
            raise ReplayMismatchError(
                f"[RolloutMock] TRL (mode={self.mode.value}): this run generates at micro-step {micro} "
                f"(optimizer step {trainer.state.global_step}), inside the dump run's generation {micro // every} "
                f"(one every {every} micro-steps): it resumed from a checkpoint that is not at a generation "
                f"boundary, where TRL generates anew while the dump run trained on its buffered generation, so "
                f"no record reproduces it. Resume from a checkpoint whose step is a multiple of "
                f"steps_per_generation * num_iterations / gradient_accumulation_steps.",
                method="_generate", argument="resume step", mode=self.mode.value,
                step=int(trainer.state.global_step), path=self.dump_dir)
        return micro // every

    def _val_step(self, optimizer_step: int) -> tuple[int, int]:
        """``(val step, i)``: the step of the dump run's ``i``-th evaluation generation at
        ``optimizer_step`` (dump mode: the next step in call order)."""
        index = self._evals.get(optimizer_step, 0)
        self._evals[optimizer_step] = index + 1
        scheduler = self._scheduler("val")
        if self.mode.records:
            return scheduler.step, index
        if self._val_steps is None:
            interceptor = scheduler.interceptor
            assert interceptor is not None
            found: dict[tuple[int, int], int] = {}
            seen: dict[int, int] = {}
            for step in interceptor.store.steps(interceptor.stream):
                entry = interceptor.store.entry(interceptor.stream, step)
                at = ((entry.call if entry is not None else None) or {}).get("kwargs", {}).get("trainer_step")
                if type(at) is int:
                    found[(at, seen.get(at, 0))] = step
                    seen[at] = seen.get(at, 0) + 1
            self._val_steps = found
        if not self._val_steps:  # a dump recorded before evaluations were keyed: call order
            return sum(self._evals.values()) - 1, index
        found_step = self._val_steps.get((optimizer_step, index))
        if found_step is None:
            recorded = sorted({g for g, _ in self._val_steps})
            raise StepNotFoundError(
                f"[RolloutMock] TRL (mode={self.mode.value}): evaluation generation {index} at optimizer step "
                f"{optimizer_step} was not recorded in {self.dump_dir} (the dump run evaluated at steps "
                f"{recorded[:20]}); run the evaluations at the dump run's steps (eval_steps, eval_on_start)",
                mode=self.mode.value, split="val", step=optimizer_step, path=self.dump_dir)
        return found_step, index

    def _call(self, mode: str, prompts: Any) -> dict[str, Any]:
        """Dump: record ``self._source.pending``; mock: the recorded record of this call; check:
        the recorded or the live record, after comparing them."""
        if mode == "train":
            self._served = ("train", self.generation_index())
            result = self._scheduler("train").rollout(prompts, global_step=self._served[1])
        else:
            optimizer_step = int(self.trainer.state.global_step)
            step, _ = self._val_step(optimizer_step)
            self._served = ("val", step)
            result = self._scheduler("val").rollout(prompts, global_step=step, trainer_step=optimizer_step)
        if not isinstance(result, dict) or result.get("format") != RECORD_FORMAT:
            raise ConfigError(
                f"[RolloutMock] TRL ({self.mode.value}): {self.dump_dir} holds no TRL "
                f"generation record for this call (got {type(result).__name__}); was it recorded by wrap_trl?",
                mode=self.mode.value, path=self.dump_dir,
            )
        return result

    def _check_record(self, record: Mapping[str, Any], part: str) -> None:
        """Refuse a recorded record whose ``part`` is malformed (a damaged or hostile dump), naming
        the step and the field, before any of it is applied."""
        problem = _record_problem(record, part)
        if problem is None:
            return
        split, step = self._served
        raise CorruptStepError(
            f"[RolloutMock] TRL (mode={self.mode.value}): the record of {split} step {step} in "
            f"{self.dump_dir} is malformed ({problem}); record the dump again with wrap_trl",
            mode=self.mode.value, split=split, step=step, path=self.dump_dir)

    def _replay_generation(self, record: dict[str, Any], mode: str) -> Any:
        """Re-apply a recorded generation's side effects; return its output."""
        trainer = self.trainer
        self._check_record(record, "generate")
        generated = record["generate"]
        _apply(trainer._metrics[mode], generated["metrics"])
        before = generated.get("num_input_tokens_before")
        live = trainer.state.num_input_tokens_seen
        if before is None:  # recorded before the counter was checked: the recorded value, as then
            trainer.state.num_input_tokens_seen = generated["num_input_tokens_seen"]
        elif live != before:
            raise ReplayMismatchError(
                f"[RolloutMock] TRL (mode={self.mode.value}): generation at optimizer step "
                f"{trainer.state.global_step}: this run has seen {live} input tokens, the dump run had seen {before} "
                f"at this generation, so this run is not at the point the record was made (resumed from another "
                f"checkpoint, or other data before it). The record is not served.",
                method="_generate", argument="state.num_input_tokens_seen", recorded=str(before), live=str(live),
                mode=self.mode.value, step=int(trainer.state.global_step), path=self.dump_dir)
        else:
            trainer.state.num_input_tokens_seen = live + (generated["num_input_tokens_seen"] - before)
        if self.rng and generated["rng"] is not None:
            restore_rng(generated["rng"])
        output = generated["output"]
        return tuple(output) if generated["tuple"] else output

    # ------------------------------------------------------------------ wrapped methods
    def generate(self, prompts: list[Any]) -> Any:
        trainer = self.trainer
        mode = self._mode()
        if not self.mode.runs_scheduler:
            record = self._call(mode, prompts)
            output = self._replay_generation(record, mode)
            self._current = record
            return output
        before = _snapshot(trainer._metrics[mode])
        tokens_before = trainer.state.num_input_tokens_seen
        output = self._generate(prompts)
        live = {
            "format": RECORD_FORMAT,
            "mode": mode,
            "global_step": int(trainer.state.global_step),
            "micro_step": int(trainer._step),
            "generate": {
                "output": list(output) if isinstance(output, tuple) else output,
                "tuple": isinstance(output, tuple),
                "metrics": _delta(before, trainer._metrics[mode]),
                "num_input_tokens_before": tokens_before,
                "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
                "rng": capture_rng() if self.rng else None,
            },
        }
        if self.mode.records or self.check_serves is CheckServes.LIVE:
            if not self.mode.records:  # check mode, live served: compare now, rewards run live
                self._source.pending = live
                self._call(mode, prompts)
                live["checked"] = True
            self._current = live
            return output
        # check mode, the record served: compare, then undo the live call's side effects
        self._source.pending = live
        record = self._call(mode, prompts)
        trainer._metrics[mode].clear()
        trainer._metrics[mode].update({k: list(v) for k, v in before.items()})
        trainer.state.num_input_tokens_seen = tokens_before
        self._current = record
        return self._replay_generation(record, mode)

    def calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        trainer = self.trainer
        record, self._current = self._current, None
        if record is None:
            raise ConfigError(
                "[RolloutMock] TRL: _calculate_rewards was called without a generation before it; "
                "wrap_trl supports trainers that score right after _generate (GRPO, RLOO)",
                mode=self.mode.value,
            )
        if "rewards" in record:  # a recorded generation is served: so are its rewards
            self._check_record(record, "rewards")
            rewards = record["rewards"]
            _apply(trainer._pending_metrics, rewards["pending_metrics"])
            _apply(trainer._pending_extra_logs, rewards["pending_extra_logs"])
            if self.rng and rewards["rng"] is not None:
                restore_rng(rewards["rng"])
            return rewards["rewards_per_func"].to(trainer.accelerator.device)
        metrics = _snapshot(trainer._pending_metrics)
        extra = _snapshot(trainer._pending_extra_logs)
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if record.pop("checked", False):
            return rewards_per_func
        record["rewards"] = {
            "rewards_per_func": rewards_per_func.detach().cpu().clone(),
            "pending_metrics": _delta(metrics, trainer._pending_metrics),
            "pending_extra_logs": _delta(extra, trainer._pending_extra_logs),
            "rng": capture_rng() if self.rng else None,
        }
        self._source.pending = record
        self._call(record["mode"], prompts)
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

    @property
    def interceptor(self) -> Any:
        """The train split's interceptor (``expected=`` of a MetricsWriter reads its rank)."""
        return self._scheduler("train").interceptor

    def __enter__(self) -> TrlRollout:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        for scheduler in self._schedulers.values():
            scheduler.__exit__(exc_type, *exc_info)


def _callback(rollout: TrlRollout) -> Any:
    from transformers import TrainerCallback

    class RolloutMockCallback(TrainerCallback):
        """Notes where training starts (a resumed run: the checkpoint's step), flushes the dump at
        each save and closes it when training ends."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rollout.start = (int(state.global_step), int(rollout.trainer._step))

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

