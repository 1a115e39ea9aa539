"""ROLL: one changed line per scheduler construction.

ROLL's pipelines build their schedulers as Ray actors::

    # roll/pipeline/agentic/agentic_pipeline.py
    self.train_rollout_scheduler = ray.remote(RolloutScheduler).options(name="RolloutScheduler-train", ...)
        .remote(config=self.pipeline_config, ..., mode="train")
    # roll/pipeline/rlvr/rlvr_pipeline.py, once per domain (+ one validation scheduler)
    generate_scheduler = ray.remote(DynamicSamplingScheduler).options(...)
        .remote(pipeline_config=self.pipeline_config, reward_clusters={domain: ...}, ...)

The one line a ROLL user changes is ``ray.remote(X)`` -> ``ray.remote(roll_scheduler(X, cfg))``::

    from rollout_mock.adapters.roll import roll_scheduler
    ray.remote(roll_scheduler(RolloutScheduler, self.pipeline_config)).options(...).remote(...)

or, once, right after the import (every construction in the module then goes through it)::

    RolloutScheduler = roll_scheduler(RolloutScheduler, "my_roll_config.yaml")

The ``rollout_mock:`` block is read from ``config`` (ROLL's pipeline config object, its
``rollout_mock`` attribute, a YAML path, a mapping or DictConfig). Each actor finds its own
stream from its constructor arguments, so one wrapped class serves every construction site:

* split: ``mode`` (agentic ``RolloutScheduler(..., mode="train"|"val")``), else ``is_val``
  (``DynamicSamplingScheduler``), else ``"train"``;
* name: the domain when ``reward_clusters`` holds exactly one key and the scheduler is not the
  validation one (RLVR: one scheduler per domain -> ``train/<domain>/step_N.pkl``, joined by the
  driver with ``DataProto.concat`` as before; ROLL itself writes them all to one file).

Inside the actor, interception is :func:`rollout_mock.mock_class`: mock mode never runs the
scheduler's ``__init__`` (no inference engines, no environment workers) and the lifecycle methods
ROLL's pipelines call on a scheduler (``initialize``, ``suspend``, ``shutdown``,
``pause_sampling``, ``expand_sampler``, ``shrink_sampler``, ``get_scheduler_state``...) do
nothing. ROLL's built-in ``RolloutMockMixin`` reads the same block; on a wrapped scheduler it is
switched off (rollout_mock writes the files, with a manifest and checksums).

The alternative, around the actor handle on the driver (no actor at all in mock mode), is
:func:`roll_handle`.

Faithful replay: when ``config`` is ROLL's pipeline config object, its rollout settings
(:data:`SETTINGS`: batch sizes, lengths, group size, the ``generating_args`` of ``actor_infer``,
``validation`` and the environment managers, the reward domains, and what decides the data: the
``seed`` the schedulers shuffle their prompts with, the templates, the ``data_args`` of
``actor_train`` and ``validation`` with their data files by content (size and SHA-256, not the
path), the environments of agentic pipelines) are recorded with the dump and
compared by mock and check mode before any actor is created
(:class:`~rollout_mock.errors.RolloutSettingsMismatchError` lists every difference). Each
``get_batch`` request is compared with the recorded one, less the trace context ROLL injects
(``meta_info._otel_ctx``).

Resume: ROLL's pipelines restore ``global_step`` from their checkpoint and put it in every
request (``meta_info["global_step"]`` / ``global_step=``), so a resumed mock run serves the
records of the steps it resumes at; nothing to configure.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rollout_mock.adapters.frameworks import file_fingerprint
from rollout_mock.config import RolloutMockConfig, config_parts, load_config
from rollout_mock.wrap.actor import mock_class
from rollout_mock.wrap.calls import ray_actor_class
from rollout_mock.wrap.mismatch import check_dump_settings
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = [
    "LIFECYCLE_METHODS", "SETTINGS", "roll_config", "roll_handle", "roll_name", "roll_scheduler", "roll_settings",
    "roll_split",
]

#: What decides what ROLL's schedulers generate: attributes (dotted) of the pipeline config;
#: absent ones are left out. Resource settings (GPUs, offloading) are not compared.
SETTINGS = (
    "rollout_batch_size", "val_batch_size", "sequence_length", "prompt_length", "response_length",
    "val_prompt_length", "val_sequence_length", "num_return_sequences_in_group", "is_num_return_sequences_expand",
    "async_generation_ratio", "generate_opt_level", "is_use_additional_prompts", "max_additional_running_prompts",
    "actor_infer.generating_args", "validation.generating_args", "train_env_manager.generating_args",
    "val_env_manager.generating_args", "adv_estimator",
    # what decides the data: the scheduler shuffles its prompts with the seed (DynamicSamplingScheduler:
    # random.seed(pipeline_config.seed + epoch)), the templates and the data arguments encode them
    "seed", "global_template", "tag_to_template", "dataset_filter",
    *(f"{worker}.data_args.{field}" for worker in ("actor_train", "validation") for field in (
        "template", "file_name", "eval_file_name", "dataset_type", "domain_interleave_probs", "tag", "id",
        "prompt", "response", "messages", "custom_data_kwargs_func")),
    "custom_envs", *(f"{manager}.{field}" for manager in ("train_env_manager", "val_env_manager") for field in (
        "tags", "num_env_groups", "group_size", "num_groups_partition", "max_traj_per_env")),
)
#: Settings holding data file paths: compared by content (:func:`~rollout_mock.adapters.frameworks.file_fingerprint`).
FILE_SETTINGS = frozenset(s for s in SETTINGS if s.endswith(("file_name",)))

#: Methods ROLL's pipelines call on a scheduler besides ``get_batch``; no-ops in mock mode.
LIFECYCLE_METHODS = (
    "initialize", "suspend", "resume", "shutdown", "pause_sampling", "expand_sampler",
    "shrink_sampler", "get_scheduler_state", "set_scheduler_state", "abort",
)


def roll_config(config: Any) -> RolloutMockConfig:
    """The ``rollout_mock:`` block of a ROLL pipeline config (object, YAML path, mapping...).

    A pipeline config object is read through its ``rollout_mock`` attribute (ROLL's
    ``RolloutMockConfig`` dataclass, or ``None`` = disabled) and its top-level ``max_steps``;
    it is never converted as a whole.
    """
    if config is None:
        return load_config({})
    if isinstance(config, RolloutMockConfig):
        return config
    if not isinstance(config, (str, Mapping)) and not hasattr(config, "__fspath__") and hasattr(config, "rollout_mock"):
        block = config.rollout_mock
        if block is None:
            return load_config({})
        if dataclasses.is_dataclass(block) and not isinstance(block, type):
            block = dataclasses.asdict(block)
        wrapped: dict[str, Any] = {"rollout_mock": block}
        max_steps = getattr(config, "max_steps", None)
        if isinstance(max_steps, int) and not isinstance(max_steps, bool):
            wrapped["max_steps"] = max_steps
        return load_config(wrapped)
    return load_config(config)


def roll_settings(config: Any) -> dict[str, Any] | None:
    """The rollout settings (:data:`SETTINGS`, plus the reward domains) of a ROLL pipeline config
    object; ``None`` for anything else (a YAML path, a mapping, a bare ``rollout_mock`` block)."""
    if config is None or isinstance(config, (str, Mapping, RolloutMockConfig)) or hasattr(config, "__fspath__") \
            or not hasattr(config, "rollout_mock"):
        return None
    out: dict[str, Any] = {}
    for path in SETTINGS:
        value: Any = config
        for part in path.split("."):
            value = getattr(value, part, _MISSING)
            if value is _MISSING or value is None:
                break
        if value is not _MISSING and value is not None:
            out[path] = file_fingerprint(value) if path in FILE_SETTINGS else dataclasses.asdict(value) \
                if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    rewards = getattr(config, "rewards", None)
    if isinstance(rewards, Mapping):
        out["rewards"] = sorted(str(k) for k in rewards)
    return out


_MISSING = object()


def roll_split(arguments: Mapping[str, Any]) -> str:
    """The split of a ROLL scheduler from its constructor arguments (``mode`` / ``is_val``)."""
    mode = arguments.get("mode")
    if isinstance(mode, str) and mode:
        return mode
    return "val" if arguments.get("is_val") else "train"


def roll_name(arguments: Mapping[str, Any]) -> str | None:
    """The stream name of a per-domain RLVR scheduler: its single ``reward_clusters`` key."""
    if arguments.get("is_val"):
        return None
    clusters = arguments.get("reward_clusters")
    if isinstance(clusters, Mapping) and len(clusters) == 1:
        domain = str(next(iter(clusters)))
        if domain and not any(ch in domain for ch in "/\\@") and not domain.startswith("."):
            return domain
    return None


def _noop(original: Any) -> Any:
    if inspect.iscoroutinefunction(original):
        async def async_noop(self: Any, *args: Any, **kwargs: Any) -> None:
            return None

        function: Any = async_noop
    else:
        def noop(self: Any, *args: Any, **kwargs: Any) -> None:
            return None

        function = noop
    function.__name__ = original.__name__
    function.__qualname__ = getattr(original, "__qualname__", original.__name__)
    function.__doc__ = "rollout_mock (mock mode): does nothing; the scheduler was never started."
    return function


def roll_scheduler(
    cls: type,
    config: Any,
    *,
    split: str | Callable[[dict[str, Any]], str] | None = None,
    name: str | Callable[[dict[str, Any]], str | None] | None = None,
    methods: Iterable[str] = ("get_batch",),
) -> type:
    """``cls`` (ROLL's ``RolloutScheduler`` or ``DynamicSamplingScheduler``) with its batches
    recorded/replayed inside each instance; use it where ROLL uses the class (see the module
    docstring). ``split``/``name`` override what is read from the constructor's arguments.
    With ``enable: false`` (or no block) ``cls`` itself is returned."""
    resolved = roll_config(config)
    settings = roll_settings(config)
    if resolved.enable and resolved.mode.replays:  # the pre-flight check, on the driver, before any actor
        parts = config_parts(resolved)
        check_dump_settings(parts.store, parts.match, settings, mode=parts.mode)
    wrapped = mock_class(
        cls, resolved,
        split=roll_split if split is None else split,
        name=roll_name if name is None else name,
        methods=methods,
        rollout_settings=settings,
        framework="roll",
    )
    if wrapped is cls or resolved.mode.runs_scheduler:  # dump and check run the real scheduler
        return wrapped
    skip = set(methods)
    namespace: dict[str, Any] = {"__module__": cls.__module__}
    for method in LIFECYCLE_METHODS:
        original = getattr(cls, method, None)
        if callable(original) and method not in skip:
            namespace[method] = _noop(original)
    subclass = type(cls.__name__, (wrapped,), namespace)
    subclass.__qualname__ = cls.__qualname__
    subclass.__doc__ = cls.__doc__
    return subclass


def roll_handle(
    factory: Callable[[], Any] | None,
    config: Any,
    *,
    spec: Any,
    split: str = "train",
    name: str | None = None,
    methods: Iterable[str] = ("get_batch",),
) -> Any:
    """A :class:`~rollout_mock.MockScheduler` around a ROLL scheduler's Ray actor handle.

    ``factory`` creates the actor (``lambda: ray.remote(RolloutScheduler).options(...).remote(...)``)
    and is called only when the real scheduler is needed (dump mode; mock mode with
    ``on_missing_step: record``): mock mode creates no actor at all. ``spec`` is the scheduler
    class (its ``get_batch`` signature tells where the step is). Calls stay
    ``ray.get(handle.get_batch.remote(...))``; in dump mode ROLL's own mock inside the actor is
    switched off. Other actor methods (``suspend``...) are unavailable in mock mode."""
    if isinstance(spec, type) and ray_actor_class(spec) is None:
        import ray

        spec = ray.remote(spec)  # never instantiated: only tells mock mode to answer .remote()
    return MockScheduler(None, roll_config(config), factory=factory, spec=spec, split=split, name=name,
                         methods=tuple(methods), rollout_settings=roll_settings(config), framework="roll")
