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

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from rollout_mock.errors import ManifestError, RolloutMockError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_DIGITS", "loads_bounded", "parse_bounded"]

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
#: Python's default limit on the digits of an int read from text.
_INT_STR_LIMIT = 4300


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


def _int_of(max_digits: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if len(text.lstrip("-")) > max_digits:
            raise ValueError(f"a number of {len(text)} digits (more than {max_digits})")
        return int(text)

    return parse


def _float(text: str) -> float:
    value = float(text)
    if value - value != 0:  # inf (NaN cannot come out of a JSON number)
        raise ValueError(f"the number {text[:40]} is too large for a float")
    if len(text) > 4 * MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} characters")
    return value


def _float_or_inf(text: str) -> float:
    if len(text) > 4 * MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} characters")
    return float(text)


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


@functools.lru_cache(maxsize=32)
def _decoder(allow_nan: bool, max_digits: int | None,
             object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None) -> json.JSONDecoder:
    """A decoder with the number hooks (made once: ``json.loads`` with hooks builds one per call).
    ``max_digits``: check integers (only when a long digit run was seen). Floats are always
    checked without ``allow_nan`` (cheap; floats are rare in index documents); with it, only
    their length (``1e999`` is ``inf``, as ``Infinity`` would be)."""
    hooks: dict[str, Any] = {"parse_float": _float_or_inf if allow_nan and max_digits is not None else
                             None if allow_nan else _float}
    if max_digits is not None:
        hooks["parse_int"] = _int_of(max_digits)
    return json.JSONDecoder(parse_constant=float if allow_nan else _constant,
                            object_pairs_hook=object_pairs_hook, **hooks)


def parse_bounded(data: bytes | bytearray | memoryview | str, *, max_bytes: int = MAX_BYTES,
                  max_depth: int = MAX_DEPTH, allow_nan: bool = False, max_digits: int = MAX_DIGITS,
                  object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads`` of a hostile document, within bounds (see the module docstring); raises a
    plain :class:`ValueError` saying why (for callers that add their own context: a metrics
    line's file and line number). :func:`loads_bounded` is the same with a rollout_mock error.

    ``allow_nan``: accept ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow a float
    (as ``±inf``; metrics files write them). ``max_digits``: most digits of an integer (at most
    Python's int-string limit, 4,300). ``object_pairs_hook`` as for ``json.loads`` (e.g. a
    check for repeated keys).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise ValueError(f"{len(raw):,} bytes, more than the {max_bytes:,} accepted")
    try:
        text = data if isinstance(data, str) else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if _deeper_than(_structure(raw), max_depth):
        raise ValueError(f"nested more than {max_depth} levels deep")
    max_digits = min(max_digits, _INT_STR_LIMIT)
    long_run = (_LONG_RUN if max_digits == MAX_DIGITS else b"0" * (max_digits + 1)) in raw.translate(_DIGITS)
    try:
        return _decoder(allow_nan, max_digits if long_run else None, object_pairs_hook).decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # a hook's refusal, or the int-string limit
        raise ValueError(str(exc)[:200]) from None
    except RecursionError:
        raise ValueError(f"nested more than {max_depth} levels deep") from None


def loads_bounded(data: bytes | bytearray | memoryview | str, *, where: str | os.PathLike[str],
                  error: type[RolloutMockError] = ManifestError, what: str = "document", fix: str = _DEFAULT_FIX,
                  max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, allow_nan: bool = False) -> Any:
    """``json.loads`` of a hostile document, within bounds (see the module docstring).

    ``data`` must be UTF-8. Raises ``error(message, path=where)`` where ``message`` is
    ``"{where}: unreadable {what} ({why}); {fix}"``. ``allow_nan``: as for :func:`parse_bounded`.
    """
    try:
        return parse_bounded(data, max_bytes=max_bytes, max_depth=max_depth, allow_nan=allow_nan)
    except ValueError as exc:
        raise error(f"{where}: unreadable {what} ({exc}); {fix}", path=os.fspath(where)) from None
