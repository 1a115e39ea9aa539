"""A crash-safe JSONL metrics writer: one ``O_APPEND`` write per line."""

from __future__ import annotations

import errno
import json
import os
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from rollout_mock.compare.metrics.values import _check_step, encode_value
from rollout_mock.errors import (
    DiskFullError,
    InvalidMetricError,
    MetricsError,
    MetricsWarning,
)

__all__ = ["MetricsWriter"]



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
    :mod:`rollout_mock.compare.metrics.expected`).
    """

    def __init__(self, path: str | Path, *, fsync: bool = False, expected: object = None) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._seen: set[tuple[int, str]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._expected = None
        if expected is not None:
            from rollout_mock.compare.metrics.expected import attach_expected  # it imports this module

            self._expected = attach_expected(expected)

    def _repair_torn_tail(self) -> None:
        try:
            with open(self.path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                if size == 0:
                    return
                f.seek(size - 1)
                if f.read(1) == b"\n":
                    return
                f.seek(0)
                keep = f.read().rfind(b"\n") + 1
                warnings.warn(
                    f"{self.path}: dropping an incomplete last line ({size - keep} bytes, "
                    "left by a crash) before appending",
                    MetricsWarning,
                    stacklevel=3,
                )
                f.truncate(keep)
        except FileNotFoundError:
            return

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
            if self._fd is None:
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
        assert self._fd is not None
        view = memoryview(data)
        try:
            # One write for regular files in practice; the loop only finishes a short write
            # (signal, quota) so that the line is not left incomplete in the middle of the file.
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(self._fd)
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
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            try:
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

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


# --------------------------------------------------------------------------------------------
