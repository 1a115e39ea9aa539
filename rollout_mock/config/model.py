"""The ``rollout_mock:`` configuration block: the pydantic model, its choices (``str`` enums: a typo
lists the valid values) and its sub-blocks.

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

The sub-blocks ``watchdog:``, ``verdict:`` and ``keep:`` are optional; a plain value is shorthand
(``verdict: fail``, ``watchdog: false``, a metric
rule ``loss: 6``)::

    rollout_mock:
      verdict: {action: warn, rtol: {pg_loss: 1.0e-6}, atol: 0.0}
      watchdog: {enable: true, factor: 10, min_seconds: 60, absolute_seconds: 3600}
      keep: {last: 50, max_bytes: 20GB, before: 5, after: 5, metrics: {loss: {z: 6}, "*": {z: 8}}}
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rollout_mock.errors import ConfigError
from rollout_mock.modes import Mode
from rollout_mock.text import logger, short_repr

__all__ = [
    "BLOCK_KEY", "MAX_ERROR_LINES", "CheckServes", "Compression", "DiskFullPolicy", "FingerprintPolicy",
    "KeepConfig", "MetricRule", "MismatchPolicy", "MissingStepPolicy", "RankPolicy", "ReplayRows", "RolloutMockConfig",
    "Tolerance", "VerdictAction", "VerdictConfig", "WatchdogConfig", "build_config",
]

BLOCK_KEY = "rollout_mock"
#: Most problems listed in one :class:`ConfigError`.
MAX_ERROR_LINES = 20
_MAX_MESSAGE = 300

# --------------------------------------------------------------------------- the choices
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


class MismatchPolicy(str, Enum):
    """What mock (and check) mode does when a call asks for other data than the recorded call."""

    ERROR = "error"
    """Raise :class:`~rollout_mock.errors.ReplayMismatchError` before serving the step (default)."""

    WARN = "warn"
    """Log the same explanation as a warning (once per method) and serve the recorded step."""


class CheckServes(str, Enum):
    """Check mode: which of the two batches of a step the caller gets."""

    RECORDED = "recorded"
    """The recorded batch (default): training stays on the recorded data."""

    LIVE = "live"
    """The batch the real rollout just produced."""


class RankPolicy(str, Enum):
    """Which torch.distributed ranks write in dump mode."""

    ONE = "one"
    """Only ``dump_rank`` writes (default): every rank sees the same batch."""

    ALL = "all"
    """Every rank writes its own file ``step_NNNNNN_rankR.pkl`` (per data-parallel head batches)."""


class Compression(str, Enum):
    """Dump mode: how each step file's data chunks are stored (replay reads any of them)."""

    NONE = "none"
    """Raw (default): the fastest to write and to read."""

    ZSTD = "zstd"
    """zstandard, level 3 (the ``compress`` extra): for text-heavy or repetitive batches."""

    LZ4 = "lz4"
    """LZ4 (the ``compress`` extra): faster than zstd, smaller gains."""


class ReplayRows(BaseModel):
    """Mock mode: this process is data-parallel rank ``dp_rank`` of ``dp_size`` and replays only
    its rows of each recorded batch (split like ``torch.chunk`` / verl's ``DataProto.chunk``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp_rank: int = Field(ge=0)
    dp_size: int = Field(ge=1)

    def model_post_init(self, __context: Any) -> None:
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} must be below dp_size {self.dp_size}")


class Tolerance(BaseModel):
    """Check mode: how close two floating-point values of a key must be to count as equal
    (``|live - recorded| <= atol + rtol * |recorded|``, NaN equal to NaN)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rtol: float = Field(default=0.0, ge=0, allow_inf_nan=False, strict=False)
    atol: float = Field(default=0.0, ge=0, allow_inf_nan=False, strict=False)

    @field_validator("rtol", "atol", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        """A number (not a bool), finite: ``inf * |0.0|`` is NaN, so an infinite tolerance would
        make equal values differ."""
        if isinstance(value, bool):
            raise ValueError(f"expected a finite number >= 0, got {value!r}")
        return value


# --------------------------------------------------------------------------- sub-blocks
# The ``watchdog:``, ``verdict:`` and ``keep:`` sub-blocks.
class VerdictAction(str, Enum):
    """What mock mode does when a logged metric differs from the value the dump run logged."""

    WARN = "warn"
    """Log the first divergence (step, metric, both values) as a warning; training goes on."""

    FAIL = "fail"
    """Raise :class:`~rollout_mock.errors.MetricsDivergenceError` from ``MetricsWriter.log``."""

    OFF = "off"
    """Do not compare (dump mode still records the expected values)."""


def _tolerances(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"default": float(value)}
    return value


class VerdictConfig(BaseModel):
    """On-line comparison of a replaying run's metrics with the values the dump run logged.

    ``rtol``/``atol``: a number for every metric, or ``{metric: tol, "default": tol}``. Both 0
    (the default) means bitwise equality, as ``rollout-mock verify``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: VerdictAction = VerdictAction.WARN
    rtol: dict[str, float] = Field(default_factory=lambda: {"default": 0.0})
    atol: dict[str, float] = Field(default_factory=lambda: {"default": 0.0})

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str | VerdictAction):
            return {"action": value}
        if isinstance(value, bool):
            return {"action": "warn" if value else "off"}
        return value

    @field_validator("rtol", "atol", mode="before")
    @classmethod
    def _parse_tol(cls, value: Any) -> Any:
        return _tolerances(value)

    @field_validator("rtol", "atol")
    @classmethod
    def _check_tol(cls, value: dict[str, float]) -> dict[str, float]:
        for name, tol in value.items():
            if not (tol >= 0.0) or tol == float("inf"):
                raise ValueError(f"tolerance of {name!r} must be a finite number >= 0, got {tol!r}")
        return value

    def tolerance(self, metric: str) -> tuple[float, float]:
        """``(rtol, atol)`` of one metric."""
        return (
            self.rtol.get(metric, self.rtol.get("default", 0.0)),
            self.atol.get(metric, self.atol.get("default", 0.0)),
        )


class WatchdogConfig(BaseModel):
    """Stall detection around intercepted calls (see :mod:`rollout_mock.wrap.watchdog`).

    A call (or the time between two calls) is a stall when it lasts longer than
    ``max(min_seconds, factor * median of the recent durations of the same kind)``, or longer than
    ``absolute_seconds`` whatever the history. Before any history exists only
    ``absolute_seconds`` applies.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable: bool = True
    factor: float = Field(default=10.0, gt=1.0)
    min_seconds: float = Field(default=60.0, ge=0.0)
    absolute_seconds: float | None = Field(default=3600.0, gt=0.0)
    history: int = Field(default=20, ge=1)
    """How many recent durations the running median is taken over."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"enable": value}
        return value


#: Most steps an anomaly window may reach on either side, and most values a metric window holds.
MAX_WINDOW = 10_000


class MetricRule(BaseModel):
    """When a metric's value is an anomaly (the ``keep.metrics`` block; a number is shorthand for
    ``{z: number}``).

    A value is an anomaly when it is NaN or ±inf (``nonfinite``), or when it lies more than ``z``
    robust deviations from the median of the metric's last ``window`` finite values: ``|x -
    median| / (1.4826 * MAD) > z`` (MAD: the median absolute deviation; where it is 0, the mean
    absolute deviation × 1.2533 instead; where that is 0 too, every value of the window is the
    same and no value is flagged). Nothing is flagged as a spike before the window holds
    ``warmup`` values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    z: float | None = Field(default=None, gt=0)
    """Robust deviations from the window's median beyond which a value is a spike; ``null``: only
    NaN/inf (with ``nonfinite``)."""

    window: int = Field(default=50, ge=3, le=MAX_WINDOW)
    """How many recent finite values the median and MAD are taken over."""

    warmup: int = Field(default=10, ge=3, le=MAX_WINDOW)
    """Values the window must hold before a spike can be flagged (at most ``window``)."""

    nonfinite: bool = True
    """A NaN or ±inf value is an anomaly."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {"z": value}
        return value

    @model_validator(mode="after")
    def _warmup_in_window(self) -> MetricRule:
        if self.warmup > self.window:
            raise ValueError(f"warmup ({self.warmup}) must be at most window ({self.window})")
        return self


class KeepConfig(BaseModel):
    """Dump mode's flight recorder: which recorded steps are kept (see ``docs/debugging.md``).

    The newest ``last`` steps (the ring, also bounded by ``max_bytes``), plus every pinned step
    and the steps around an anomaly (``before`` steps before it, ``after`` after it, by step
    number). Anomalies: NaN/inf in a recorded batch (``nonfinite``), a metric given to
    ``MockScheduler.observe`` (or a ``MetricsWriter(..., expected=scheduler)``) that ``metrics``
    flags, an explicit ``MockScheduler.pin(step, reason)``. ``max_keep: N`` is shorthand for
    ``keep: {last: N}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    last: int | None = Field(default=None, ge=1)
    """Size of the ring: the newest recorded steps kept whatever happens; older steps are deleted
    unless pinned or in an anomaly window. ``null``: no ring, every step is kept (anomalies are
    still detected and their reasons written in the index)."""

    max_bytes: ByteSize | None = None
    """The ring's bound in bytes (``20GB``, ``512MiB`` or a number): the oldest ring steps go
    while the ring holds more, the newest step always stays. Pinned and window steps are not
    counted (``max_anomalies`` bounds them)."""

    before: int = Field(default=0, ge=0, le=MAX_WINDOW)
    """Steps before an anomaly that are kept (must be below ``last``: the ring must still hold
    them when the anomaly is detected)."""

    after: int = Field(default=0, ge=0, le=MAX_WINDOW)
    """Steps after an anomaly that are kept, as they are recorded."""

    nonfinite: bool = True
    """Scan each recorded batch for NaN/inf (on the writer thread, after the copy is taken)."""

    metrics: dict[str, MetricRule] = Field(default_factory=dict)
    """``{metric name or glob pattern: rule}`` (exact names first, then the patterns in order;
    ``"*"`` matches every metric). Without a rule a metric is an anomaly only when NaN or inf."""

    max_anomalies: int = Field(default=16, ge=0)
    """Detected anomalies (batch or metric) kept with their windows; later ones are only logged,
    so a run that stays NaN does not keep every step. Explicit pins are always kept."""

    @field_validator("max_bytes")
    @classmethod
    def _positive_bytes(cls, value: ByteSize | None) -> ByteSize | None:
        if value is not None and value < 1:
            raise ValueError("must be at least 1 byte")
        return value

    @model_validator(mode="after")
    def _ring_holds_the_window(self) -> KeepConfig:
        if self.last is not None and self.before >= self.last:
            raise ValueError(
                f"before ({self.before}) must be below last ({self.last}): the ring must still hold the "
                f"steps before an anomaly when it is detected; raise last to at least {self.before + 1}")
        return self


# --------------------------------------------------------------------------- the block
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
    deleted after each new step), except ``pin_steps``. ``None`` keeps everything. Shorthand for
    ``keep: {last: max_keep}`` (both may be given only with the same value)."""

    pin_steps: list[int] | None = None
    """Dump mode: steps that are never deleted (e.g. the first, or a step with a known bug); the
    index marks them pinned (reason ``pin_steps``)."""

    keep: KeepConfig | None = None
    """Dump mode's flight recorder: a ring of the newest steps (``last``, ``max_bytes``) plus the
    steps around anomalies (``before``, ``after``): NaN/inf in a recorded batch, a metric given to
    ``MockScheduler.observe`` that is NaN/inf or jumps (``metrics: {loss: {z: 6, window: 50}}``),
    an explicit ``MockScheduler.pin(step, reason)``. Kept steps carry their reason in the index
    (``rollout-mock ls``). ``null`` (and no ``max_keep``): every step is kept, nothing is
    scanned."""

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

    compression: Compression = Compression.NONE
    """Dump mode: compress each step file's data chunks with ``zstd`` or ``lz4`` (``pip install
    'rollout_mock[compress]'``; checked when the dump starts). Each chunk is stored compressed
    only when that saves at least 10% (byte-shuffled first when that compresses better), so
    random floats stay raw; CRC-32 and HMAC cover the stored bytes. Replay needs no setting (the
    package, where a file uses it). ``rollout-mock ls`` shows it per step."""

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
    (random uids, trace ids); a list of matcher names, argument names or dotted paths inside them
    (``[prompts, data.batch.input_ids, data.a.b.c.d.e]``) compares only those: a name registered
    with ``rollout_mock.register_matcher`` runs that matcher over the recorded and the live call,
    any other entry is a path; ``[step]`` compares nothing (the step alone picks the record),
    ``[request]`` the whole call. Dump mode records a digest of every call and its structure
    (bounded), unless ``[step]``."""

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

    check_sample_key: str | None = None
    """Check mode: the key whose value identifies a sample (a request id: ``request_id``,
    ``non_tensor_batch.index``; the end of a dotted key, as ``check_tolerances``). Live and
    recorded samples are paired by it, whatever order they come back in. ``null`` (default): by a
    hash of the prompt tokens (``prompts``, ``prompt_ids``, ``prompt_tokens``, ``prompt``), samples
    of one prompt by their longest common response prefix; by position when there is no prompt."""

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

    @field_validator("check_sample_key")
    @classmethod
    def _check_sample_key(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip(".").strip() or ".." in value):
            raise ValueError("must be a key name or dotted path, e.g. request_id or non_tensor_batch.index")
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
            raise ValueError("must be a non-empty list of matcher names, argument names or dotted paths (or [step])")
        if "step" in value and len(value) > 1:
            raise ValueError("'step' means 'match on the step alone': it cannot be combined with other names")
        return value

    @field_validator("keep")
    @classmethod
    def _check_keep(cls, value: KeepConfig | None, info: ValidationInfo) -> KeepConfig | None:
        max_keep = info.data.get("max_keep")
        if value is None or max_keep is None:
            return value
        if value.last is not None and value.last != max_keep:
            raise ValueError(f"last ({value.last}) contradicts max_keep ({max_keep}), its shorthand; "
                             f"give one of them")
        if value.before >= max_keep:
            raise ValueError(f"before ({value.before}) must be below the ring's size (max_keep: {max_keep}): the "
                             f"ring must still hold the steps before an anomaly when it is detected; raise "
                             f"max_keep to at least {value.before + 1}")
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


def _sub_block_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys of the sub-block at ``loc`` (``("keep",)``, ``("keep", "metrics", "loss")``), or
    ``[]`` where ``loc`` does not lead to a model."""
    model: Any = RolloutMockConfig
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if fields is None:
            return []
        if part not in fields:  # a mapping's key (keep.metrics.<name>): stay on its value type
            continue
        annotation = fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        values = [a for c in candidates for a in getattr(c, "__args__", ())[1:]
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models and not values:
            return []
        model = models[0] if models else values[0]
    fields = getattr(model, "model_fields", None)
    return list(fields) if fields is not None and model is not RolloutMockConfig else []


def _format_errors(error: ValidationError, block: Mapping[str, Any]) -> str:
    valid_keys = list(RolloutMockConfig.model_fields)
    lines: list[str] = []
    items = error.errors()
    for item in items[:MAX_ERROR_LINES]:
        loc = item.get("loc", ())
        raw_key = str(loc[0]) if loc else "?"
        key = raw_key if len(raw_key) <= 80 else short_repr(raw_key, 80)
        value = short_repr(block.get(raw_key, item.get("input")))
        if item.get("type") == "extra_forbidden" and len(loc) > 1:  # inside a sub-block (keep: {lats: 5})
            inner_keys = _sub_block_keys(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1])[:80], inner_keys, n=1)
            lines.append(
                f"{BLOCK_KEY}.{key}: unknown key {short_repr(loc[-1], 80)} in {'.'.join(map(str, loc[:-1]))[:120]}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + (f"; valid keys: {', '.join(inner_keys)}" if inner_keys else "")
            )
            continue
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
        inner = ".".join(str(part) for part in loc[1:])[:80]
        if inner:  # a key inside a sub-block (keep.last): name it
            message = f"{inner}: {message}"
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
