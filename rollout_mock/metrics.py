"""Training metrics: a crash-safe JSONL writer and readers for JSONL, CSV and TensorBoard.

The metrics file is what :func:`rollout_mock.verify.verify` compares: a baseline run and a
candidate run (usually the same training replayed in mock mode after a code change) must log the
same values at the same steps.

JSONL format (``metrics.jsonl``)
--------------------------------
One flat JSON object per line, ``"step"`` first, then one key per metric::

    {"step": 3, "pg_loss": -0.12, "grad_norm": 1.7}
    {"step": 4, "pg_loss": "NaN", "grad_norm": "Infinity"}

* ``step`` is a non-negative integer (the global training step).
* Finite floats are written with ``repr`` (shortest string that round-trips), so reading gives
  back the identical 64-bit value, including ``-0.0``.
* JSON cannot carry non-finite numbers, so they are written as the strings ``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"``. The NaN payload and sign are not preserved: every NaN reads
  back as ``float("nan")``. Readers also accept the bare tokens ``NaN``/``Infinity`` that Python's
  ``json`` module emits by default.
* Integers are written as JSON integers and read back as floats; integers beyond ``2**53`` are
  refused at write time because a float cannot hold them exactly.
* One step may be spread over several lines (different metrics each time), but one
  ``(step, metric)`` pair may appear only once per file: a duplicate is an error naming the
  metric, the step and both line numbers. A resumed run that re-logs steps must say so explicitly
  (truncate the file to the resume step, or log into a new file) instead of having a reader guess
  which value counts.
* Every line is written with a single ``os.write`` on a file descriptor opened with ``O_APPEND``,
  so a crash can leave at most the *last* line incomplete. Readers warn (:class:`MetricsWarning`)
  and skip an incomplete last line that has no trailing newline; a malformed line anywhere else is
  an error naming the file and the line number.

CSV: a header row with a ``step`` column, one column per metric, values encoded as above
(``nan``/``inf`` spellings accepted by :func:`float` too); an empty cell means "not logged at this
step". TensorBoard: scalar summaries of ``events.out.tfevents.*`` files (tag = metric name); these
are stored as float32, so they only compare float32-rounded values. Prefer JSONL.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import math
import operator
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rollout_mock.errors import DiskFullError, RolloutMockError

__all__ = [
    "InvalidMetricError",
    "MetricsError",
    "MetricsFormatError",
    "MetricsNotFoundError",
    "MetricsTable",
    "MetricsWarning",
    "MetricsWriter",
    "MissingExtraError",
    "decode_value",
    "encode_value",
    "read_metrics",
    "resolve_metrics_path",
]

logger = logging.getLogger(__name__)

#: Name of the metrics file that :func:`resolve_metrics_path` looks for in a run directory.
DEFAULT_METRICS_FILE = "metrics.jsonl"
#: Largest integer magnitude that a float64 holds exactly.
MAX_EXACT_INT = 2**53

_NONFINITE_ENCODE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_TFEVENTS_MARK = "tfevents"


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


class MissingExtraError(RolloutMockError, ImportError):
    """An optional dependency is not installed; the message names the ``pip install`` extra."""


class MetricsWarning(UserWarning):
    """A recoverable problem in a metrics file (an incomplete last line that was skipped)."""


# --------------------------------------------------------------------------------------------
# Value encoding
# --------------------------------------------------------------------------------------------


def _to_number(key: str, value: object) -> float | int:
    """Convert ``value`` to a Python ``float`` or ``int``, or raise naming ``key``.

    Accepts ``float``/``int`` (not ``bool``), numpy scalars and 0-d numpy arrays or torch tensors
    (anything with ``.item()`` and an empty ``shape``), without importing numpy or torch.
    """
    if isinstance(value, bool):
        raise InvalidMetricError(
            f"metric {key!r}: bool {value!r} is not a metric value; log int(value) instead"
        )
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    item = getattr(value, "item", None)
    if callable(item):
        shape = getattr(value, "shape", ())
        if tuple(shape) != ():
            raise InvalidMetricError(
                f"metric {key!r}: expected a scalar, got {type(value).__name__} of shape "
                f"{tuple(shape)}; log a 0-d value (e.g. x.mean())"
            )
        return _to_number(key, item())
    raise InvalidMetricError(
        f"metric {key!r}: expected a float, int, numpy scalar or 0-d tensor, got "
        f"{type(value).__name__} {value!r:.60}"
    )


def encode_value(key: str, value: object) -> float | int | str:
    """Return the JSON-ready encoding of one metric value (see the module docstring).

    Raises :class:`InvalidMetricError` naming ``key`` for non-numbers, non-scalar tensors, bools
    and integers beyond ``2**53``.
    """
    number = _to_number(key, value)
    if isinstance(number, int):
        if abs(number) > MAX_EXACT_INT:
            raise InvalidMetricError(
                f"metric {key!r}: integer {number} is beyond 2**53 and cannot be stored exactly "
                "as a float; log it as float(value) if rounding is acceptable"
            )
        return number
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def decode_value(raw: object) -> float:
    """Decode one stored value to a float: numbers, ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Raises ``ValueError`` (caller adds file/line context) for anything else, including ``null``,
    booleans and other strings.
    """
    if isinstance(raw, bool) or raw is None:
        raise ValueError(f"expected a number, got {json.dumps(raw)}")
    if isinstance(raw, int):
        if abs(raw) > MAX_EXACT_INT:
            raise ValueError(f"integer {raw} is beyond 2**53 and cannot be read exactly")
        return float(raw)
    if isinstance(raw, float):
        return raw
    if isinstance(raw, str) and raw in _NONFINITE_ENCODE:
        return _NONFINITE_ENCODE[raw]
    raise ValueError(
        f"expected a number or one of \"NaN\", \"Infinity\", \"-Infinity\", got {json.dumps(raw)}"
    )


def _check_step(step: object) -> int:
    if isinstance(step, bool):
        raise InvalidMetricError(f"step must be a non-negative int, got {step!r}")
    try:
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidMetricError(
            f"step must be a non-negative int, got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise InvalidMetricError(f"step must be a non-negative int, got {value}")
    return value


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------


class MetricsTable(Mapping[str, Mapping[int, float]]):
    """Read-only mapping ``metric name -> {step: value}`` with steps in ascending order.

    ``source`` is the file it was read from and ``format`` one of ``"jsonl"``, ``"csv"``,
    ``"tensorboard"`` (``None`` for tables built in memory).
    """

    def __init__(
        self,
        data: Mapping[str, Mapping[int, float]],
        *,
        source: str | Path | None = None,
        format: str | None = None,
    ) -> None:
        self._data: dict[str, dict[int, float]] = {
            name: {int(s): float(v) for s, v in sorted(series.items())}
            for name, series in data.items()
        }
        self.source = None if source is None else str(source)
        self.format = format

    def __getitem__(self, name: str) -> Mapping[int, float]:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def steps(self) -> list[int]:
        """Every step that any metric was logged at, ascending."""
        return sorted({s for series in self._data.values() for s in series})

    def describe(self) -> str:
        """One line: source, format, metric count and step range (for reports)."""
        steps = self.steps
        span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
        src = self.source or "<memory>"
        return f"{src} ({self.format or 'table'}, {len(self)} metrics, {span})"

    def __repr__(self) -> str:
        return f"MetricsTable({self.describe()})"


class _TableBuilder:
    """Accumulates values and refuses duplicated ``(metric, step)`` pairs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, dict[int, float]] = {}
        self.where: dict[tuple[str, int], str] = {}

    def add(self, name: str, step: int, value: float, where: str) -> None:
        series = self.data.setdefault(name, {})
        if step in series:
            raise MetricsFormatError(
                f"{self.path}: metric {name!r} logged twice for step {step} ({self.where[(name, step)]} "
                f"and {where}); a resumed run must not re-log steps: truncate the file to the resume "
                "step or log into a new file",
                path=self.path,
                step=step,
            )
        series[step] = value
        self.where[(name, step)] = where

    def build(self, fmt: str) -> MetricsTable:
        if not self.data:
            raise MetricsFormatError(
                f"{self.path}: contains no metrics (empty file, or only steps without values)",
                path=self.path,
            )
        return MetricsTable(self.data, source=self.path, format=fmt)


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


class MetricsWriter:
    """Append metrics to a JSONL file, one atomically written line per :meth:`log` call.

    The file is opened (and its parent directories created) in the constructor with
    ``O_WRONLY | O_APPEND | O_CREAT``; existing lines are kept, so several processes may append to
    one file. If the existing file ends with an incomplete line (a crash mid-write), that tail is
    truncated with a warning before anything is appended; that repair assumes no other process
    is appending at that moment (open the writers of a shared file before the appends start). With ``fsync=True`` every line is
    fsynced before :meth:`log` returns (slower; survives power loss, not only process crashes).

    Usable as a context manager; :meth:`close` is idempotent; :meth:`log` after close raises.
    The writer refuses to log the same ``(step, metric)`` twice in its lifetime.
    """

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._seen: set[tuple[int, str]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

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
# Readers
# --------------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one line")
        out[key] = value
    return out


def _warn_torn(path: Path, lineno: int, text: str) -> None:
    msg = (
        f"{path}:{lineno}: skipping incomplete last line (no trailing newline; the writer was "
        f"probably interrupted): {text[:60]!r}"
    )
    logger.warning(msg)
    warnings.warn(msg, MetricsWarning, stacklevel=4)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsFormatError(f"{path}: not UTF-8 text ({exc.reason})", path=path) from None


def read_jsonl(path: str | Path) -> MetricsTable:
    """Read a JSONL metrics file (format in the module docstring)."""
    path = Path(path)
    text = _read_text(path)
    lines = text.split("\n")
    torn_possible = not text.endswith("\n")
    builder = _TableBuilder(path)
    for index, line in enumerate(lines):
        lineno = index + 1
        if not line.strip():
            continue
        is_last = index == len(lines) - 1
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicate_keys)
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            if "step" not in obj:
                raise ValueError('missing "step"')
            raw_step = obj.pop("step")
            if isinstance(raw_step, bool) or not isinstance(raw_step, int) or raw_step < 0:
                raise ValueError(f'"step" must be a non-negative integer, got {json.dumps(raw_step)}')
            values: list[tuple[str, float]] = []
            for key, raw in obj.items():
                try:
                    values.append((key, decode_value(raw)))
                except ValueError as exc:
                    raise ValueError(f"metric {key!r}: {exc}") from None
        except ValueError as exc:
            if is_last and torn_possible:
                _warn_torn(path, lineno, line)
                continue
            raise MetricsFormatError(
                f"{path}:{lineno}: malformed metrics line: {exc}", path=path, line=lineno
            ) from None
        for key, value in values:
            builder.add(key, raw_step, value, f"line {lineno}")
    return builder.build("jsonl")


def read_csv(path: str | Path) -> MetricsTable:
    """Read a CSV metrics file: header with a ``step`` column, one column per metric.

    Empty cells mean "not logged". An incomplete last row (no trailing newline and a wrong cell
    count or unparsable cell) is skipped with a warning, like JSONL.
    """
    path = Path(path)
    text = _read_text(path)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise MetricsFormatError(f"{path}: empty CSV file (no header row)", path=path, line=1)
    header = [cell.strip() for cell in rows[0]]
    if "step" not in header:
        raise MetricsFormatError(
            f"{path}:1: CSV header has no 'step' column (columns: {', '.join(header)})",
            path=path,
            line=1,
        )
    if len(set(header)) != len(header) or "" in header:
        raise MetricsFormatError(
            f"{path}:1: CSV header has empty or repeated column names: {header}", path=path, line=1
        )
    step_col = header.index("step")
    torn_possible = not text.endswith("\n")
    builder = _TableBuilder(path)
    # csv rows may span lines only inside quotes, which metrics never need; row n is line n+1.
    for index, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        is_last = index == len(rows)
        try:
            if len(row) != len(header):
                raise ValueError(f"expected {len(header)} cells, got {len(row)}")
            step_text = row[step_col].strip()
            if not step_text.isdigit():
                raise ValueError(f"step must be a non-negative integer, got {step_text!r}")
            step = int(step_text)
            values = []
            for name, cell in zip(header, row):
                cell = cell.strip()
                if name == "step" or not cell:
                    continue
                try:
                    values.append((name, float(cell)))  # also takes NaN/Infinity/-Infinity
                except ValueError:
                    raise ValueError(f"column {name!r}: not a number: {cell!r}") from None
        except ValueError as exc:
            if is_last and torn_possible:
                _warn_torn(path, index, ",".join(row))
                continue
            raise MetricsFormatError(
                f"{path}:{index}: malformed CSV row: {exc}", path=path, line=index
            ) from None
        for name, value in values:
            builder.add(name, step, value, f"line {index}")
    return builder.build("csv")


def read_tensorboard(path: str | Path) -> MetricsTable:
    """Read the scalar summaries of a TensorBoard event file or directory (not recursive).

    Both legacy ``simple_value`` scalars (``SummaryWriter.add_scalar``) and tensor summaries of
    the ``scalars`` plugin are read; tag names become metric names. Values are float32 on disk.
    Requires the ``tensorboard`` extra.
    """
    path = Path(path)
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except ImportError as exc:
        raise MissingExtraError(
            f"reading TensorBoard event files ({path}) needs tensorboard: "
            "pip install rollout_mock[tensorboard]",
            path=path,
        ) from exc
    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    try:
        acc.Reload()
    except Exception as exc:  # tensorboard raises assorted errors on corrupt files
        raise MetricsFormatError(f"{path}: cannot read TensorBoard events: {exc}", path=path) from exc
    builder = _TableBuilder(path)
    tags = acc.Tags()
    for tag in tags.get(ea.SCALARS, []):
        for event in acc.Scalars(tag):
            builder.add(tag, int(event.step), float(event.value), f"event at wall time {event.wall_time}")
    for tag in tags.get(ea.TENSORS, []):
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        from tensorboard.util import tensor_util

        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            builder.add(tag, int(event.step), float(value.item()), f"event at wall time {event.wall_time}")
    return builder.build("tensorboard")


def _kind(path: Path) -> str | None:
    if _TFEVENTS_MARK in path.name:
        return "tensorboard"
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    return None


def resolve_metrics_path(path: str | Path) -> tuple[Path, str]:
    """Return ``(file_or_event_dir, format)`` for a metrics file or a run directory.

    A directory resolves to its ``metrics.jsonl``; otherwise to its only ``*.jsonl``/``*.ndjson``
    /``*.csv`` file or, when it holds ``events.out.tfevents.*`` files, to itself (TensorBoard).
    Subdirectories are not searched. Raises :class:`MetricsNotFoundError` when nothing is found and
    :class:`MetricsFormatError` when several candidates exist or a file's type is unknown.
    """
    path = Path(path)
    if not path.exists():
        raise MetricsNotFoundError(f"{path}: no such metrics file or run directory", path=path)
    if path.is_dir():
        default = path / DEFAULT_METRICS_FILE
        if default.is_file():
            return default, "jsonl"
        files = sorted(p for p in path.iterdir() if p.is_file())
        candidates: list[tuple[Path, str]] = [
            (p, kind) for p in files if (kind := _kind(p)) in ("jsonl", "csv")
        ]
        if any(_kind(p) == "tensorboard" for p in files):
            candidates.append((path, "tensorboard"))
        if not candidates:
            raise MetricsNotFoundError(
                f"{path}: no metrics file in this directory (looked for {DEFAULT_METRICS_FILE}, "
                "*.jsonl, *.csv, events.out.tfevents.*)",
                path=path,
            )
        if len(candidates) > 1:
            names = ", ".join(
                f"{p.name} ({kind})" if p != path else f"events.out.tfevents.* ({kind})"
                for p, kind in candidates
            )
            raise MetricsFormatError(
                f"{path}: several metrics files, pass one explicitly: {names}", path=path
            )
        return candidates[0]
    kind = _kind(path)
    if kind is None:
        raise MetricsFormatError(
            f"{path}: unknown metrics file type (expected .jsonl, .ndjson, .csv or "
            "events.out.tfevents.*)",
            path=path,
        )
    return path, kind


_READERS = {"jsonl": read_jsonl, "csv": read_csv, "tensorboard": read_tensorboard}


def read_metrics(path: str | Path) -> MetricsTable:
    """Read a metrics file or run directory, dispatching on the file type.

    See :func:`resolve_metrics_path` for how directories resolve and the per-format readers for
    the edge cases. An empty file is a :class:`MetricsFormatError`.
    """
    resolved, kind = resolve_metrics_path(path)
    if resolved.is_file() and kind != "tensorboard" and resolved.stat().st_size == 0:
        raise MetricsFormatError(f"{resolved}: empty metrics file", path=resolved)
    return _READERS[kind](resolved)
