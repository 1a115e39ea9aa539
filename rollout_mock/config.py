"""The ``rollout_mock:`` configuration block.

ROLL's block (``enable``, ``mode``, ``dump_dir``) loads unchanged; every other key is optional and
has a default that keeps ROLL's behaviour where ROLL's behaviour is safe. Unknown keys and bad
values are errors that name the key, the value and the valid choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout_mock.errors import ConfigError
from rollout_mock.modes import Mode

BLOCK_KEY = "rollout_mock"


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


class MissingStepPolicy(str, Enum):
    """What mock mode does when a call asks for a step the dump does not hold."""

    ERROR = "error"
    """Raise :class:`~rollout_mock.errors.StepNotFoundError` listing the recorded steps (default)."""

    REPEAT_NEAREST = "repeat_nearest"
    """Serve the nearest recorded step instead (the closest earlier one, else the closest later
    one: verl's ``action: repeat``), with a warning naming both steps."""

    RECORD = "record"
    """Run the real scheduler for that step and record it into the dump (needs the real
    scheduler: an instance or a ``factory``; ``mock_class`` runs the class's ``__init__`` then)."""


class RankPolicy(str, Enum):
    """Which torch.distributed ranks write in dump mode."""

    ONE = "one"
    """Only ``dump_rank`` writes (default): every rank sees the same batch."""

    ALL = "all"
    """Every rank writes its own file ``step_NNNNNN_rankR.pkl`` (per data-parallel head batches)."""


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
    """Directory holding ``manifest.json`` and ``{split}/step_{step:06d}.pkl``."""

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

    fingerprint: FingerprintPolicy = FingerprintPolicy.WARN
    """Mock mode: how to react when this environment differs from the recorded one."""

    on_disk_full: DiskFullPolicy = DiskFullPolicy.FAIL

    on_missing_step: MissingStepPolicy = MissingStepPolicy.ERROR
    """Mock mode: a call for a step that is not recorded. ``error`` (default) raises
    StepNotFoundError; ``repeat_nearest`` serves the nearest recorded step (earlier first; verl's
    ``action: repeat``); ``record`` runs the real scheduler (an instance or ``factory`` must be
    given) and records the step into the dump. With ``repeat_nearest``/``record`` the
    ``max_steps`` pre-flight check only warns."""

    subsample: float | None = Field(default=None, gt=0, le=1)
    """Mock mode: serve only this fraction of each replayed batch (slime's
    ``--load-debug-rollout-data-subsample``). Deterministic: of ``n`` rows (samples; list items
    for AReaL/slime) ``k = max(1, int(n * subsample))`` are kept, the first ``k // 2`` and the last
    ``k - k // 2``, as slime does. ``None`` serves whole batches."""

    step_offset: int = 0
    """Mock mode: run step ``M`` replays dump step ``M + step_offset``, e.g. ``-100`` for a run
    resumed at step 100 that replays a dump recorded from step 0. Steps in ``step_map`` win."""

    step_map: dict[int, int] | None = None
    """Mock mode: explicit ``{run_step: dump_step}`` pairs (e.g. ``{0: 30}`` to start a run on the
    dump's step 30); other steps use ``step_offset``."""

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

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None:
            if not value or any(ch in value for ch in "/\\@") or value.startswith("."):
                raise ValueError("must be a non-empty name without '/', '\\', '@' or a leading '.'")
        return value

    @field_validator("step_map")
    @classmethod
    def _check_step_map(cls, value: dict[int, int] | None) -> dict[int, int] | None:
        if value is not None and any(dump_step < 0 for dump_step in value.values()):
            raise ValueError("dump steps must be >= 0")
        return value

    def dump_step(self, run_step: int) -> int:
        """The recorded step that run step ``run_step`` replays (``step_map``, else ``step_offset``)."""
        if self.step_map is not None and run_step in self.step_map:
            return self.step_map[run_step]
        return run_step + self.step_offset

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
    for item in error.errors():
        loc = item.get("loc", ())
        key = str(loc[0]) if loc else "?"
        value = block.get(key, item.get("input"))
        if item.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(key, valid_keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(
                f"{BLOCK_KEY}.{key}: unknown key (value {value!r}){hint}; "
                f"valid keys: {', '.join(valid_keys)}"
            )
            continue
        choices = _choices_for(key) if key in RolloutMockConfig.model_fields else None
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        line = f"{BLOCK_KEY}.{key}: invalid value {value!r}: {message}"
        if choices:
            line += f"; valid choices: {', '.join(choices)}"
        lines.append(line)
    return "\n".join(lines)


def build_config(block: Mapping[str, Any]) -> RolloutMockConfig:
    """Validate the ``rollout_mock:`` block itself (not the whole training config)."""
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"{BLOCK_KEY}: expected a mapping of options, got {type(block).__name__} {block!r}"
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


def load_config(source: Any) -> RolloutMockConfig:
    """Build a :class:`RolloutMockConfig` from any of the forms users have at hand.

    ``source`` may be:

    * a :class:`RolloutMockConfig` (returned as is);
    * a path (``str`` or ``PathLike``) to a YAML file: either a whole training config holding a
      ``rollout_mock:`` key, or just the block;
    * a mapping holding a ``rollout_mock`` key, or the block itself;
    * an OmegaConf ``DictConfig`` of either shape, or a dataclass (ROLL's ``RolloutMockConfig``
      or a pipeline config with a ``rollout_mock`` attribute).

    When a whole config is given and the block has no ``max_steps``, the top-level
    ``max_steps`` (ROLL's) is used for the mock-mode pre-flight check.
    """
    if isinstance(source, RolloutMockConfig):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if loaded is None:
            raise ConfigError(f"{path}: the file is empty; expected a '{BLOCK_KEY}:' block")
        try:
            return load_config(loaded)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    source = _to_plain(source)
    if not isinstance(source, Mapping):
        block_attr = getattr(source, BLOCK_KEY, None)
        if block_attr is not None:
            return load_config(block_attr)
        raise ConfigError(
            f"cannot read a {BLOCK_KEY} config from {type(source).__name__}; pass a YAML path, "
            f"a mapping, an OmegaConf DictConfig or a RolloutMockConfig"
        )
    if BLOCK_KEY in source:
        block = _to_plain(source[BLOCK_KEY])
        if block is None:
            block = {}
        if not isinstance(block, Mapping):
            raise ConfigError(f"{BLOCK_KEY}: expected a mapping of options, got {block!r}")
        block = dict(block)
        top_max_steps = source.get("max_steps")
        if "max_steps" not in block and isinstance(top_max_steps, int) and top_max_steps > 0:
            block["max_steps"] = top_max_steps
        return build_config(block)
    return build_config(source)
