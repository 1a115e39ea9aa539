"""Object-array items stored as a JSON data chunk (header version 3), parsed item by item.

``json.loads`` of a hostile chunk would build every value before the decoder can compare the
item count with the array's shape, and nested containers cost ~20x their text in memory (a
262 KiB file once made the loader allocate 433 MiB). This parser accepts only a flat JSON array
of scalars (strings, finite numbers, true/false/null), stops at the first item beyond the
declared count, and so never holds more than the chunk's text plus ``count`` small objects, an
amount the header check already counted against the file's bound
(:data:`~rollout_mock.codec.header.ITEM_OVERHEAD` per item).
"""

from __future__ import annotations

import json.decoder
import math
import re
from typing import Any

__all__ = ["parse_items"]

_SCALAR = re.compile(
    r'[ \t\n\r]*(?:(")|(-?(?:0|[1-9][0-9]*))((?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)|(true)|(false)|(null))')
_SEP = re.compile(r"[ \t\n\r]*([,\]])")
_OPEN = re.compile(r"[ \t\n\r]*\[[ \t\n\r]*")
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_LITERALS = {4: True, 5: False, 6: None}


def parse_items(data: bytes | memoryview, count: int) -> list[Any]:
    """The ``count`` items of a JSON array of plain scalars; ValueError for anything else."""
    text = str(data, "utf-8")  # no copy of the bytes first
    opened = _OPEN.match(text)
    if opened is None:
        raise ValueError("object array items are not a JSON array")
    pos = opened.end()
    items: list[Any] = []
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            if len(items) >= count:
                raise ValueError("object array chunk holds more items than its shape")
            match = _SCALAR.match(text, pos)
            if match is None:
                raise ValueError("object array chunk holds a value that is not a plain JSON scalar")
            if match.group(1):
                value, pos = _scanstring(text, match.end(), True)
            elif match.group(2) is not None:
                whole, rest = match.group(2), match.group(3)
                if rest:
                    value = float(whole + rest)
                    if not math.isfinite(value):
                        raise ValueError("object array chunk holds a non-finite number")
                else:
                    value = int(whole)  # ValueError beyond 4300 digits
                pos = match.end()
            else:
                value = _LITERALS[match.lastindex or 0]
                pos = match.end()
            items.append(value)
            sep = _SEP.match(text, pos)
            if sep is None:
                raise ValueError("object array chunk is not a JSON array")
            pos = sep.end()
            if sep.group(1) == "]":
                break
    if text[pos:].strip(" \t\n\r"):
        raise ValueError("object array chunk has data after its JSON array")
    if len(items) != count:
        raise ValueError("object array items do not match its shape")
    return items
