"""verl: one call wraps the trainer's rollout, V1 (``trainer.use_v1: true``, verl >= 0.9's
default) or V0 (``RayPPOTrainer``).

::

    trainer.init()                        # V1; V0: trainer.init_workers()
    wrap_verl_rollout(trainer)            # reads trainer.config.rollout_mock (or pass a config)
    trainer.fit(agent_loop_manager)       # V0: trainer.fit()

V1 (``verl.trainer.ppo.v1``: the sync, colocate_async and separate_async trainers) is described
under :class:`VerlV1Rollout`. V0 follows.

verl's ``RayPPOTrainer`` gets every rollout from ``generate_sequences(prompts: DataProto)`` on
``trainer.async_rollout_manager`` (verl >= 0.6, ``AgentLoopManager``) or, in older versions,
``trainer.actor_rollout_wg``; :func:`wrap_verl_rollout` replaces whichever the trainer has with a
:class:`VerlRollout`. The step is ``prompts.meta_info["global_steps"]`` (set by the trainer);
validation batches (``meta_info["validate"]`` true) are recorded and replayed in the ``val``
split, training batches in ``train``. Every other attribute passes through to the real object.

The pre-flight check compares the rollout settings (:data:`SETTINGS`, read from
``trainer.config``: the sampling parameters and lengths of ``actor_rollout_ref.rollout``, the
batch sizes, lengths, data seed and shuffling of ``data``, and the fingerprint of the trainer's
tokenizer and chat template) with the dump run's. Request matching compares every
``generate_sequences`` request except the random ``uid`` verl gives each prompt; an output that
carries its request's ``uid`` (verl 0.9.1 with a colocated reward model, older agent loops) is
served with the live uids, so that ``batch.union(output)`` finds them equal.

Resume: verl restores ``trainer.global_steps`` from ``global_step_N`` checkpoints and tags every
request with it (``meta_info["global_steps"]``), so a resumed mock run serves the records of the
steps it resumes at, with nothing to configure; its dataloader state is restored by verl too, so
its prompts match the recorded ones (request matching says so when they do not).

verl's own ``skip.rollout`` dumps are read by :mod:`rollout_mock.adapters.foreign`
(``open_foreign(path, trust=True)`` or ``rollout-mock import``).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rollout_mock.adapters.frameworks import is_tokenizer, serve_live_fields, tokenizer_fingerprint
from rollout_mock.config import load_config
from rollout_mock.errors import ConfigError, ReplayMismatchError, UnrecordableBatchError
from rollout_mock.wrap.matching import digest_request
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["ATTRIBUTES", "SETTINGS", "VerlRollout", "VerlV1Rollout", "is_validation", "verl_settings",
           "weight_versions", "wrap_verl_rollout"]

#: Trainer attributes holding the rollout, newest verl first.
ATTRIBUTES = ("async_rollout_manager", "actor_rollout_wg")
#: What decides what verl's rollout generates: dotted paths in the trainer's config (absent ones
#: are left out). Resource settings (GPU memory, parallel sizes) are not compared: a mock run
#: starts no engine and may run on another layout.
SETTINGS = (
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.do_sample", "actor_rollout_ref.rollout.prompt_length",
    "actor_rollout_ref.rollout.response_length", "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.ignore_eos", "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.rollout.val_kwargs", "actor_rollout_ref.rollout.multi_turn",
    "data.train_batch_size", "data.val_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.truncation", "data.return_raw_chat", "data.seed", "data.shuffle", "data.prompt_key",
    "data.apply_chat_template_kwargs", "algorithm.adv_estimator",
)


def _lookup(config: Any, path: str) -> tuple[bool, Any]:
    value = config
    for part in path.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                return False, None
            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            return False, None
    return True, value


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain containers (other values unchanged)."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def verl_settings(config: Any, tokenizer: Any = None) -> dict[str, Any] | None:
    """The rollout settings (:data:`SETTINGS`) of verl's trainer config (an OmegaConf
    ``DictConfig`` or a mapping), and the fingerprint of ``tokenizer`` (the trainer's, with its
    chat template: :func:`~rollout_mock.adapters.tokenizer_fingerprint`) under ``tokenizer``;
    ``None`` without a config."""
    if config is None:
        return None
    out: dict[str, Any] = {}
    for path in SETTINGS:
        found, value = _lookup(config, path)
        if found:
            out[path] = _plain(value)
    if tokenizer is not None and is_tokenizer(tokenizer):
        out["tokenizer"] = tokenizer_fingerprint(tokenizer)
    return out


def is_validation(prompts: Any) -> bool:
    meta = getattr(prompts, "meta_info", None)
    return isinstance(meta, Mapping) and bool(meta.get("validate", False))


class VerlRollout:
    """``generate_sequences`` recorded/replayed per split; everything else passes through.

    Works wherever a :class:`MockScheduler` does: a context manager (closing both splits),
    ``expected=`` of a :class:`~rollout_mock.MetricsWriter` (:attr:`config`, :attr:`interceptor`:
    the train split's). The ``val`` split is opened at the first validation call: a run without
    validation records (and warns about) no ``val`` stream."""

    def __init__(self, rollout: Any, config: Any, *, method: str = "generate_sequences",
                 rollout_settings: Mapping[str, Any] | None = None) -> None:
        self._rollout = rollout
        self._method = method
        self._cfg = load_config(config)
        self._settings = rollout_settings
        #: a replayed output's live-served fields (the uid) get the live request's values
        self._serves_recorded = self._cfg.enable and self._cfg.mode.replays
        self._splits: dict[str, MockScheduler[Any]] = {}
        self._split("train")  # mock mode: fail now if the dump cannot be opened or the settings differ

    def __repr__(self) -> str:
        return f"VerlRollout({self._rollout!r})"

    def _split(self, split: str) -> MockScheduler[Any]:
        mock = self._splits.get(split)
        if mock is None:
            mock = self._splits[split] = MockScheduler(self._rollout, self._cfg, split=split, methods=(self._method,),
                                                       rollout_settings=self._settings, framework="verl")
        return mock

    @property
    def config(self) -> Any:
        """The ``rollout_mock:`` settings (a :class:`~rollout_mock.RolloutMockConfig`)."""
        return self._splits["train"].config

    @property
    def interceptor(self) -> Any:
        """The train split's interceptor (``None`` when disabled)."""
        return self._splits["train"].interceptor

    def generate_sequences(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        split = "val" if is_validation(prompts) else "train"
        output = getattr(self._split(split), self._method)(prompts, *args, **kwargs)
        return serve_live_fields("verl", prompts, output) if self._serves_recorded else output

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in ("_rollout", "_splits", "_method", "_cfg", "_settings",
                                                       "_serves_recorded"):
            raise AttributeError(attribute)
        if attribute == self._method:
            return self.generate_sequences
        return getattr(self._rollout, attribute)

    def flush(self) -> None:
        """Wait until every step queued so far is written, in both splits."""
        for mock in self._splits.values():
            mock.flush()

    def close(self) -> None:
        """Flush pending dumps of both splits (also done at interpreter exit)."""
        for mock in self._splits.values():
            mock.close()

    def __enter__(self) -> VerlRollout:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        for mock in self._splits.values():
            mock.__exit__(exc_type, *exc_info)


# ------------------------------------------------------------------ verl V1 (trainer.use_v1)

#: Fields of a prompt row that are not its content: the random uid, the trainer's step, the split.
_PROMPT_VOLATILE = ("uid", "global_steps", "validate")


def _tq() -> Any:
    """verl's ``transfer_queue`` module (imported by verl before any trainer exists)."""
    module = sys.modules.get("transfer_queue")
    if module is None:
        import transfer_queue

        module = transfer_queue
    return module


def _column(value: Any, count: int) -> list[Any]:
    """One TransferQueue column as its per-sample values (what the queue stores per key)."""
    import torch

    if isinstance(value, torch.Tensor):
        return list(value.unbind(0)) if value.is_nested else [value[i] for i in range(count)]
    data = getattr(value, "tolist", None)
    if callable(data) and type(value).__name__ == "NonTensorStack":
        return list(data())
    if type(value).__name__ == "NonTensorData":
        return [value.data] * count
    return list(value)


def _pack(values: list[Any]) -> Any:
    """Per-sample values as one column ``kv_batch_put`` splits back into the same values."""
    import torch
    from tensordict import NonTensorStack

    if values and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        if all(v.shape == values[0].shape for v in values):
            return torch.stack(values)
        return torch.nested.as_nested_tensor(values, layout=torch.jagged)
    return NonTensorStack(*values)


def _partition(prompts: Any) -> str:
    try:
        validate = prompts.get("validate", None) if "validate" in prompts.keys() else None
    except (AttributeError, TypeError):
        validate = None
    validate = getattr(validate, "data", validate)
    return "val" if bool(validate) else "train"


def _prompt_rows(prompts: Any) -> tuple[list[str], list[int]]:
    """The uids of a prompt batch (a ``TensorDict``) and a digest of each row's content."""
    count = int(prompts.batch_size[0])
    columns = {name: _column(prompts.get(name), count) for name in prompts.keys()
               if name not in _PROMPT_VOLATILE and type(prompts.get(name)).__name__ != "NonTensorData"}
    uids = [str(u) for u in _column(prompts.get("uid"), count)]
    digests = [digest_request({name: column[i] for name, column in columns.items()}, volatile=[]).digest
               for i in range(count)]
    return uids, digests


def _batch_step(prompts: Any) -> int:
    """The ``global_steps`` verl's trainer set on a prompt batch (-1 without one)."""
    try:
        value = prompts.get("global_steps", None) if "global_steps" in prompts.keys() else None
    except (AttributeError, TypeError):
        value = None
    value = getattr(value, "data", value)
    try:
        return int(value) if value is not None else -1
    except (TypeError, ValueError):
        return -1


class _Submissions:
    """The prompts handed to generation, per partition. A prompt is known by its *prompt id*
    ``"S.I"``: submitted at ``global_steps`` S, the I-th of that step (the live run's uids are
    fresh ``uuid4``s; a run resumed at step S submits the same ids), and checked by a digest of
    its content."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.order: dict[str, list[str]] = {}  # partition -> uids in submission order
        self.ids: dict[str, dict[str, str]] = {}  # partition -> uid -> prompt id
        self.uid_of: dict[str, dict[str, str]] = {}  # partition -> prompt id -> uid
        self.digests: dict[str, dict[str, int]] = {}  # partition -> prompt id -> content digest
        self.at_step: dict[tuple[str, int], int] = {}

    def add(self, prompts: Any) -> None:
        partition = _partition(prompts)
        step = _batch_step(prompts)
        uids, digests = _prompt_rows(prompts)
        with self._lock:
            for uid, digest in zip(uids, digests):
                index = self.at_step.get((partition, step), 0)
                self.at_step[(partition, step)] = index + 1
                pid = f"{step}.{index}"
                self.order.setdefault(partition, []).append(uid)
                self.ids.setdefault(partition, {})[uid] = pid
                self.uid_of.setdefault(partition, {})[pid] = uid
                self.digests.setdefault(partition, {})[pid] = digest


class _SubmittingLoop:
    """verl's agent loop manager: each submitted prompt batch is counted; in mock mode nothing is
    generated (``generate_sequences`` of V1 returns ``None`` and writes into the queue)."""

    def __init__(self, manager: Any, submissions: _Submissions, *, generate: bool) -> None:
        self._manager = manager
        self._submissions = submissions
        self._generate = generate

    def generate_sequences(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        self._submissions.add(prompts)
        if self._generate:
            return self._manager.generate_sequences(prompts, *args, **kwargs)
        return None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in ("_manager", "_submissions", "_generate"):
            raise AttributeError(attribute)
        return getattr(self._manager, attribute)


class _Consumption:
    """The replay buffer's ``sample`` as a record of what the trainer consumes (the object
    :class:`MockScheduler` intercepts): the sampled trajectories' fields, tags and keys (prompt
    id + ``_{session}_{index}``) in sampling order, the metrics, the prompts the sampling
    cleared and the refills it asked for."""

    def __init__(self, real_sample: Callable[..., Any], submissions: _Submissions) -> None:
        self._real = real_sample
        self._submissions = submissions
        self.refills: list[int] | None = None
        self.live: Any = None

    def refilled(self, count: int) -> None:
        if self.refills is not None:
            self.refills.append(int(count))

    def _prompts_in_queue(self, partition: str) -> set[str]:
        tags = _tq().kv_list(partition) or {}
        return {key for key, tag in tags.get(partition, {}).items() if tag.get("is_prompt", False)}

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> dict[str, Any]:
        before = self._prompts_in_queue(partition_id)
        submitted = len(self._submissions.order.get(partition_id, []))
        self.refills = []
        try:
            meta, metrics = self._real(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
            refills = self.refills
        finally:
            self.refills = None
        self.live = (meta, metrics)
        # refilled prompts that were selected (or evicted) within this call count as cleared too
        refilled = set(self._submissions.order.get(partition_id, [])[submitted:])
        cleared = (before | refilled) - self._prompts_in_queue(partition_id)
        ids = self._submissions.ids.get(partition_id, {})
        keys: list[list[Any]] = []
        for key in meta.keys:
            uid, _, rest = str(key).partition("_")
            if uid not in ids:
                raise UnrecordableBatchError(
                    f"[RolloutMock] verl V1 (mode=dump, split={partition_id}, step={global_steps}): the replay "
                    f"buffer sampled {key!r}, whose prompt uid was never submitted through the wrapped agent loop "
                    f"manager; call wrap_verl_rollout(trainer) before trainer.fit(...)", mode="dump",
                    split=partition_id, step=global_steps)
            keys.append([ids[uid], rest])
        fields: dict[str, list[Any]] = {}
        if meta.keys:
            data = _tq().kv_batch_get(keys=list(meta.keys), partition_id=partition_id)
            fields = {name: _column(data.get(name), len(meta.keys)) for name in data.keys()}
        digests = self._submissions.digests.get(partition_id, {})
        return {
            "partition": partition_id, "batch_size": int(batch_size), "keys": keys,
            "tags": [dict(tag) for tag in meta.tags], "fields": fields, "metrics": dict(metrics),
            "cleared": sorted(ids[uid] for uid in cleared if uid in ids), "refills": refills,
            "prompt_digests": {pid: digests[pid] for pid in sorted({pid for pid, _ in keys})},
        }


def weight_versions(record: Mapping[str, Any]) -> dict[str, Any]:
    """Provenance of a V1 record: per sample, the weight versions its tokens were generated
    under (verl's ``min_global_steps``/``max_global_steps`` tags) and the step its prompt was
    submitted at (``global_steps``)."""
    tags = record.get("tags", [])
    return {"min": [t.get("min_global_steps") for t in tags], "max": [t.get("max_global_steps") for t in tags],
            "submitted": [t.get("global_steps") for t in tags]}


class VerlV1Rollout:
    """verl's V1 trainer (``verl.trainer.ppo.v1``) recorded at what it consumes.

    In V1 the trainer puts prompts into a TransferQueue, ``AgentLoopManagerTQ.generate_sequences``
    returns ``None`` and writes the trajectories into the queue, and the trainer trains on what
    ``ReplayBuffer.sample(global_steps, partition_id, batch_size)`` selects, reading the fields
    with ``tq.kv_batch_get``. Which trajectories a step gets depends on timing in the async modes
    (what finished first, what went stale), so the record is the consumption, not the generation:

    * every prompt batch handed to ``generate_sequences`` is counted per partition: a prompt is
      known by its *prompt id* ``"S.I"`` (submitted at ``global_steps`` S, the I-th of that step:
      the live run's uids are fresh ``uuid4``s) and checked by a digest of its row;
    * dump mode: each ``sample`` call is recorded (step = ``global_steps``; ``val`` partition in
      the ``val`` split) as the sampled keys (prompt id + ``_{session}_{index}``) in sampling
      order, every field the queue holds for them, their tags (``min_global_steps`` /
      ``max_global_steps``: the weight versions, also recorded as provenance), the sampler's
      metrics, the prompts it cleared (selected or evicted as stale) and the refills it asked for;
    * mock mode: ``generate_sequences`` generates nothing; ``sample`` makes the recorded refills
      (the dataloader advances as in the dump run), writes the recorded fields into the queue
      under the live run's keys (``{live uid of the prompt id}_{session}_{index}``, the ``uid`` field
      rewritten), clears the recorded prompts and returns the recorded batch and metrics. The
      trainer's own code then reads, balances, trains and clears as usual.

    Checks (mock mode): another ``batch_size`` than the recorded call's, a recorded prompt the
    live run has not submitted, or one whose content differs: :class:`ReplayMismatchError` naming
    the step and both counts (or the prompt id); never a cycle over what was recorded. Resume:
    the sync trainer resumed at step S submits the prompts of step S again (verl restores the
    data loader), so they get the recorded ids; the async trainers re-issue their in-flight
    prompts from a TransferQueue checkpoint under the resume step, which a mock run refuses
    (recorded prompt ids not submitted).
    ``trainer.v1.separate_async.hybrid_rollout.enable_switch`` (switches decided by wall-clock
    waits) is refused.
    """

    def __init__(self, trainer: Any, config: Any, *, rollout_settings: Mapping[str, Any] | None = None) -> None:
        cfg = load_config(config)
        self.config = cfg
        self._trainer = trainer
        buffer = trainer.replay_buffer
        switch = _lookup(getattr(trainer, "config", None), "trainer.v1.separate_async.hybrid_rollout.enable_switch")
        mode = str(_lookup(getattr(trainer, "config", None), "trainer.v1.trainer_mode")[1])
        if mode == "separate_async" and switch[0] and bool(switch[1]):
            raise ConfigError(
                "[RolloutMock] verl V1: trainer.v1.separate_async.hybrid_rollout.enable_switch=true lends the "
                "trainer's GPUs to generation by wall-clock waits and refills prompts outside sampling; such a "
                "run cannot be recorded and replayed. Set it to false (verl's default).")
        self.submissions = _Submissions()
        self._generate = cfg.mode.runs_scheduler
        self._consumption = _Consumption(buffer.sample, self.submissions)
        refill = getattr(buffer, "refill_fn", None)
        self._refill = refill
        if refill is not None:
            def counted_refill(count: int) -> Any:
                self._consumption.refilled(count)
                return refill(count)

            buffer.refill_fn = counted_refill
        extra: dict[str, Any] = {}
        if "provenance" in inspect.signature(MockScheduler.__init__).parameters:
            extra["provenance"] = weight_versions
        self._scheduler_options = {"methods": ("sample",), "spec": _Consumption, "rollout_settings": rollout_settings,
                                   "match_keys": {"sample": lambda arguments: arguments.get("partition_id")}, **extra}
        #: the val split is opened by the first validation sample (a run without validation
        #: leaves no empty val stream behind)
        self._splits = {"train": self._scheduler("train")}
        buffer.sample = self.sample
        real_fit = trainer.fit

        def fit(agent_loop_manager: Any, *args: Any, **kwargs: Any) -> Any:
            return real_fit(self.wrap_agent_loop_manager(agent_loop_manager), *args, **kwargs)

        trainer.fit = fit

    def __repr__(self) -> str:
        return f"VerlV1Rollout({type(self._trainer).__name__}, mode={self.config.mode.value})"

    def _scheduler(self, split: str) -> MockScheduler[Any]:
        return MockScheduler(self._consumption if self._generate else None, self.config, split=split,
                             **self._scheduler_options)

    def wrap_agent_loop_manager(self, manager: Any) -> Any:
        """``manager`` with its submissions counted (and nothing generated in mock mode);
        :meth:`__init__` does it for ``trainer.fit(manager)``."""
        if isinstance(manager, _SubmittingLoop):
            return manager
        return _SubmittingLoop(manager, self.submissions, generate=self._generate)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict[str, Any]]:
        split = "val" if partition_id == "val" else "train"
        if split not in self._splits:
            self._splits[split] = self._scheduler(split)
        record = self._splits[split].sample(global_steps=global_steps, partition_id=partition_id,
                                             batch_size=batch_size)
        if self._generate:
            meta, metrics = self._consumption.live
            return meta, metrics
        return self._replay(record, global_steps, partition_id, batch_size)

    def _mismatch(self, message: str, step: int, split: str, **context: Any) -> ReplayMismatchError:
        return ReplayMismatchError(f"[RolloutMock] verl V1 (mode={self.config.mode.value}, split={split}, "
                                   f"step={step}): {message}", mode=self.config.mode.value, split=split,
                                   step=step, method="sample", **context)

    def _replay(self, record: Mapping[str, Any], step: int, partition: str,
                batch_size: int) -> tuple[Any, dict[str, Any]]:
        tq = _tq()
        split = "val" if partition == "val" else "train"
        if int(record["batch_size"]) != int(batch_size):
            raise self._mismatch(
                f"ReplayBuffer.sample asks for {batch_size} prompt groups, the recorded call consumed "
                f"{record['batch_size']}: another data.train_batch_size or parameter_sync_step than the dump "
                f"run's (nothing is cycled or cut to fit)", step, split, argument="batch_size",
                recorded=str(record["batch_size"]), live=str(batch_size))
        for count in record.get("refills") or []:
            buffer_refill = self._trainer.replay_buffer.refill_fn
            buffer_refill(int(count))
        uid_of = self.submissions.uid_of.get(partition, {})
        digests = self.submissions.digests.get(partition, {})

        def live_uid(pid: str) -> str:
            if pid not in uid_of:
                at, _, index = str(pid).partition(".")
                count = self.submissions.at_step.get((partition, int(at)), 0)
                raise self._mismatch(
                    f"the recorded call consumed prompt {index} submitted at step {at} of the {partition} "
                    f"partition; this run has submitted {count} prompts at step {at} (fewer prompts per step, "
                    f"another warm-up, or an async run resumed from a TransferQueue checkpoint)",
                    step, split, argument="prompts", recorded=f"prompt {pid}", live=f"{count} submitted at {at}")
            return uid_of[pid]

        for pid, digest in record.get("prompt_digests", {}).items():
            if pid in digests and digests[pid] != int(digest):
                at, _, index = str(pid).partition(".")
                raise self._mismatch(
                    f"prompt {index} submitted at step {at} of the {partition} partition differs from the dump "
                    f"run's (another dataset, seed or data loader position)", step, split,
                    argument=f"prompts[{pid}]", recorded=f"digest {digest}", live=f"digest {digests[pid]}")
        keys = [f"{live_uid(str(pid))}_{rest}" for pid, rest in record["keys"]]
        tags = [dict(tag) for tag in record["tags"]]
        if keys:
            from tensordict import TensorDict

            columns = {}
            for name, values in record["fields"].items():
                values = list(values)
                if name == "uid":
                    values = [live_uid(str(pid)) for pid, _ in record["keys"]]
                columns[name] = _pack(values)
            tq.kv_batch_put(keys=keys, partition_id=partition, fields=TensorDict(columns, batch_size=[len(keys)]),
                            tags=tags)
        cleared = [live_uid(str(pid)) for pid in record.get("cleared", [])]
        if cleared:
            tq.kv_clear(keys=cleared, partition_id=partition)
        return tq.KVBatchMeta(partition_id=partition, keys=keys, tags=tags), dict(record.get("metrics", {}))

    def close(self) -> None:
        """Flush pending dumps of both splits (also done at interpreter exit)."""
        for mock in self._splits.values():
            mock.close()


def _is_v1(trainer: Any) -> bool:
    buffer = getattr(trainer, "replay_buffer", None)
    return buffer is not None and callable(getattr(buffer, "sample", None)) and callable(getattr(trainer, "fit", None))


def wrap_verl_rollout(trainer: Any, config: Any = None, *,
                      attribute: str | None = None) -> VerlRollout | VerlV1Rollout | None:
    """Wrap ``trainer``'s rollout in place and return the wrapper (``None`` if disabled).

    A V1 trainer (it has a ``replay_buffer``; call after ``trainer.init()``, before ``fit``) gets a
    :class:`VerlV1Rollout`; a V0 ``RayPPOTrainer`` (call after ``init_workers()``) a
    :class:`VerlRollout` around ``async_rollout_manager`` or ``actor_rollout_wg``.

    ``config``: the ``rollout_mock:`` block in any form :func:`load_config` takes; default
    ``trainer.config`` (verl's OmegaConf config holding ``rollout_mock:``, e.g. from
    ``+rollout_mock.enable=true +rollout_mock.mode=dump +rollout_mock.dump_dir=...``).
    """
    trainer_config = getattr(trainer, "config", None)
    if config is None:
        config = trainer_config
        if config is None:
            raise ConfigError("wrap_verl_rollout: the trainer has no .config; pass config=")
        if "rollout_mock" not in config:
            return None
    cfg = load_config(config)
    if not cfg.enable:
        return None
    if attribute is None and _is_v1(trainer):
        wrapped = getattr(trainer.replay_buffer.sample, "__self__", None)
        if isinstance(wrapped, VerlV1Rollout):
            return wrapped
        return VerlV1Rollout(trainer, cfg, rollout_settings=verl_settings(trainer_config))
    names = (attribute,) if attribute else ATTRIBUTES
    for name in names:
        rollout = getattr(trainer, name, None)
        if rollout is not None and callable(getattr(rollout, "generate_sequences", None)):
            if isinstance(rollout, VerlRollout):
                return rollout
            tokenizer = getattr(trainer, "tokenizer", None)
            wrapped = VerlRollout(rollout, cfg, rollout_settings=verl_settings(trainer_config, tokenizer))
            setattr(trainer, name, wrapped)
            return wrapped
    raise ConfigError(
        f"wrap_verl_rollout: the trainer has none of {', '.join(names)} with generate_sequences; "
        f"call it after trainer.init_workers()"
    )
