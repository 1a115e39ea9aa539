"""The parts of the ``rollout_mock:`` block each component uses, resolved once.

:class:`~rollout_mock.config.RolloutMockConfig` is the user's flat block (ROLL's keys load
unchanged). The components behind a wrapped scheduler each need a few of its keys, in a form
ready to use: the recorder the dump-mode keys (``dump_steps`` as a set, ``max_keep`` and ``keep``
merged into one :class:`KeepSettings`), the replayer the mock-mode
keys (``step_map``/``step_offset`` as one mapping), request matching its two keys, check mode
its three, the store its location and signing key (read from the environment once), the stream
its name and rank policy, the stall watchdog its limits, the random number hook one flag.
:func:`config_parts` builds them all at once, at the edge (where a scheduler is wrapped); the
interceptor hands each component its part only, so that what a component reads is written in
its constructor's signature and nothing reaches back into the whole config (no component holds it).

The parts are frozen dataclasses (plain values, no validation: the config was validated).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass

from rollout_mock.config.model import (
    CheckServes,
    DiskFullPolicy,
    FingerprintPolicy,
    KeepConfig,
    MetricRule,
    MismatchPolicy,
    MissingStepPolicy,
    RankPolicy,
    ReplayRows,
    RolloutMockConfig,
    Tolerance,
    VerdictAction,
    WatchdogConfig,
)
from rollout_mock.errors import ConfigError
from rollout_mock.modes import Mode
from rollout_mock.storage.store import StoreSettings

__all__ = [
    "CheckSettings", "ConfigParts", "KeepSettings", "MatchSettings", "RecordSettings", "ReplaySettings",
    "StoreSettings", "StreamSettings", "WatchdogSettings", "config_parts", "hmac_key",
]


def hmac_key(config: RolloutMockConfig) -> bytes | None:
    """The signing key named by ``hmac_key_env`` (``None`` without one); a ConfigError when the
    variable is named but unset or empty."""
    if config.hmac_key_env is None:
        return None
    value = os.environ.get(config.hmac_key_env)
    if not value:
        raise ConfigError(
            f"rollout_mock.hmac_key_env: environment variable {config.hmac_key_env!r} is not set "
            f"or empty; export the signing key in it, or remove hmac_key_env from the config"
        )
    return value.encode("utf-8")


@dataclass(frozen=True)
class StreamSettings:
    """Which stream of the dump a wrapped scheduler reads and writes (``name``, ``ranks``, ``dump_rank``)."""

    #: the scheduler's namespace in the dump (``None``: none); a wrapper's own name overrides it
    name: str | None
    #: ``ranks: all``: each rank writes and replays files of its own
    per_rank: bool
    #: ``ranks: one``: the rank that writes
    dump_rank: int

    def writes(self, rank: int | None) -> bool:
        """Whether a process of rank ``rank`` writes in dump mode (``None``: no process group)."""
        return (self.per_rank and rank is not None) or rank is None or rank == self.dump_rank


#: What ``keep.metrics`` says of a metric it does not name: an anomaly when NaN or inf.
_DEFAULT_RULE = MetricRule()


@dataclass(frozen=True)
class KeepSettings:
    """Dump mode's retention: ``keep`` with ``max_keep`` (its shorthand) merged in."""

    #: the ring's size in steps (``None``: no bound in steps)
    last: int | None
    #: the ring's size in bytes (``None``: no bound in bytes)
    max_bytes: int | None
    before: int
    after: int
    #: scan recorded batches for NaN/inf
    nonfinite: bool
    #: ``(name or glob pattern, rule)``, in the config's order
    metrics: tuple[tuple[str, MetricRule], ...]
    max_anomalies: int

    @property
    def ring(self) -> bool:
        """Whether old steps are ever deleted."""
        return self.last is not None or self.max_bytes is not None

    def rule(self, metric: str) -> MetricRule:
        """The rule of ``metric``: its exact name, else the first matching pattern, else NaN/inf only."""
        for pattern, rule in self.metrics:
            if pattern == metric:
                return rule
        for pattern, rule in self.metrics:
            if fnmatch.fnmatchcase(metric, pattern):
                return rule
        return _DEFAULT_RULE

    def describe(self) -> str:
        """The settings as the config spells them (for log lines)."""
        parts = [f"last={self.last}"] if self.last is not None else []
        parts += [f"max_bytes={self.max_bytes}"] if self.max_bytes is not None else []
        return ", ".join([*parts, f"before={self.before}", f"after={self.after}"])


def keep_settings(config: RolloutMockConfig) -> KeepSettings | None:
    """``keep`` with ``max_keep`` merged in (``None``: neither is set: nothing deleted or scanned)."""
    keep = config.keep
    if keep is None and config.max_keep is None:
        return None
    if keep is None:
        return KeepSettings(last=config.max_keep, max_bytes=None, before=0, after=0, nonfinite=True, metrics=(),
                            max_anomalies=KeepConfig().max_anomalies)
    return KeepSettings(
        last=keep.last if keep.last is not None else config.max_keep,
        max_bytes=None if keep.max_bytes is None else int(keep.max_bytes), before=keep.before, after=keep.after,
        nonfinite=keep.nonfinite, metrics=tuple(keep.metrics.items()), max_anomalies=keep.max_anomalies,
    )


@dataclass(frozen=True)
class RecordSettings:
    """Dump mode: which steps are written and how, and which are kept."""

    dump_dir: str
    dump_steps: frozenset[int] | None
    overwrite: bool
    background: bool
    max_pending: int
    #: ``None``: every step is kept and nothing is scanned
    keep: KeepSettings | None
    pin_steps: frozenset[int]
    on_disk_full: DiskFullPolicy
    max_steps: int | None
    #: ``none``, ``zstd`` or ``lz4`` (the step files' chunks)
    compression: str = "none"

    def records_step(self, step: int) -> bool:
        """Whether ``dump_steps`` lets ``step`` be written (all steps without it)."""
        return self.dump_steps is None or step in self.dump_steps

    def steps_after(self, step: int) -> int | None:
        """How many more steps this run will write after ``step`` (``None``: unknown)."""
        if self.dump_steps is not None:
            return len([s for s in self.dump_steps if s > step])
        if self.max_steps is not None:
            return max(self.max_steps - step - 1, 0)
        return None


@dataclass(frozen=True)
class ReplaySettings:
    """Mock and check mode: which recorded step serves a run step, and how it is loaded."""

    mode: Mode
    dump_dir: str
    max_steps: int | None
    on_missing_step: MissingStepPolicy
    step_offset: int
    step_map: Mapping[int, int]
    replay_rows: ReplayRows | None
    replay_keys: tuple[str, ...] | None
    subsample: float | None
    trust_pickle: bool
    prefetch: bool
    fingerprint: FingerprintPolicy
    #: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (validated by the config)
    device: str = "cpu"
    #: ``verdict.action``: named in the start-up line about the dump run's metrics
    verdict: VerdictAction = VerdictAction.OFF

    def dump_step(self, run_step: int) -> int:
        """The recorded step run step ``run_step`` replays (``step_map``, else ``step_offset``)."""
        mapped = self.step_map.get(run_step)
        return run_step + self.step_offset if mapped is None else mapped

    @property
    def shifted(self) -> bool:
        """Whether run steps and dump steps differ (``step_offset`` or ``step_map`` set)."""
        return bool(self.step_offset or self.step_map)


@dataclass(frozen=True)
class MatchSettings:
    """Request matching (``match_on``, ``on_mismatch``)."""

    match_on: tuple[str, ...] | None
    policy: MismatchPolicy

    @property
    def enabled(self) -> bool:
        """False with ``match_on: [step]``: nothing is digested, recorded or compared."""
        return self.match_on != ("step",)


@dataclass(frozen=True)
class CheckSettings:
    """Check mode (``check_serves``, ``check_min_match``, ``check_tolerances``, ``check_sample_key``)."""

    serves: CheckServes
    min_match: float | None
    tolerances: tuple[tuple[str, Tolerance], ...]
    sample_key: str | None = None

    def tolerance(self, key: str) -> Tolerance | None:
        """The tolerance of the first pattern matching the end of dotted ``key``, if any."""
        parts = key.split(".")
        for pattern, tolerance in self.tolerances:
            want = pattern.split(".")
            if len(want) <= len(parts) and all(
                fnmatch.fnmatchcase(p, w) for p, w in zip(parts[-len(want):], want)
            ):
                return tolerance
        return None


@dataclass(frozen=True)
class WatchdogSettings:
    """The stall watchdog's limits (the ``watchdog`` block less ``enable``: a disabled watchdog
    gets no part, see :attr:`ConfigParts.watchdog`)."""

    factor: float
    min_seconds: float
    absolute_seconds: float | None
    #: how many recent durations the running median is taken over
    history: int

    @classmethod
    def of(cls, block: WatchdogConfig) -> WatchdogSettings:
        """The limits of a ``watchdog`` block (its defaults are the config's)."""
        return cls(block.factor, block.min_seconds, block.absolute_seconds, block.history)


@dataclass(frozen=True)
class ConfigParts:
    """Every part, built once by :func:`config_parts` (see the module docstring)."""

    mode: Mode
    store: StoreSettings
    stream: StreamSettings
    record: RecordSettings
    replay: ReplaySettings
    match: MatchSettings
    check: CheckSettings
    #: ``None``: ``watchdog: {enable: false}``
    watchdog: WatchdogSettings | None
    #: ``replay_rng: true``: generator states recorded/restored around every call
    replay_rng: bool
    #: the start-up note about the dump run's metrics says whether they are compared
    verdict: VerdictAction


def config_parts(config: RolloutMockConfig) -> ConfigParts:
    """Resolve ``config`` into the parts its components use (reads ``hmac_key_env`` now)."""
    return ConfigParts(
        mode=config.mode,
        store=StoreSettings(config.dump_dir, config.storage_options, hmac_key(config), config.verify_checksum),
        stream=StreamSettings(config.name, config.ranks is RankPolicy.ALL, config.dump_rank),
        record=RecordSettings(
            dump_dir=config.dump_dir,
            dump_steps=None if config.dump_steps is None else frozenset(config.dump_steps),
            overwrite=config.overwrite, background=config.background, max_pending=config.max_pending,
            keep=keep_settings(config), pin_steps=frozenset(config.pin_steps or ()),
            on_disk_full=config.on_disk_full, max_steps=config.max_steps, compression=config.compression.value,
        ),
        replay=ReplaySettings(
            mode=config.mode, dump_dir=config.dump_dir, max_steps=config.max_steps,
            on_missing_step=config.on_missing_step, step_offset=config.step_offset,
            step_map=dict(config.step_map or {}), replay_rows=config.replay_rows,
            replay_keys=None if config.replay_keys is None else tuple(config.replay_keys),
            subsample=config.subsample, trust_pickle=config.trust_pickle, prefetch=config.prefetch,
            fingerprint=config.fingerprint, device=config.device, verdict=config.verdict.action,
        ),
        match=MatchSettings(None if config.match_on is None else tuple(config.match_on), config.on_mismatch),
        check=CheckSettings(config.check_serves, config.check_min_match,
                            tuple((config.check_tolerances or {}).items()), config.check_sample_key),
        watchdog=WatchdogSettings.of(config.watchdog) if config.watchdog.enable else None,
        replay_rng=config.replay_rng is True,
        verdict=config.verdict.action,
    )
