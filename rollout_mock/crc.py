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

__all__ = ["FAST", "IMPLEMENTATION", "crc32", "crc32_combine", "zlib_crc32"]

#: zlib's CRC-32, always available (the reference the fast one is tested against).
zlib_crc32: Callable[..., int] = zlib.crc32



def _load_isal() -> tuple[Callable[..., int], Callable[[int, int, int], int]] | tuple[None, None]:
    try:
        from isal.isal_zlib import crc32 as fast_crc32
        from isal.isal_zlib import crc32_combine as fast_combine
    except ImportError:  # the package is optional at run time: fall back to zlib
        return None, None
    return fast_crc32, fast_combine


_isal_crc32, _isal_combine = _load_isal()

#: True when the ISA-L implementation is in use.
FAST: bool = _isal_crc32 is not None
#: ``"isal"`` or ``"zlib"``: which implementation :func:`crc32` calls.
IMPLEMENTATION: str = "isal" if FAST else "zlib"

_impl: Callable[..., int] = _isal_crc32 if _isal_crc32 is not None else zlib.crc32


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of ``data`` (any contiguous buffer), continuing from ``value``; same as ``zlib.crc32``."""
    return _impl(data, value)


def _gf2_times(matrix: list[int], vector: int) -> int:
    total = 0
    i = 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, row) for row in matrix]


def _py_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's ``crc32_combine`` (GF(2) matrix powers), for when ISA-L is not installed."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << i for i in range(31)]  # the operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return (crc1 ^ crc2) & 0xFFFFFFFF


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``, without the bytes.

    Lets a writer that already computed a CRC per chunk (the codec does) report the whole file's
    CRC-32 without a second pass over the data.
    """
    if _isal_combine is not None:
        return int(_isal_combine(crc1, crc2, len2)) & 0xFFFFFFFF
    return _py_combine(crc1, crc2, len2)
