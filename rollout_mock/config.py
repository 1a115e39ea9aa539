"""The ``rollout_mock:`` configuration block.

ROLL's block (``enable``, ``mode``, ``dump_dir``) loads unchanged; every other key is optional and
has a default that keeps ROLL's behaviour where ROLL's behaviour is safe. Unknown keys and bad
values are errors that name the key, the value and the valid choices. Error messages are bounded:
values are shown as short reprs, and at most :data:`MAX_ERROR_LINES` problems are listed.

YAML files are read with a safe loader that refuses, before any Python object is built, files
over :data:`MAX_CONFIG_BYTES`, documents whose aliases would expand to more than
:data:`MAX_YAML_NODES` nodes ("billion laughs"), recursive aliases and absurd nesting.

``${...}`` interpolations (OmegaConf syntax) in a YAML file or a plain mapping are resolved with
OmegaConf, against the whole document, when ``omegaconf`` is installed; without it a ``rollout_mock``
value holding ``${`` is a :class:`~rollout_mock.errors.ConfigError` naming the key: it is never
used literally (e.g. as a directory name).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout_mock._text import short_repr
from rollout_mock._yaml import load_yaml_file
from rollout_mock.debug.settings import VerdictConfig, WatchdogConfig
from rollout_mock.errors import ConfigError
from rollout_mock.modes import Mode

__all__ = [
    "BLOCK_KEY",
    "DiskFullPolicy",
    "FingerprintPolicy",
    "RankPolicy",
    "RolloutMockConfig",
    "build_config",
    "load_config",
]

BLOCK_KEY = "rollout_mock"
#: Largest YAML config file read (a training config is a few kB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Most nodes a YAML document may have once its aliases are expanded.
MAX_YAML_NODES = 200_000
#: Most problems listed in one :class:`ConfigError`.
MAX_ERROR_LINES = 20
_MAX_MESSAGE = 300


class DiskFullPolicy(str, Enum):
    """What dump mode does when the disk fills up."""

    FAIL = "fail"
    """Raise :class:`~rollout_mock.errors.DiskFullError` (default): the run stops."""

    SKIP = "skip"
    """Log a loud warning, stop dumping, and let training continue without a recording."""


class FingerprintPolicy(str, Enum):
    """What mock mode does when its environment differs from the one that recorded the dump."""

    WARN = "warn"
    ERROR = "error"
    OFF = "off"


class RankPolicy(str, Enum):
    """Which torch.distributed ranks write in dump mode."""

    ONE = "one"
    """Only ``dump_rank`` writes (default): every rank sees the same batch."""

    ALL = "all"
    """Every rank writes its own file ``step_NNNNNN_rankR.pkl`` (per data-parallel head batches)."""


class ReplayRows(BaseModel):
    """Mock mode: this process is data-parallel rank ``dp_rank`` of ``dp_size`` and replays only
    its rows of each recorded batch (split like ``torch.chunk`` / verl's ``DataProto.chunk``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp_rank: int = Field(ge=0)
    dp_size: int = Field(ge=1)

    def model_post_init(self, __context: Any) -> None:
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} must be below dp_size {self.dp_size}")


class RolloutMockConfig(BaseModel):
    """The ``rollout_mock:`` block. Build it with :func:`load_config` or directly.

    The model is frozen: a config cannot change behind a running scheduler's back.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    enable: bool = False
    """Master switch. ``false`` means no interception at all."""

    mode: Mode = Mode.DUMP
    """``dump`` records batches, ``mock`` replays them."""

    dump_dir: str = "./rollout_mock_dumps"
    """Directory holding ``manifest.json`` and ``{split}/step_{step:06d}.pkl``, or an fsspec URL
    (``s3://bucket/prefix``, ``gs://``, ``oss://``, ``hdfs://``, ``memory://``, ``file://``)."""

    storage_options: dict[str, Any] | None = None
    """Options passed to fsspec for a URL ``dump_dir`` (e.g. ``{endpoint_url: ..., anon: false}``
    for s3fs); credentials may also come from the standard environment (``AWS_*``)."""

    overwrite: bool = False
    """Dump mode: allow replacing a step that is already recorded (e.g. a dump run resumed
    from a checkpoint). Off by default: a recording is evidence."""

    max_steps: int | None = Field(default=None, ge=1)
    """Mock mode: steps ``0 .. max_steps-1`` must all be recorded; checked before the run starts."""

    dump_steps: list[int] | None = None
    """Dump mode: record only these steps (others pass through unrecorded). ``None`` = all."""

    max_keep: int | None = Field(default=None, ge=1)
    """Dump mode: keep only the newest ``max_keep`` recorded steps of each stream (older ones are
    deleted after each new step), except ``pin_steps``. ``None`` keeps everything."""

    pin_steps: list[int] | None = None
    """Dump mode with ``max_keep``: steps that are never deleted (e.g. the first, or a step with
    a known bug)."""

    background: bool = True
    """Dump mode: serialise and write on a background thread; the call returns once the batch
    is captured in memory."""

    max_pending: int = Field(default=2, ge=1)
    """Dump mode: captured steps that may wait for the writer before the caller blocks."""

    prefetch: bool = True
    """Mock mode: load the next step in the background while the current one trains."""

    verify_checksum: bool = True
    """Verify each step's checksum against the manifest when it is loaded."""

    trust_pickle: bool = False
    """Load steps with the unrestricted unpickler (needed only for batches holding arbitrary
    objects, e.g. user classes or lambdas). Only for dumps you trust: unpickling runs code."""

    hmac_key_env: str | None = None
    """Name of an environment variable holding a secret key. When set, dump mode signs each step
    with HMAC-SHA256 and mock mode refuses files whose signature does not match."""

    name: str | None = None
    """Namespace for this scheduler's files (``{split}/{name}/step_...``), so several schedulers
    (e.g. ROLL's per-domain RLVR schedulers) can share one ``dump_dir`` and split."""

    ranks: RankPolicy = RankPolicy.ONE
    """torch.distributed: ``one`` rank writes (``dump_rank``), or ``all`` ranks write own files."""

    dump_rank: int = Field(default=0, ge=0)

    replay_rows: ReplayRows | None = None
    """Mock mode: ``{dp_rank: R, dp_size: N}`` loads only rank R's rows of each recorded batch
    (reading only those rows' bytes from format-2 steps). ``None`` loads whole batches."""

    replay_keys: list[str] | None = None
    """Mock mode: load only these top-level keys of each recorded batch (e.g. ``[input_ids,
    attention_mask]``). ``None`` loads every key."""

    fingerprint: FingerprintPolicy = FingerprintPolicy.WARN
    """Mock mode: how to react when this environment differs from the recorded one."""

    on_disk_full: DiskFullPolicy = DiskFullPolicy.FAIL

    verdict: VerdictConfig = Field(default_factory=VerdictConfig)
    """Mock mode: compare each metric logged through ``MetricsWriter(path, expected=scheduler)``
    with the value the dump run logged (``warn``/``fail``/``off``, per-metric ``rtol``/``atol``)."""

    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    """Write every thread's stack and the pending asyncio tasks when a call (or the time between
    two calls) stalls: ``{enable, factor, min_seconds, absolute_seconds}``."""

    @field_validator("mode", mode="before")
    @classmethod
    def _parse_mode(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return Mode(value)
            except ValueError:
                return value  # let pydantic report it with the valid choices
        return value

    @field_validator("dump_dir", mode="before")
    @classmethod
    def _parse_dump_dir(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("replay_keys")
    @classmethod
    def _check_replay_keys(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or any(not k or not isinstance(k, str) for k in value)):
            raise ValueError("must be a non-empty list of key names")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None:
            from rollout_mock.storage.paths import NAME_PATTERN

            if not NAME_PATTERN.fullmatch(value):
                raise ValueError(
                    f"must be a name without '/', '\\', '@', '..' or a leading '.' (pattern "
                    f"{NAME_PATTERN.pattern}): it becomes a directory inside dump_dir"
                )
        return value

    @property
    def dump_path(self) -> Path:
        return Path(self.dump_dir)

    def replace(self, **changes: Any) -> RolloutMockConfig:
        """A copy with ``changes`` applied and validated."""
        return build_config({**self.model_dump(mode="json"), **changes})


def _choices_for(field_name: str) -> list[str] | None:
    annotation = RolloutMockConfig.model_fields[field_name].annotation
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return [str(member.value) for member in candidate]
        if getattr(candidate, "__origin__", None) is Literal:
            return [str(arg) for arg in candidate.__args__]
    if annotation is bool:
        return ["true", "false"]
    return None


def _format_errors(error: ValidationError, block: Mapping[str, Any]) -> str:
    valid_keys = list(RolloutMockConfig.model_fields)
    lines: list[str] = []
    items = error.errors()
    for item in items[:MAX_ERROR_LINES]:
        loc = item.get("loc", ())
        raw_key = str(loc[0]) if loc else "?"
        key = raw_key if len(raw_key) <= 80 else short_repr(raw_key, 80)
        value = short_repr(block.get(raw_key, item.get("input")))
        if item.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(raw_key[:80], valid_keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(
                f"{BLOCK_KEY}.{key}: unknown key (value {value}){hint}; "
                f"valid keys: {', '.join(valid_keys)}"
            )
            continue
        choices = _choices_for(raw_key) if raw_key in RolloutMockConfig.model_fields else None
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")[:_MAX_MESSAGE]
        line = f"{BLOCK_KEY}.{key}: invalid value {value}: {message}"
        if choices:
            line += f"; valid choices: {', '.join(choices)}"
        lines.append(line)
    if len(items) > MAX_ERROR_LINES:
        lines.append(f"... and {len(items) - MAX_ERROR_LINES} more problem(s)")
    return "\n".join(lines)


def build_config(block: Mapping[str, Any]) -> RolloutMockConfig:
    """Validate the ``rollout_mock:`` block itself (not the whole training config)."""
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"{BLOCK_KEY}: expected a mapping of options, got {type(block).__name__} {short_repr(block)}"
        )
    plain = {str(k): v for k, v in block.items()}
    try:
        return RolloutMockConfig(**plain)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, plain)) from None


def _to_plain(source: Any) -> Any:
    """OmegaConf containers and dataclasses to plain Python containers."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is optional
        DictConfig = None  # type: ignore[assignment,misc]
    if DictConfig is not None and isinstance(source, DictConfig):
        return OmegaConf.to_container(source, resolve=True)
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        return dataclasses.asdict(source)
    return source


def _has_interpolation(value: Any, seen: set[int] | None = None) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, (Mapping, list, tuple)):
        seen = set() if seen is None else seen
        if id(value) in seen:
            return False
        seen.add(id(value))
        items = value.values() if isinstance(value, Mapping) else value
        return any(_has_interpolation(item, seen) for item in items)
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return short_repr(text[0] if text else "", _MAX_MESSAGE).strip("'\"")


def _resolve_interpolations(root: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``root`` with the ``${...}`` values of its ``rollout_mock`` block (or of ``root`` itself,
    if it is the block) resolved by OmegaConf against the whole of ``root``. Without omegaconf,
    or when a value cannot be resolved: :class:`ConfigError` naming the key."""
    whole = BLOCK_KEY in root
    block = root[BLOCK_KEY] if whole else root
    if not isinstance(block, Mapping):
        return root
    keys = [key for key, value in block.items() if _has_interpolation(value)]
    if not keys:
        return root
    first = f"{BLOCK_KEY}.{keys[0]}"
    try:
        from omegaconf import OmegaConf
    except ImportError:
        raise ConfigError(
            f"{first}: {short_repr(block[keys[0]])} is a ${{...}} interpolation, and omegaconf is not "
            f"installed to resolve it; `pip install omegaconf` (or the verl extra), or write the "
            f"value out"
        ) from None
    try:
        config = OmegaConf.create(dict(root))
    except Exception:  # e.g. a value type OmegaConf does not support elsewhere in the file
        try:
            config = OmegaConf.create({BLOCK_KEY: dict(block)} if whole else dict(block))
        except Exception as exc:
            raise ConfigError(f"{first}: cannot resolve ${{...}} interpolations: {_first_line(exc)}") from None
    node = config[BLOCK_KEY] if whole else config
    resolved = dict(block)
    for key in keys:
        try:
            value = node[key]
            resolved[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception as exc:
            raise ConfigError(
                f"{BLOCK_KEY}.{key}: cannot resolve {short_repr(block[key])}: "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from None
    return {**root, BLOCK_KEY: resolved} if whole else resolved


def load_config(source: Any) -> RolloutMockConfig:
    """Build a :class:`RolloutMockConfig` from any of the forms users have at hand.

    ``source`` may be:

    * a :class:`RolloutMockConfig` (returned as is);
    * a path (``str`` or ``PathLike``) to a YAML file: either a whole training config holding a
      ``rollout_mock:`` key, or just the block. It is read with the bounded safe loader of
      :mod:`rollout_mock._yaml` (size, alias-expansion and nesting limits);
    * a mapping holding a ``rollout_mock`` key, or the block itself;
    * an OmegaConf ``DictConfig`` of either shape, or a dataclass (ROLL's ``RolloutMockConfig``
      or a pipeline config with a ``rollout_mock`` attribute).

    ``${...}`` interpolations in the block of a YAML file or plain mapping are resolved with
    OmegaConf (against the whole file) when omegaconf is installed, and are otherwise a
    :class:`ConfigError` naming the key; a ``DictConfig`` is resolved by OmegaConf itself.

    When a whole config is given and the block has no ``max_steps``, the top-level
    ``max_steps`` (ROLL's) is used for the mock-mode pre-flight check.
    """
    if isinstance(source, RolloutMockConfig):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        loaded = load_yaml_file(path, max_bytes=MAX_CONFIG_BYTES, max_nodes=MAX_YAML_NODES)
        if loaded is None:
            raise ConfigError(f"{path}: the file is empty; expected a '{BLOCK_KEY}:' block")
        try:
            return _from_object(loaded, interpolate=True)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return _from_object(source, interpolate=True)


def _from_object(source: Any, *, interpolate: bool) -> RolloutMockConfig:
    if isinstance(source, RolloutMockConfig):
        return source
    if _is_dictconfig(source):
        interpolate = False  # OmegaConf resolves its own interpolations in _to_plain
    source = _to_plain(source)
    if not isinstance(source, Mapping):
        block_attr = getattr(source, BLOCK_KEY, None)
        if block_attr is not None:
            return _from_object(block_attr, interpolate=interpolate)
        raise ConfigError(
            f"cannot read a {BLOCK_KEY} config from {type(source).__name__}; pass a YAML path, "
            f"a mapping, an OmegaConf DictConfig or a RolloutMockConfig"
        )
    if BLOCK_KEY in source:
        block = _to_plain(source[BLOCK_KEY])
        if block is None:
            block = {}
        if not isinstance(block, Mapping):
            raise ConfigError(f"{BLOCK_KEY}: expected a mapping of options, got {short_repr(block)}")
        source = {**source, BLOCK_KEY: dict(block)}
        if interpolate:
            source = _resolve_interpolations(source)
        block = dict(source[BLOCK_KEY])
        top_max_steps = source.get("max_steps")
        if "max_steps" not in block and isinstance(top_max_steps, int) and top_max_steps > 0:
            block["max_steps"] = top_max_steps
        return build_config(block)
    return build_config(_resolve_interpolations(source) if interpolate else source)


def _is_dictconfig(source: Any) -> bool:
    return type(source).__module__.startswith("omegaconf") and type(source).__name__ == "DictConfig"
