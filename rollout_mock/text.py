"""Text and JSON helpers shared by every report: tables, JSON-safe values, the log prefix, and
the atomic write of a report file (:func:`write_text_atomic`).

One JSON encoding of non-finite floats for every ``--json`` output and every metrics file:
the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (what Python's ``json`` module reads
back with ``allow_nan`` and what JavaScript's ``Number()`` parses).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import reprlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

__all__ = [
    "LOG_PREFIX", "STEP_LOG_EVERY", "STEP_LOG_FIRST", "dumps_json", "json_default", "json_float", "jsonable",
    "logger", "short_repr", "step_log_level", "table", "terminal_safe", "write_text_atomic",
]

#: The one logger of the package; every log line starts with :data:`LOG_PREFIX`.
logger = logging.getLogger("rollout_mock")
#: ROLL's prefix, kept so that log greps written for ROLL keep matching.
LOG_PREFIX = "[RolloutMock]"
#: Per-step log lines (a step dumped or loaded, as ROLL words them) are INFO for the first
#: STEP_LOG_FIRST steps of a stream (a run visibly starts, and short runs log as ROLL does) and
#: every STEP_LOG_EVERY steps after, DEBUG otherwise (``-v``): a 3,000-step run logs ~40 lines,
#: not 6,000.
STEP_LOG_FIRST = 10
STEP_LOG_EVERY = 100


def step_log_level(count: int) -> int:
    """The level of the per-step log line of the ``count``-th step (1-based) of a stream."""
    return logging.INFO if count <= STEP_LOG_FIRST or count % STEP_LOG_EVERY == 0 else logging.DEBUG


def json_float(x: float | None) -> float | str | None:
    """``x`` as strict JSON allows it: finite floats unchanged, NaN/±inf as strings."""
    if x is None or math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback: numpy/torch scalars and arrays as Python values, else ``str``."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and type(value).__module__.split(".")[0] in {"numpy", "torch"}:
        return tolist()
    return str(value)


def jsonable(value: Any) -> Any:
    """``value`` made strict-JSON ready, recursively (non-finite floats as strings)."""
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return jsonable(json_default(value))


def dumps_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`jsonable` ``(value)``: never emits bare ``NaN``."""
    return json.dumps(jsonable(value), allow_nan=False, **kwargs)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` bounded to about ``limit`` characters, whatever the value's size or depth
    (error messages must never embed an unbounded value)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a broken __repr__ must not hide the error being reported
        text = f"<{type(value).__qualname__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(rows: Sequence[Sequence[str]], *, header: bool = True, indent: str = "", sep: str = " | ",
          align: str = "left") -> str:
    """Rows of cells as aligned text; with ``header`` a rule under the first row."""
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pad = str.ljust if align == "left" else str.rjust
    lines = [indent + sep.join(pad(cell, w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    if header:
        rule = sep.replace(" ", "-").replace("|", "+")
        lines.insert(1, indent + rule.join("-" * w for w in widths))
    return "\n".join(lines)


# C0 controls but tab and newline (ESC starts every ANSI/OSC sequence), DEL, C1 controls (U+009B is
# a one-character CSI), the bidirectional overrides and isolates ("Trojan Source"), line and
# paragraph separators, and lone surrogates (unencodable: they would crash the print).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINES = re.compile("[\n\t]|" + _UNSAFE.pattern)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: object, *, newlines: bool = True) -> str:
    """``str(text)`` safe to print on a terminal: control characters (ESC and so every ANSI or OSC
    escape sequence, CR, backspace, C1 controls), bidi overrides and lone surrogates become
    visible escapes (``\\x1b``, ``\\ud800``). ``newlines=False`` escapes newline and tab too (a
    value that must stay on one line). Every CLI output line goes through it (see
    :mod:`rollout_mock.cli`): text from a dump is untrusted."""
    value = text if isinstance(text, str) else str(text)
    pattern = _UNSAFE if newlines else _UNSAFE_LINES
    return pattern.sub(_escape, value) if pattern.search(value) else value


class _TerminalSafeFilter(logging.Filter):
    """Escapes every record of :data:`logger` with :func:`terminal_safe` (log lines quote names,
    keys and values read from dumps; they reach terminals outside the CLI too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # bad format arguments: the handler reports them as usual
            return True
        safe = terminal_safe(message)
        if safe != message:
            record.msg, record.args = safe, None
        return True


logger.addFilter(_TerminalSafeFilter())


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory, fsync, rename."""
    import secrets
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        # lone surrogates (from a hostile dump) are written as visible \udXXX escapes, never a crash
        with open(temp, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - directories that cannot be opened (some network filesystems)
        return path
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path
