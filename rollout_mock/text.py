"""Text and JSON helpers shared by every report: tables, JSON-safe values, numbers, the log
prefix, progress bars (:func:`progress_bar`: ``tqdm``, quiet unless the stream is a terminal and
not under CI).

One JSON encoding of non-finite floats for every ``--json`` output and every metrics file:
the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (what Python's ``json`` module reads
back with ``allow_nan`` and what JavaScript's ``Number()`` parses).

One number formatter for every CLI output and the HTML report, :func:`fmt_number`, and one safe
conversion for charts, :func:`to_float`: neither ever raises, whatever the value (a 20,000-digit
int, ``Decimal('1e999999')``, a numpy ``longdouble`` beyond float64, a signalling NaN, an object
whose ``__float__`` raises). One tolerance rule for every comparison of numbers,
:func:`within_tolerance` (and :func:`within_tolerance_array`, element by element).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
import reprlib
import struct
import sys
import warnings
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol, TextIO, cast

__all__ = [
    "LOG_PREFIX", "MAX_INT_DIGITS", "STEP_LOG_EVERY", "STEP_LOG_FIRST", "ProgressBar", "dumps_json", "fmt_number",
    "int_digits", "json_default", "json_float", "jsonable", "logger", "progress_bar", "short_repr", "step_log_level",
    "identical", "table", "terminal_safe", "to_float", "within_tolerance", "within_tolerance_array",
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
    """``value`` made strict-JSON ready, recursively (non-finite floats as strings; an int of
    more than :data:`MAX_INT_DIGITS` digits as its :func:`fmt_number` text, which ``json`` could
    not write past Python's int-string limit and no JSON reader could hold as a number)."""
    kind = type(value)  # the common cases first: a page's data holds hundreds of thousands of values
    if kind is str or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else json_float(value)
    if kind is int:
        return value if -_JSON_INT < value < _JSON_INT else _jsonable_int(value)
    if kind is list:
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, Mapping):
        return {_json_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return _jsonable_int(int(value))
    if value is None or isinstance(value, bool | str):
        return value
    return jsonable(json_default(value))


def _json_key(key: Any) -> str:
    """A mapping key as JSON's string key (an int past ``str()``'s limit as its digit count)."""
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(_jsonable_int(int(key)))
    return str(key)


def _jsonable_int(value: int) -> int | str:
    """``value``, or its :func:`fmt_number` text past :data:`MAX_INT_DIGITS` digits."""
    return value if int_digits(value) <= MAX_INT_DIGITS else fmt_number(value)


# ------------------------------------------------------------------------------------- numbers
#: Ints of more digits are shown as ``<int of N digits>``: past float64's range (~1.8e308) they
#: have no scientific form a reader would trust, and past 4,300 digits ``str()`` itself raises.
MAX_INT_DIGITS = 300
#: Exact ints up to this many digits (steps, counts, token ids); longer ones in scientific form.
_EXACT_INT_DIGITS = 15
_EXACT_INT = 10**_EXACT_INT_DIGITS
_JSON_INT = 10**MAX_INT_DIGITS
_LOG10_2 = math.log10(2)


def int_digits(value: int) -> int:
    """Decimal digits of ``abs(value)`` (1 for 0), computed without ``str()`` (which raises past
    Python's int-string limit) and in time linear in the int's size."""
    magnitude = abs(int(value))
    if magnitude == 0:
        return 1
    digits = int(magnitude.bit_length() * _LOG10_2) + 1  # exact, or one too many
    if digits > 1 and magnitude < 10 ** (digits - 1):
        digits -= 1
    return digits


def _fmt_float(x: float, digits: int) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 10.0 ** -digits <= abs(x) < 10.0 ** (digits + 2):
        text = f"{x:.{digits}g}"
        return text if "e" not in text else f"{x:.0f}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _fmt_sci(text: str) -> str:
    """``1.230e+999999`` (any formatter's scientific form) -> ``1.23e999999``."""
    mantissa, _, exponent = text.partition("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _fmt_int(x: int, digits: int) -> str:
    n = int_digits(x)
    if n <= _EXACT_INT_DIGITS:
        return str(x)
    if n <= MAX_INT_DIGITS:
        return _fmt_float(float(x), digits)
    return f"<{'negative ' if x < 0 else ''}int of {n} digits>"


def fmt_number(x: object, digits: int = 4) -> str:
    """``x`` as people read it, in at most a few dozen characters; never raises.

    Floats (Python, numpy, torch 0-d tensors, ``Decimal``, ``Fraction``...) with ``digits``
    significant digits and no float32 noise (``0.10000000149011612`` -> ``0.1``), scientific
    form outside 1e-4 .. 1e6 (``2.5e-5``, ``1.235e7``); ``nan``, ``inf`` and ``-inf`` spelled
    out; ``None`` as ``-``. Ints exact up to 15 digits, then scientific (``1.235e17``); past
    :data:`MAX_INT_DIGITS` digits ``<int of N digits>``. A ``Decimal`` or numpy ``longdouble``
    beyond float64's range keeps its own exponent (``1e999999``), never ``inf``. Anything else:
    a bounded :func:`short_repr`."""
    if type(x) is int and -_EXACT_INT < x < _EXACT_INT:  # token ids, steps, counts: the common case, fast
        return str(x)
    try:
        if x is None:
            return "-"
        if isinstance(x, bool):
            return str(x)
        item = getattr(x, "item", None)
        if callable(item) and type(x).__module__.split(".")[0] in {"numpy", "torch"} \
                and getattr(x, "ndim", 0) == 0:
            value = item()
            if type(value) is not type(x):
                return fmt_number(value, digits)
        if isinstance(x, numbers.Integral):
            return _fmt_int(int(x), digits)
        if isinstance(x, float):
            return _fmt_float(x, digits)
        if isinstance(x, Decimal):
            if x.is_nan():
                return "nan"
            if x.is_infinite():
                return "inf" if x > 0 else "-inf"
            as_float = float(x)
            if x == 0 or math.isfinite(as_float) and as_float != 0:
                return _fmt_float(as_float, digits)
            return _fmt_sci(format(x, f".{digits - 1}e"))
        if isinstance(x, numbers.Rational):
            top, bottom = int(cast(Any, x.numerator)), int(cast(Any, x.denominator))
            return _fmt_int(top, digits) if bottom == 1 else fmt_number(Decimal(top) / Decimal(bottom), digits)
        if isinstance(x, numbers.Real):
            as_float = float(x)
            if (math.isfinite(as_float) and (as_float != 0 or x == 0)) or not _finite_in_own_type(x):
                return _fmt_float(as_float, digits)
            import numpy as np  # a longdouble beyond float64's range

            return _fmt_sci(np.format_float_scientific(cast(Any, x), precision=digits - 1, unique=False))
        return short_repr(x, 60)
    except Exception:  # a hostile __float__/__format__/__repr__: the number is unreadable, not fatal
        return f"<{type(x).__qualname__}>"


def _finite_in_own_type(x: Any) -> bool:
    try:
        return bool(x == x) and abs(x) != float("inf")
    except Exception:
        return False


def to_float(x: object) -> float | None:
    """``x`` as a float for a chart or a statistic, never raising: ``None`` for what is not a
    real number (text, ``None``, a broken ``__float__``); ints and ``Decimal`` beyond float64's
    range as ``±inf`` (charts skip non-finite values); a signalling NaN as ``nan``."""
    if x is None or isinstance(x, str | bytes):
        return None
    try:
        if isinstance(x, int):
            return float(x) if int_digits(x) <= 308 else math.copysign(math.inf, x)
        if isinstance(x, Decimal) and x.is_nan():
            return math.nan
        return float(x)  # type: ignore[arg-type]
    except OverflowError:
        try:
            return math.inf if x > 0 else -math.inf  # type: ignore[operator]
        except Exception:
            return None
    except Exception:
        return None


# ----------------------------------------------------------------------------- comparing numbers
def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def identical(a: float, b: float) -> bool:
    """Bitwise equality of two floats, except that any two NaNs are identical."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return _bits(a) == _bits(b)


def within_tolerance(a: float, b: float, rtol: float, atol: float) -> bool:
    """``a`` (candidate) matches ``b`` (baseline): the package's one tolerance rule (``verify``'s
    metrics, ``diff``'s and check mode's values). Bitwise (any two NaNs alike) when both
    tolerances are 0; else two NaNs, equal values, or ``|a - b| <= atol + rtol * |b|``."""
    if rtol == 0.0 and atol == 0.0:
        return identical(a, b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def within_tolerance_array(a: Any, b: Any, rtol: float, atol: float) -> Any:
    """:func:`within_tolerance` element by element over two numpy arrays of one shape (real or
    complex), as a bool array; by their operators, so this module imports no numpy."""
    both_nan = (a != a) & (b != b)  # noqa: PLR0124 - NaN is the value unequal to itself
    if rtol == 0.0 and atol == 0.0:
        wide = "complex128" if "c" in (a.dtype.kind, b.dtype.kind) else "float64"
        bits_a = a.astype(wide).reshape(-1, 1).view("uint64")
        bits_b = b.astype(wide).reshape(-1, 1).view("uint64")
        return (bits_a == bits_b).all(axis=1).reshape(a.shape) | both_nan
    with warnings.catch_warnings():  # inf - inf: NaN, not within (equal infinities are a == b)
        warnings.simplefilter("ignore", RuntimeWarning)
        finite = (abs(a) < math.inf) & (abs(b) < math.inf)  # an infinity matches only itself
        return (a == b) | both_nan | (finite & (abs(a - b) <= atol + rtol * abs(b)))


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


def quiet_loggers(names: Sequence[str], level: int = logging.WARNING) -> None:
    """Raise the level of other libraries' loggers ``names`` (the CLI keeps object-store clients'
    INFO lines out of its output unless ``-v``)."""
    for name in names:
        logging.getLogger(name).setLevel(level)


class ProgressBar(Protocol):
    """What :func:`progress_bar` returns (a ``tqdm`` bar), as far as the package uses it."""

    def update(self, n: float = 1) -> object: ...

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProgressBar: ...

    def __exit__(self, *exc: object) -> object: ...


#: Seconds before a bar first draws (a command that ends sooner shows none).
PROGRESS_DELAY_S = 0.5


def progress_stream(stream: TextIO) -> TextIO:
    """The stream under the CLI's escaping wrapper (``cli._SafeStream``, which names it
    ``unescaped``): a bar's own carriage returns must reach the terminal as such, not as a visible
    ``\x0d``; what a bar shows from data (its description) is escaped by the bar itself."""
    for _ in range(8):  # wrappers of wrappers; never loops on an object that answers every attribute
        inner = getattr(stream, "unescaped", None)
        if inner is None or inner is stream:
            break
        stream = inner
    return stream


def _bar_class() -> type:
    """tqdm, with every description (a key or file name from a dump: untrusted) escaped."""
    from tqdm import tqdm  # imported on first use: most imports of this module draw no bar

    class SafeBar(tqdm):
        def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
            super().set_description(None if desc is None else terminal_safe(desc, newlines=False), refresh)

    return SafeBar


def progress_bar(total: float, *, stream: TextIO | None = None, enabled: bool | None = None,
                 unit: str = "B", unit_scale: bool = True, desc: str = "") -> ProgressBar:
    """A ``tqdm`` bar on ``stream`` (stderr); by default shown only on a TTY outside CI. It draws
    on the stream under the CLI's escaping (see :func:`progress_stream`), with ``desc`` escaped."""
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        isatty = getattr(stream, "isatty", None)
        enabled = bool(isatty and isatty()) and not os.environ.get("CI")
    bar: ProgressBar = _bar_class()(
        total=total, file=progress_stream(stream), disable=not enabled or total <= 0, unit=unit,
        unit_scale=unit_scale, desc=terminal_safe(desc, newlines=False), delay=PROGRESS_DELAY_S, leave=False,
        dynamic_ncols=True)
    return bar
