"""Logging a run's metrics: the crash-safe JSONL :class:`MetricsWriter`, and the expected values
it records into a dump or checks a replay against (:class:`ExpectedMetrics`).

Expected values are the dump run's training metrics stored in the dump, checked as a replay logs.

Attach to the :class:`MetricsWriter` you already use::

    scheduler = MockScheduler(real, config)
    with MetricsWriter("run/metrics.jsonl", expected=scheduler) as log:
        ...
        log.log(step, {"pg_loss": loss, "grad_norm": norm})

* dump mode: each logged line is also appended to ``{dump_dir}/expected/metrics.jsonl``
  (``metrics_rank{R}.jsonl`` for ranks other than the writing one when ``ranks: all``), so the
  dump carries the values a faithful replay must reproduce; with ``keep`` (the flight recorder)
  each line also goes to the scheduler's :meth:`~rollout_mock.MockScheduler.observe`, so a NaN or
  a spike in a logged metric keeps the steps around it;
* mock mode: each logged metric is compared with the dump run's value of that step as it is
  logged (config ``verdict``: bitwise by default, per-metric ``rtol``/``atol``); the first
  divergence is reported at the step it happens — a warning with ``verdict: warn`` (default),
  :class:`~rollout_mock.errors.MetricsDivergenceError` with ``verdict: fail``. Closing the writer
  logs a one-line verdict. Metrics or steps the dump run did not log are not compared.

``rollout-mock verify DUMP_DIR RUN_DIR`` compares a finished run against the same values.
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rollout_mock.compare.metrics import (
    MetricsTable,
    _check_step,
    decode_value,
    encode_value,
    read_jsonl,
    within_tolerance,
)
from rollout_mock.config import RolloutMockConfig, load_config
from rollout_mock.config.model import VerdictAction
from rollout_mock.errors import (
    DiskFullError,
    InvalidMetricError,
    MetricsDivergenceError,
    MetricsError,
    MetricsWarning,
)
from rollout_mock.storage.directory import AppendFile
from rollout_mock.storage.paths import is_url
from rollout_mock.storage.store import EXPECTED_DIR, DirectoryStore, expected_path, expected_relpath
from rollout_mock.text import logger
from rollout_mock.wrap.replay import describe_expected

__all__ = [
    "EXPECTED_DIR", "ExpectedMetrics", "MetricsWriter", "attach_expected", "describe_expected", "expected_path",
    "expected_relpath", "read_expected",
]


class MetricsWriter:
    """Append metrics to a JSONL file, one atomically written line per :meth:`log` call.

    The file is opened (and its parent directories created) in the constructor with
    ``O_WRONLY | O_APPEND | O_CREAT``; existing lines are kept, so several processes may append to
    one file. If the existing file ends with an incomplete line (a crash mid-write), that tail is
    truncated with a warning before anything is appended; that repair assumes no other process
    is appending at that moment (open the writers of a shared file before the appends start). With
    ``fsync=True`` every line is fsynced before :meth:`log` returns (slower; survives power loss,
    not only process crashes).

    Usable as a context manager; :meth:`close` is idempotent; :meth:`log` after close raises.
    The writer refuses to log the same ``(step, metric)`` twice in its lifetime.

    ``expected=`` a :class:`~rollout_mock.MockScheduler` (or its config): in dump mode every line
    is also stored in the dump (``expected/metrics.jsonl``); in mock mode every metric is compared
    with the dump run's value as it is logged (config ``verdict``; see
    :class:`ExpectedMetrics`).
    """

    _expected: ExpectedMetrics | None

    def __init__(self, path: str | Path, *, fsync: bool = False, expected: object = None) -> None:
        self._start(Path(path), AppendFile.open(Path(path), durable=fsync))
        if expected is not None:
            self._expected = attach_expected(expected)

    @classmethod
    def _onto(cls, file: AppendFile, path: Path) -> MetricsWriter:
        """A writer of the file the store opened (the dump run's expected metrics)."""
        writer = cls.__new__(cls)
        writer._start(path, file)
        return writer

    def _start(self, path: Path, file: AppendFile) -> None:
        self.path, self.fsync, self._file, self._expected = path, file.durable, file, None
        self._lock = threading.Lock()
        self._seen: set[tuple[int, str]] = set()
        try:
            dropped = file.drop_torn_tail()
        except BaseException:
            file.close()
            raise
        if dropped:
            warnings.warn(f"{self.path}: dropping an incomplete last line ({dropped} bytes, left by a crash) before "
                          "appending", MetricsWarning, stacklevel=3)

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        """Append ``{"step": step, **metrics}`` as one line.

        Validates everything before writing, so an invalid value writes nothing. Raises
        :class:`InvalidMetricError` for a bad step, an empty or ``"step"`` key, a value that is not
        a real scalar, or a ``(step, metric)`` pair already logged by this writer;
        :class:`~rollout_mock.errors.DiskFullError` on ENOSPC. Other ``OSError`` propagate.
        """
        step = _check_step(step)
        record: dict[str, float | int | str] = {"step": step}
        for key, value in metrics.items():
            if not isinstance(key, str) or not key or key == "step":
                raise InvalidMetricError(
                    f"metric names must be non-empty strings other than 'step', got {key!r}",
                    step=step,
                )
            record[key] = encode_value(key, value)
        line = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            if self._file.closed:
                raise MetricsError(f"{self.path}: MetricsWriter is closed", path=self.path, step=step)
            dupes = [k for k in metrics if (step, k) in self._seen]
            if dupes:
                raise InvalidMetricError(
                    f"{self.path}: step {step} already logged metric(s) {', '.join(map(repr, dupes))}",
                    path=self.path,
                    step=step,
                )
            self._write_all(line, step)
            self._seen.update((step, k) for k in metrics)
        if self._expected is not None:
            self._expected.observe(step, metrics)

    def _write_all(self, data: bytes, step: int) -> None:
        try:
            self._file.append(data)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFullError(
                    f"{self.path}: disk full while logging step {step}; free space and resume",
                    path=self.path,
                    step=step,
                ) from exc
            raise

    def close(self) -> None:
        """Fsync (when ``fsync=True``) and close the file. Calling it again does nothing."""
        if self._expected is not None:
            expected, self._expected = self._expected, None
            expected.close()
        with self._lock:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"MetricsWriter({str(self.path)!r}, fsync={self.fsync}, {state})"


# --------------------------------------------------------------------------- expected values
def read_expected(dump_dir: str | os.PathLike[str], rank: int | None = None) -> MetricsTable | None:
    """The dump run's metrics (``None`` when the dump has none), read through
    :func:`~rollout_mock.storage.paths.open_inside`: a symlink at ``expected`` or at the file,
    or a FIFO/device planted there, is :class:`~rollout_mock.errors.UnsafePathError`, never a
    read outside the dump or a hang. Malformed content is :class:`~rollout_mock.errors.MetricsFormatError`."""
    data = DirectoryStore(dump_dir).read_expected(rank)
    return None if data is None else read_jsonl(expected_path(dump_dir, rank), data=data)


def _number(key: str, value: object) -> float:
    return decode_value(encode_value(key, value))


class ExpectedMetrics:
    """Records (dump mode) or checks (mock mode) the metrics of one MetricsWriter."""

    def __init__(self, config: RolloutMockConfig, *, rank: int | None = None, writes: bool = True,
                 watch: Callable[[int, Mapping[str, object]], object] | None = None) -> None:
        self.config = config
        #: dump mode: the recorder's ``observe`` (the flight recorder's metric anomalies)
        self.watch = watch
        self.verdict = config.verdict
        self.path = expected_path(config.dump_dir, rank)
        self.rank = rank
        self.records = config.mode.records
        self._writer: Any = None
        self._table: Mapping[str, Mapping[int, float]] | None = None
        self.compared = 0
        self.diverged = 0
        self.first: tuple[int, str, float, float] | None = None
        self._steps: set[int] = set()
        if self.records:
            if writes and is_url(config.dump_dir):
                logger.warning(
                    "[RolloutMock] %s is an object store: the logged metrics are not stored in the dump (expected "
                    "values are kept for local dumps only), so a replay's metrics cannot be checked against them "
                    "on-line; the flight recorder (keep:) still sees them", config.dump_dir)
            elif writes:
                # opened below dump_dir by the store (no link, a regular file), written by the writer
                self._writer = MetricsWriter._onto(DirectoryStore(config.dump_dir).open_expected(rank), self.path)
        elif self.verdict.action is not VerdictAction.OFF:
            self._table = self._read()

    def __repr__(self) -> str:
        return f"ExpectedMetrics({str(self.path)!r}, {'record' if self.records else self.verdict.action.value})"

    def _read(self) -> Mapping[str, Mapping[int, float]] | None:
        try:
            table = read_expected(self.config.dump_dir, self.rank)
        except MetricsError as exc:
            logger.warning("[RolloutMock] verdict disabled: cannot read the expected metrics: %s", exc)
            return None
        if table is None:
            logger.warning(
                "[RolloutMock] verdict=%s: %s holds no expected metrics (%s); the replay's metrics are "
                "not compared as they are logged. Record them by passing expected=<scheduler> to the "
                "MetricsWriter of the dump run.", self.verdict.action.value, self.config.dump_dir, self.path,
            )
            return None
        return table

    def observe(self, step: int, metrics: Mapping[str, object]) -> None:
        """Record (dump) or compare (mock) one logged line; may raise MetricsDivergenceError."""
        if self._writer is not None:
            self._writer.log(step, metrics)
        if self.watch is not None:
            self.watch(step, metrics)
        if self.records:
            return
        if self._table is None:
            return
        self._steps.add(step)
        for name, raw in metrics.items():
            series = self._table.get(name)
            if series is None or step not in series:
                continue
            expected, actual = series[step], _number(name, raw)
            rtol, atol = self.verdict.tolerance(name)
            self.compared += 1
            if within_tolerance(actual, expected, rtol, atol):
                continue
            self.diverged += 1
            if self.first is None:
                self.first = (step, name, expected, actual)
                self._report(step, name, expected, actual, rtol, atol)

    def _report(self, step: int, name: str, expected: float, actual: float, rtol: float, atol: float) -> None:
        how = "bitwise" if rtol == 0.0 and atol == 0.0 else f"rtol={rtol:g}, atol={atol:g}"
        diff = abs(actual - expected) if math.isfinite(actual) and math.isfinite(expected) else math.inf
        message = (
            f"[RolloutMock] verdict: first divergence from the dump run at step {step}: {name} = {actual!r}, "
            f"the dump run logged {expected!r} (|Δ| = {diff:.3g}, {how}; expected values: {self.path}). "
            + (f"Every earlier step matched; look at what changed in step {step}'s computation."
               if self._steps - {step} else "It is the first step compared.")
        )
        if self.verdict.action is VerdictAction.FAIL:
            raise MetricsDivergenceError(
                message + " (verdict: fail; set `verdict: warn` to only warn)",
                path=self.path, step=step, metric=name, expected=expected, actual=actual,
            )
        logger.warning(message)

    def summary(self) -> str | None:
        """One line for the end of a replay (``None`` in dump mode or without expected values)."""
        if self._table is None or self.records:
            return None
        steps = sorted(self._steps)
        span = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
        if self.first is None:
            bitwise = self.verdict.rtol.get("default") == 0 == self.verdict.atol.get("default")
            return (f"[RolloutMock] verdict: {self.compared} metric values over {span} match the dump run"
                    f" ({'bitwise' if bitwise else 'within tolerance'})")
        step, name, _, _ = self.first
        return (f"[RolloutMock] verdict: {self.diverged} of {self.compared} metric values over {span} differ from "
                f"the dump run; first at step {step} ({name})")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            return
        line = self.summary()
        if line is not None:
            (logger.info if self.first is None else logger.warning)(line)


def attach_expected(source: Any) -> ExpectedMetrics | None:
    """An :class:`ExpectedMetrics` for ``source``: a MockScheduler (or anything with ``config``
    and optionally ``interceptor``), a :class:`RolloutMockConfig`, or a config mapping/path.
    ``None`` when rollout_mock is disabled."""
    interceptor = getattr(source, "interceptor", None)
    config = getattr(source, "config", None)
    if not isinstance(config, RolloutMockConfig):
        config = load_config(source)
    if not config.enable:
        return None
    rank = writes = None
    recorder = getattr(interceptor, "recorder", None)
    if interceptor is not None:
        stream_rank = interceptor.stream.rank
        rank = stream_rank if stream_rank not in (None, config.dump_rank) else None
        writes = interceptor.writes
    return ExpectedMetrics(config, rank=rank, writes=True if writes is None else bool(writes),
                           watch=None if recorder is None else recorder.observe)
