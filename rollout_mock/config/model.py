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

import difflib
import os
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout_mock.config.debug_settings import VerdictConfig, WatchdogConfig
from rollout_mock.config.policies import (
    CheckServes,
    DiskFullPolicy,
    FingerprintPolicy,
    MismatchPolicy,
    MissingStepPolicy,
    RankPolicy,
    ReplayRows,
    Tolerance,
)
from rollout_mock.errors import ConfigError
from rollout_mock.modes import Mode
from rollout_mock.text import logger, short_repr

__all__ = ["BLOCK_KEY", "MAX_ERROR_LINES", "RolloutMockConfig", "build_config"]

BLOCK_KEY = "rollout_mock"
#: Most problems listed in one :class:`ConfigError`.
MAX_ERROR_LINES = 20
_MAX_MESSAGE = 300

class RolloutMockConfig(BaseModel):
    """The ``rollout_mock:`` block. Build it with :func:`load_config` or directly.

    The model is frozen: a config cannot change behind a running scheduler's back.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    enable: bool = False
    """Master switch. ``false`` means no interception at all."""

    mode: Mode = Mode.DUMP
    """``dump`` records batches, ``mock`` replays them, ``check`` runs the real rollout, compares
    its batch with the recorded one and serves the recorded one (see ``check_serves``)."""

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

    device: str = "cpu"
    """Mock and check mode: where replayed tensors go. ``cpu`` (default); ``cuda`` (the current
    CUDA device of the calling thread) or ``cuda:N``: every tensor, read into pinned memory and
    copied while the step before trains; ``auto``: each tensor where it was recorded (CUDA tensors
    on their device, the rest on the CPU; without CUDA, the CPU with one warning). ``cuda`` without
    CUDA is a ConfigError when the replay starts."""

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

    on_missing_step: MissingStepPolicy = MissingStepPolicy.ERROR
    """Mock mode: a call for a step that is not recorded. ``error`` (default) raises
    StepNotFoundError; ``repeat_nearest`` serves the nearest recorded step (earlier first; verl's
    ``action: repeat``); ``record`` runs the real scheduler (an instance or ``factory`` must be
    given) and records the step into the dump. With ``repeat_nearest``/``record`` the
    ``max_steps`` pre-flight check only warns."""

    replay_rng: bool | None = None
    """Record the random number generator states (torch CPU and CUDA, numpy, Python ``random``)
    as a rollout call leaves them in dump mode, and restore them after serving that call in mock
    mode, so the training side sees the same random stream (needed for bit-identity when the
    rollout runs in the training process). ``null`` (auto): on where the rollout is known to run
    in-process (``wrap_trl``), off for other schedulers (Ray actors do not touch this process's
    generators); ``true``: on for every scheduler (a state is recorded only for calls that changed
    one, in a sibling stream ``{split}/rng``); ``false``: off. See :mod:`rollout_mock.wrap.rng`."""

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

    match_on: list[str] | None = None
    """Mock and check mode: what of a call must equal the dump run's call of that step before its
    recorded batch is served (request matching; a difference raises ReplayMismatchError).
    ``null`` (default): every argument except the step, tensors/arrays/DataProto/TensorDict by
    content, containers recursively, less the fields the framework adapters declare volatile
    (random uids, trace ids); a list of argument names or dotted paths inside them (``[prompts,
    data.batch.input_ids]``) compares only those; ``[step]`` compares nothing (the step alone picks
    the record). Dump mode records a digest of every call, unless ``[step]``."""

    on_mismatch: MismatchPolicy = MismatchPolicy.ERROR
    """Mock and check mode: a call that does not match its recorded call (see ``match_on``), or
    rollout settings that differ from the recorded ones: ``error`` (default) raises
    ReplayMismatchError before serving; ``warn`` logs the explanation and serves anyway."""

    check_serves: CheckServes = CheckServes.RECORDED
    """Check mode: serve the ``recorded`` batch (default: training stays on the recorded data) or
    the ``live`` one the real rollout just produced."""

    check_min_match: float | None = Field(default=None, ge=0, le=1)
    """Check mode: fail (CheckFailedError) at the first step whose match fraction is below this
    (token sequences: the fraction of equal tokens; otherwise the fraction of equal values), e.g.
    ``0.9`` as miles' ``--ci-inject-rollout-data-min-match-ratio``. ``null``: never fail."""

    check_tolerances: dict[str, Tolerance] | None = None
    """Check mode: ``{key pattern: {rtol, atol}}`` for floating-point keys (patterns are dotted
    paths with ``*`` wildcards, matched against the end of a key: ``logprobs``,
    ``batch.*log_prob*``). Keys without a pattern must be bit-identical."""

    @field_validator("mode", mode="before")
    @classmethod
    def _parse_mode(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return Mode(value)
            except ValueError:
                return value  # let pydantic report it with the valid choices
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _parse_device(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip().lower()
        if not re.fullmatch(r"cpu|cuda|auto|cuda:\d{1,4}", text):
            raise ValueError("must be cpu, cuda, cuda:N (a device index) or auto (where each tensor was recorded)")
        return text

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

    @field_validator("match_on")
    @classmethod
    def _check_match_on(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value or any(not isinstance(k, str) or not k.strip() for k in value):
            raise ValueError("must be a non-empty list of argument names or dotted paths (or [step])")
        if "step" in value and len(value) > 1:
            raise ValueError("'step' means 'match on the step alone': it cannot be combined with other names")
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
        config = RolloutMockConfig(**plain)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, plain)) from None
    _check_dump_dir_given(config)
    return config


_warned_default_dump_dir = False


def _check_dump_dir_given(config: RolloutMockConfig) -> None:
    """A block without ``dump_dir``: in mock mode a mistake (there is nothing to replay in a
    default folder nobody recorded into), so an error naming the fix; in dump mode the default
    is used and said once per process."""
    global _warned_default_dump_dir
    if not config.enable or "dump_dir" in config.model_fields_set:
        return
    default = RolloutMockConfig.model_fields["dump_dir"].default
    if config.mode.replays:
        raise ConfigError(
            f"{BLOCK_KEY}.dump_dir: missing in {config.mode.value} mode; set it to the dump_dir the dump-mode run "
            f"wrote, e.g. `dump_dir: ./dumps/baseline_v1`"
        )
    if not _warned_default_dump_dir:
        _warned_default_dump_dir = True
        logger.warning(
            "[RolloutMock] %s.dump_dir is not set: recording into %s (set dump_dir to choose where)",
            BLOCK_KEY, os.path.abspath(default))
