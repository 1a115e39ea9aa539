"""Training metrics: what a value may be, how it is stored (JSONL, CSV), how two values compare,
a read-only table of them, and the readers of JSONL, CSV and TensorBoard files.

JSONL, one object per line: ``{"step": 3, "pg_loss": 0.25, "grad_norm": "NaN"}``. ``step`` is a
non-negative integer; every other key is a metric whose value is a number or one of the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (:func:`encode_value` / :func:`decode_value`). An
incomplete last line (a writer killed mid-line) is skipped with a warning; a metric logged twice
for one step is an error. :class:`~rollout_mock.compare.expected.MetricsWriter` writes this format.

Two values are the same (:func:`identical`) when their float64 bit patterns are equal, except
that any two NaNs are identical; :func:`within_tolerance` is numpy's ``isclose`` relative to the
baseline, bitwise when both tolerances are 0. Both live in :mod:`rollout_mock.text`, the
package's one tolerance rule (the structural comparison of batches,
:mod:`rollout_mock.codec.structure`, applies it element by element: ``diff``, check mode).
"""

from __future__ import annotations

import csv
import io
import json
import math
import operator
import struct
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rollout_mock.errors import (
    EmptyMetricsError,
    InvalidMetricError,
    MetricsFormatError,
    MetricsNotFoundError,
    MetricsWarning,
    MissingExtraError,
)
from rollout_mock.jsonio import parse_bounded
from rollout_mock.storage.paths import read_inside
from rollout_mock.text import fmt_number, identical, logger, short_repr, within_tolerance, within_tolerance_array

__all__ = [
    "DEFAULT_METRICS_FILE", "MAX_EXACT_INT", "JsonlRecord", "MetricsTable", "decode_value", "encode_value",
    "identical", "jsonl_records", "read_csv", "read_jsonl", "read_metrics", "read_tensorboard",
    "resolve_metrics_path", "within_tolerance", "within_tolerance_array",
]


#: Name of the metrics file that :func:`resolve_metrics_path` looks for in a run directory.
DEFAULT_METRICS_FILE = "metrics.jsonl"
#: Largest integer magnitude that a float64 holds exactly.
MAX_EXACT_INT = 2**53

_NONFINITE_ENCODE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_TFEVENTS_MARK = "tfevents"
#: Longest line of a JSONL metrics file (a real line is well under a kilobyte).
MAX_LINE_BYTES = 1 << 20



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
        raise ValueError(f"expected a number, got {_shown(raw)}")
    if isinstance(raw, int):
        if abs(raw) > MAX_EXACT_INT:
            raise ValueError(f"integer {_shown(raw)} is beyond 2**53 and cannot be read exactly")
        return float(raw)
    if isinstance(raw, float):
        return raw
    if isinstance(raw, str) and raw in _NONFINITE_ENCODE:
        return _NONFINITE_ENCODE[raw]
    raise ValueError(
        f"expected a number or one of \"NaN\", \"Infinity\", \"-Infinity\", got {_shown(raw)}"
    )


def _shown(raw: object, limit: int = 80) -> str:
    """A stored value as JSON, for an error message: bounded, whatever the value."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw.bit_length() > 200:
        return fmt_number(raw)
    try:
        text = json.dumps(raw)
    except (TypeError, ValueError, RecursionError):
        text = short_repr(raw, limit)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_step(step: object) -> int:
    if isinstance(step, bool):
        raise InvalidMetricError(f"step must be a non-negative int, got {step!r}")
    try:
        # any object: operator.index's TypeError is the check (SupportsIndex alone would admit arrays)
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidMetricError(
            f"step must be a non-negative int, got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise InvalidMetricError(f"step must be a non-negative int, got {value}")
    return value


# --------------------------------------------------------------------------- the table
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

    def content_id(self) -> str:
        """``sha256:`` and the hex digest of the values, whatever file format holds them: per metric
        in name order, the UTF-8 name, then each step (int64) and value (float64 bits; every NaN as
        one pattern, the formats keep no payload), all little-endian. So a baseline can be pinned
        (``verify --expected-id``) and re-encoding it (JSONL to CSV) keeps its id; a changed value,
        step or metric name changes it."""
        import hashlib

        digest = hashlib.sha256(b"rollout_mock.metrics.v1\0")
        for name in sorted(self._data):
            encoded = name.encode("utf-8")
            digest.update(struct.pack("<Q", len(encoded)) + encoded)
            series = self._data[name]
            digest.update(struct.pack("<Q", len(series)))
            for step, value in series.items():
                digest.update(struct.pack("<qd", step, math.nan if math.isnan(value) else value))
        return "sha256:" + digest.hexdigest()

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
            raise EmptyMetricsError(
                f"{self.path}: contains no metrics (empty file, or only steps without values)",
                path=self.path,
            )
        return MetricsTable(self.data, source=self.path, format=fmt)


# --------------------------------------------------------------------------- readers
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


def read_jsonl(path: str | Path, *, data: bytes | None = None) -> MetricsTable:
    """Read a JSONL metrics file (format in the module docstring); ``data``: its bytes, read
    by the caller (files under a dump are opened with ``storage.paths.open_inside``)."""
    path = Path(path)
    builder = _TableBuilder(path)
    for record in jsonl_records(path, data=data):
        for key, value in record.values:
            builder.add(key, record.step, value, f"line {record.lineno}")
    return builder.build("jsonl")


class JsonlRecord(NamedTuple):
    """One line of a JSONL metrics file: its number, text (newline kept), step and values."""

    lineno: int
    line: str
    step: int
    values: list[tuple[str, float]]


def jsonl_records(path: str | Path, *, data: bytes | None = None) -> Iterator[JsonlRecord]:
    """The records of a JSONL metrics file, in order (blank lines skipped): every line parsed
    with the bounded JSON reader (:func:`~rollout_mock.jsonio.parse_bounded`: nesting, number
    size, line size), so a hostile file is a :class:`MetricsFormatError` naming the file and the
    line, never a ``RecursionError``. An incomplete last line is skipped with a warning."""
    path = Path(path)
    if data is None:
        text = _read_text(path)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetricsFormatError(f"{path}: not UTF-8 text ({exc.reason})", path=path) from None
    lines = text.split("\n")
    torn_possible = not text.endswith("\n")
    for index, line in enumerate(lines):
        lineno = index + 1
        if not line.strip():
            continue
        is_last = index == len(lines) - 1
        try:
            obj = parse_bounded(line, max_bytes=MAX_LINE_BYTES, max_depth=2, allow_nan=True,
                                object_pairs_hook=_no_duplicate_keys)
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            if "step" not in obj:
                raise ValueError('missing "step"')
            raw_step = obj.pop("step")
            if isinstance(raw_step, bool) or not isinstance(raw_step, int) or raw_step < 0:
                raise ValueError(f'"step" must be a non-negative integer, got {_shown(raw_step)}')
            values: list[tuple[str, float]] = []
            for key, raw in obj.items():
                try:
                    values.append((key, decode_value(raw)))
                except ValueError as exc:
                    raise ValueError(f"metric {short_repr(key, 80)}: {exc}") from None
        except ValueError as exc:
            if is_last and torn_possible:
                _warn_torn(path, lineno, line)
                continue
            raise MetricsFormatError(
                f"{path}:{lineno}: malformed metrics line: {exc}", path=path, line=lineno
            ) from None
        yield JsonlRecord(lineno, line + ("" if is_last else "\n"), raw_step, values)


def read_csv(path: str | Path) -> MetricsTable:
    """Read a CSV metrics file: header with a ``step`` column, one column per metric.

    Empty cells mean "not logged". An incomplete last row (no trailing newline and a wrong cell
    count or unparsable cell) is skipped with a warning, like JSONL.
    """
    path = Path(path)
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a cell over csv's field limit (128 KiB), a NUL byte...
        raise MetricsFormatError(f"{path}:{reader.line_num}: malformed CSV: {exc}", path=path,
                                 line=reader.line_num) from None
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

    A dump directory (holding ``manifest.json``) resolves to the dump run's metrics that it
    stores in ``expected/metrics.jsonl``. A directory resolves to its ``metrics.jsonl``; otherwise to
    its only ``*.jsonl``/``*.ndjson``/``*.csv`` file or, when it holds ``events.out.tfevents.*``
    files, to itself (TensorBoard).
    Subdirectories are not searched. Raises :class:`MetricsNotFoundError` when nothing is found and
    :class:`MetricsFormatError` when several candidates exist or a file's type is unknown.
    """
    path = Path(path)
    if not path.exists():
        raise MetricsNotFoundError(f"{path}: no such metrics file or run directory", path=path)
    if path.is_dir() and (path / "manifest.json").is_file():
        from rollout_mock.storage.store import expected_path

        expected = expected_path(path)
        if expected.is_file():
            return expected, "jsonl"
        raise MetricsNotFoundError(
            f"{path} is a dump directory without the dump run's metrics ({expected}); record them by "
            "passing expected=<scheduler> to the MetricsWriter of the dump run",
            path=path,
        )
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
    if resolved != Path(path) and resolved.parent.parent == Path(path) and (Path(path) / "manifest.json").is_file():
        # a dump's stored metrics: read with the dump containment rules (no link out of the
        # dump, no FIFO or device: storage.paths.open_inside)
        data = read_inside(path, f"{resolved.parent.name}/{resolved.name}")
        if data is None:
            raise MetricsNotFoundError(f"{resolved}: no such metrics file", path=resolved)
        if not data:
            raise EmptyMetricsError(f"{resolved}: empty metrics file", path=resolved)
        return read_jsonl(resolved, data=data)
    if resolved.is_file() and kind != "tensorboard" and resolved.stat().st_size == 0:
        raise EmptyMetricsError(f"{resolved}: empty metrics file", path=resolved)
    return _READERS[kind](resolved)
