"""verl: one call wraps the trainer's rollout.

::

    trainer.init_workers()
    wrap_verl_rollout(trainer)            # reads trainer.config.rollout_mock (or pass a config)
    trainer.fit()

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

from collections.abc import Mapping
from typing import Any

from rollout_mock.adapters.frameworks import is_tokenizer, serve_live_fields, tokenizer_fingerprint
from rollout_mock.config import load_config
from rollout_mock.errors import ConfigError
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["ATTRIBUTES", "SETTINGS", "VerlRollout", "is_validation", "verl_settings", "wrap_verl_rollout"]

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


def wrap_verl_rollout(trainer: Any, config: Any = None, *, attribute: str | None = None) -> VerlRollout | None:
    """Wrap ``trainer``'s rollout object in place and return the wrapper (``None`` if disabled).

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
