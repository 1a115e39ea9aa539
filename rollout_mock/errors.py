"""Errors raised by rollout_mock.

Every error carries the context a user needs to act on it as attributes (``mode``, ``split``,
``step``, ``path``) and says the likely fix in its message. Errors that mean "a file is not there"
also subclass :class:`FileNotFoundError` so that code written for ROLL's behaviour keeps working.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BisectError",
    "BundleError",
    "ConfigError",
    "CheckFailedError",
    "CorruptStepError",
    "DebugInputError",
    "DeterminismError",
    "DiffInputError",
    "DiskFullError",
    "DumpNotFoundError",
    "DumpNotWritableError",
    "FingerprintMismatchError",
    "ForeignDumpError",
    "FormatVersionError",
    "IncompleteDumpError",
    "InvalidMetricError",
    "LockedError",
    "ManifestError",
    "MetricsDivergenceError",
    "MetricsError",
    "MetricsFormatError",
    "MetricsNotFoundError",
    "MetricsWarning",
    "MissingExtraError",
    "ReplayMismatchError",
    "RolloutMockError",
    "RolloutSettingsMismatchError",
    "SchedulerUnavailableError",
    "StepArgumentError",
    "StepExistsError",
    "StepNotFoundError",
    "StreamNotFoundError",
    "TraceError",
    "UnsafePathError",
    "UnrecordableBatchError",
    "UnsafePickleError",
    "VerifyInputError",
    "WriterError",
]


class RolloutMockError(Exception):
    """Base class of every error raised by rollout_mock.

    Attributes are ``None`` when they do not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        mode: str | None = None,
        split: str | None = None,
        step: int | None = None,
        path: str | Path | None = None,
    ) -> None:
        super().__init__(message)
        self.mode = mode
        self.split = split
        self.step = step
        self.path = None if path is None else str(path)


class ConfigError(RolloutMockError, ValueError):
    """The ``rollout_mock:`` configuration is invalid (one line per problem: key, value, choices)."""


class StepNotFoundError(RolloutMockError, FileNotFoundError):
    """Mock mode asked for a step that was never recorded."""


class StreamNotFoundError(StepNotFoundError, ConfigError):
    """Mock mode on a dump that holds no step of the scheduler's split (or stream name); the
    message names the splits that are there. A :class:`ConfigError` too (the wrong ``split``)."""


class DumpNotFoundError(RolloutMockError, FileNotFoundError):
    """The dump directory or its ``manifest.json`` does not exist."""


class DumpNotWritableError(RolloutMockError, PermissionError):
    """The dump location refuses writes: a read-only file system, a directory without write
    permission, an object store that denies access or a bucket that does not exist. ``errno``,
    ``strerror`` and ``filename`` are the refusal's."""


class IncompleteDumpError(RolloutMockError):
    """Pre-flight check: steps that the run will need are missing from the dump."""


class StepExistsError(RolloutMockError, FileExistsError):
    """Dump mode refused to overwrite a step that is already recorded."""


class CorruptStepError(RolloutMockError):
    """A step file does not match its manifest entry (checksum, size) or cannot be decoded."""


class ManifestError(RolloutMockError):
    """``manifest.json`` is unreadable, truncated, edited inconsistently or of an unknown format."""


class FormatVersionError(ManifestError):
    """The dump was written by a newer (or unknown) on-disk format version."""


class BundleError(ManifestError):
    """A bundle file (``.rmb``, written by ``rollout-mock pack``) is not one, is truncated, forged
    (a table of contents with impossible offsets, sizes or names) or damaged (a member that fails
    its SHA-256), or of a newer bundle format version; the message names the file and the member."""


class UnsafePickleError(RolloutMockError):
    """A step file references a global that the safe loader does not allow."""


class WriterError(RolloutMockError):
    """The background writer failed; the original exception is chained as ``__cause__``."""


class StepArgumentError(RolloutMockError, ValueError):
    """An intercepted call carries a step argument that is not a non-negative integer.

    ``method`` is the intercepted method, ``argument`` where the step was found (e.g.
    ``global_step``, ``meta_info['global_steps']``, ``rollout_id``) and ``value`` a short repr
    of what was passed.
    """

    def __init__(self, message: str, *, method: str | None, argument: str, value: str, **context: Any) -> None:
        super().__init__(message, **context)
        self.method = method
        self.argument = argument
        self.value = value


class LockedError(RolloutMockError):
    """Another live process is already writing into this split of the dump directory."""


class UnsafePathError(RolloutMockError, ValueError):
    """A name or path would leave ``dump_dir`` (``..``, a separator, an absolute path, a symlink
    pointing outside), or a lock/temporary file is a symlink."""


class SchedulerUnavailableError(RolloutMockError, AttributeError):
    """Mock mode has no real scheduler, and a method that is not replayed was called."""


class DiskFullError(RolloutMockError, OSError):
    """The disk filled up while writing a step (ENOSPC).

    ``needed`` and ``free`` are byte counts when known; ``errno`` is ``ENOSPC``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        needed: int | None = None,
        free: int | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, path=path, **context)
        self.errno = errno.ENOSPC
        self.needed = needed
        self.free = free


class FingerprintMismatchError(RolloutMockError):
    """The environment of this run differs from the one that recorded the dump (strict mode)."""


class DeterminismError(RolloutMockError):
    """``apply(strict=True)`` found settings that can no longer take effect in this process, or
    its self-check (``check=True``) found a GPU whose two runs disagreed.

    ``too_late`` holds one :class:`~rollout_mock.determinism.LateSetting` per such variable
    (nothing was changed); ``check`` holds the failed :class:`~rollout_mock.determinism.SelfCheck`
    (the settings stay applied), else None.
    """

    def __init__(
        self, message: str, *, too_late: Sequence[Any] = (), check: Any = None
    ) -> None:  # determinism.LateSetting, determinism.SelfCheck
        super().__init__(message)
        self.too_late = tuple(too_late)
        self.check = check


class ReplayMismatchError(RolloutMockError, ValueError):
    """Mock (or check) mode: a call asks for other data than the dump run's call of that step
    (another batch size, other prompts, a shifted data loader, other sampling arguments...), so
    the recorded batch is not what this run would have trained on. Raised *before* the batch is
    served. ``step`` is the run's step, ``dump_step`` the recorded step it maps to, ``method`` the
    intercepted method, ``argument`` the first argument (or path inside one) that differs,
    ``recorded``/``live`` short descriptions of both values, and ``nearest`` a recorded step whose
    request equals this call's, when there is one (e.g. a loader shifted by one step). ``call``: the
    index of the recorded call within its step when the step holds several calls (``None``
    otherwise); ``counts``: ``(recorded, this run)`` calls of ``method`` at the step when the two
    runs make a different number of calls.
    """

    def __init__(self, message: str, *, method: str | None = None, argument: str | None = None,
                 dump_step: int | None = None, recorded: str | None = None, live: str | None = None,
                 nearest: int | None = None, call: int | None = None, counts: tuple[int, int] | None = None,
                 **context: Any) -> None:
        super().__init__(message, **context)
        self.call = call
        self.counts = counts
        self.method = method
        self.argument = argument
        self.dump_step = dump_step
        self.recorded = recorded
        self.live = live
        self.nearest = nearest


class RolloutSettingsMismatchError(ReplayMismatchError):
    """The pre-flight check of mock (or check) mode: the rollout-side settings of this run (TRL's
    ``num_generations``, batch sizes, sampling parameters...; ROLL's and verl's rollout config;
    ``rollout_settings=``) differ from the ones recorded with the dump. Raised when the wrapper is
    built, before the first training step. ``differences`` holds one ``(setting, recorded, live)``
    tuple per setting that differs (every one, not only the first)."""

    def __init__(self, message: str, *, differences: Sequence[tuple[str, Any, Any]], **context: Any) -> None:
        first = differences[0] if differences else (None, None, None)
        super().__init__(message, argument=first[0], recorded=repr(first[1]), live=repr(first[2]), **context)
        self.differences = tuple(differences)


class CheckFailedError(RolloutMockError):
    """Check mode with ``check_min_match``: the live rollout of a step matches the recorded one
    less than the threshold (e.g. stale weights on the inference engines). ``match`` is the
    step's match fraction and ``threshold`` the configured minimum; the verdict was written."""

    def __init__(self, message: str, *, match: float, threshold: float, **context: Any) -> None:
        super().__init__(message, **context)
        self.match = match
        self.threshold = threshold


class UnrecordableBatchError(RolloutMockError, TypeError):
    """Dump mode: a batch holds values that cannot be replayed later (e.g. AReaL's remote-tensor
    handles, whose data lives in another process and is gone at replay time). Raised at dump
    time, before anything is written for that step; the message names the fix."""


class MissingExtraError(RolloutMockError, ImportError):
    """An optional dependency is not installed; the message names the ``pip install`` extra."""


# ----------------------------------------------------------------------------- metrics & compare
class MetricsError(RolloutMockError):
    """Base class of the errors about metrics files and values."""


class MetricsNotFoundError(MetricsError, FileNotFoundError):
    """The metrics file or run directory does not exist, or holds no metrics file."""


class MetricsFormatError(MetricsError, ValueError):
    """A metrics file cannot be parsed. ``line`` is the 1-based line number, when known."""

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        step: int | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message, path=path, step=step)
        self.line = line


class InvalidMetricError(MetricsError, ValueError):
    """A value passed to :meth:`MetricsWriter.log` is not a real scalar (the message names the key)."""


class VerifyInputError(MetricsError, ValueError):
    """The arguments of :func:`verify` are inconsistent (unknown metric, negative tolerance)."""


class DiffInputError(RolloutMockError, ValueError):
    """The arguments of :func:`diff_dumps` are inconsistent (bad step range, unknown split)."""


class TraceError(RolloutMockError, ValueError):
    """The batch has no shape that traces can be built from (or a bad argument was given)."""


class MetricsDivergenceError(MetricsError):
    """Mock mode with ``verdict: fail``: a logged metric differs from the value the dump run logged.

    ``metric``, ``expected`` and ``actual`` name the first divergence (``step`` is its step).
    """

    def __init__(self, message: str, *, path: str | Path | None = None, step: int | None = None,
                 metric: str | None = None, expected: float | None = None,
                 actual: float | None = None) -> None:
        super().__init__(message, path=path, step=step)
        self.metric = metric
        self.expected = expected
        self.actual = actual


class DebugInputError(RolloutMockError, ValueError):
    """A debugging tool (``logprobs``, ``cut``, ``report``) got input it cannot use: no log-prob
    keys found, a bad selection, a model that cannot be loaded. The message names the fix."""


class MetricsWarning(UserWarning):
    """A recoverable problem in a metrics file (an incomplete last line that was skipped)."""


class ForeignDumpError(RolloutMockError, ValueError):
    """A foreign dump (ROLL, verl, AReaL, slime) could not be recognised or read."""


class BisectError(RolloutMockError):
    """``rollout-mock bisect`` cannot start or go on: not a git repository, an unknown revision,
    ``--good`` not an ancestor of ``--bad``, no command, a git command that failed or timed out."""


def dump_path_is_a_file(path: str | Path, *, mode: str | None = None) -> DumpNotFoundError:
    """The one message for a dump location that is a file (a step file, the manifest): every
    command, :func:`~rollout_mock.open_dump` and ``MockScheduler`` say the same, naming the dump
    folder above the file when there is one (the nearest parent holding ``manifest.json``)."""
    path = Path(path)
    folder = next((p for p in path.parents if (p / "manifest.json").is_file()), None)
    fix = f"; pass the dump folder: {folder}" if folder is not None else \
        "; pass the dump folder (the one holding manifest.json)"
    return DumpNotFoundError(f"dump directory not found: {path} is a file{fix}", mode=mode, path=path)
