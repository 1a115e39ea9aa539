"""Bounded JSON parsing: every JSON document rollout_mock reads may be hostile.

``json.loads`` alone lets a small document crash the caller or a later walk over the result:

* nesting thousands deep raises :class:`RecursionError` (and nesting a little below the
  interpreter's limit parses, then breaks whatever recurses over the result: ``repr``, a
  validator, ``json.dumps``);
* an integer of more than 4,300 digits raises :class:`ValueError` (Python's int-string limit);
* ``1e999`` parses as ``inf``, which raises :class:`OverflowError` where an ``int`` is made of it;
* ``NaN`` and ``Infinity`` are accepted.

:func:`loads_bounded` refuses all of these, and documents over ``max_bytes``, with one error of
the caller's class (a :class:`~rollout_mock.errors.RolloutMockError` subclass:
``ManifestError`` by default) naming the file and the fix. It stays fast on large documents: the
nesting depth is measured before parsing over the document's structure alone (its strings
blanked out with a few C-speed byte operations); floats (rare in our documents) always go through
a finiteness check, integers through a length check only when a byte scan finds a long digit run.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rollout_mock.errors import ManifestError, RolloutMockError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_DIGITS", "loads_bounded"]

#: Deepest nesting of arrays and objects accepted (an index document nests about 8 deep).
MAX_DEPTH = 100
#: Most digits in one number literal (Python refuses to build ints of more than 4,300).
MAX_DIGITS = 100
#: Largest document accepted by default (a 10,000-step manifest is a few MB).
MAX_BYTES = 256 << 20

_DEFAULT_FIX = "the file was edited or damaged — restore it from a copy, or re-dump"
#: Deleted to leave a document's structure: everything but brackets, quotes and separators.
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}",:')))
#: ``{``/``}`` as ``[``/``]``; separators go.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
#: Digits as ``0``, anything else as a space (the scan for long digit runs).
_DIGITS = bytes(ord("0") if 48 <= c <= 57 else ord(" ") for c in range(256))
_LONG_RUN = b"0" * (MAX_DIGITS + 1)


def _structure(data: bytes) -> bytes:
    """The brackets of ``data`` outside its strings, ``{}`` written as ``[]``."""
    if b"\\" in data:  # escapes first: ``\\`` then ``\"`` (left to right, as a parser reads them)
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = data.translate(None, _NOT_STRUCTURE)
    kept = kept.replace(b'""', b"")  # strings holding no bracket (two strings never touch)
    if b'"' in kept:
        import re

        kept = re.sub(rb'"[^"]*"', b"", kept)  # the few strings that hold brackets
    return kept.translate(_BRACKETS, b",:")


def _deeper_than(brackets: bytes, limit: int) -> bool:
    """Whether a run of ``[``/``]`` nests deeper than ``limit`` (a running sum, in chunks)."""
    if len(brackets) <= limit:
        return False
    import numpy as np

    level = 0
    for start in range(0, len(brackets), 1 << 20):
        piece = np.frombuffer(brackets, dtype=np.uint8, count=min(1 << 20, len(brackets) - start), offset=start)
        running = np.cumsum(92 - piece.astype(np.int32), dtype=np.int64) + level
        if int(running.max()) > limit:
            return True
        level = int(running[-1])
    return False


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} digits (more than {MAX_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value - value != 0:  # inf (NaN cannot come out of a JSON number)
        raise ValueError(f"the number {text[:40]} is too large for a float")
    if len(text) > 4 * MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} characters")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def loads_bounded(data: bytes | bytearray | memoryview | str, *, where: str | os.PathLike[str],
                  error: type[RolloutMockError] = ManifestError, what: str = "document", fix: str = _DEFAULT_FIX,
                  max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, allow_nan: bool = False) -> Any:
    """``json.loads`` of a hostile document, within bounds (see the module docstring).

    ``data`` must be UTF-8. Raises ``error(message, path=where)`` where ``message`` is
    ``"{where}: unreadable {what} ({why}); {fix}"``. ``allow_nan``: accept ``NaN``,
    ``Infinity`` and ``-Infinity`` (metrics files write them).
    """
    def refuse(why: str) -> RolloutMockError:
        return error(f"{where}: unreadable {what} ({why}); {fix}", path=os.fspath(where))

    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise refuse(f"{len(raw):,} bytes, more than the {max_bytes:,} accepted")
    try:
        text = data if isinstance(data, str) else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if _deeper_than(_structure(raw), max_depth):
        raise refuse(f"nested more than {max_depth} levels deep")
    hooks: dict[str, Any] = {"parse_float": _float}
    if _LONG_RUN in raw.translate(_DIGITS):
        hooks["parse_int"] = _int
    try:
        return json.loads(text, parse_constant=float if allow_nan else _constant, **hooks)
    except json.JSONDecodeError as exc:
        raise refuse(f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # a hook's refusal, or the int-string limit
        raise refuse(str(exc)[:200]) from None
    except RecursionError:
        raise refuse(f"nested more than {max_depth} levels deep") from None
