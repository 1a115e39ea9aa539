"""CRC-32 (the zlib/gzip polynomial): ISA-L's when the ``isal`` package is importable, else zlib's.

Both give the same values, so files checksummed with one verify with the other. ISA-L's runs at
several times zlib's speed (measured 11-12 GB/s against 2-7 GB/s on one core of the benchmark
machine, see ``benchmarks/README.md``) and, from ``isal`` 1.8 on, releases the GIL for buffers
over 5 KiB, as ``zlib.crc32`` does for large ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["FAST", "IMPLEMENTATION", "crc32", "zlib_crc32"]

#: zlib's CRC-32, always available (the reference the fast one is tested against).
zlib_crc32: Callable[..., int] = zlib.crc32

try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # the package is optional at run time: fall back to zlib
    _isal_crc32 = None

#: True when the ISA-L implementation is in use.
FAST: bool = _isal_crc32 is not None
#: ``"isal"`` or ``"zlib"``: which implementation :func:`crc32` calls.
IMPLEMENTATION: str = "isal" if FAST else "zlib"

_impl: Callable[..., int] = _isal_crc32 if _isal_crc32 is not None else zlib.crc32


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of ``data`` (any contiguous buffer), continuing from ``value``; same as ``zlib.crc32``."""
    return _impl(data, value)
