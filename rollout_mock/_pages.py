"""Asking Linux for transparent huge pages on large, freshly allocated buffers.

Filling fresh memory costs one page fault per 4 KiB page; on VMs a fault costs about as much as
copying the page, so reading a step file into a new ``bytearray`` runs at a third of the speed
of reading it into memory that was touched before. ``madvise(MADV_HUGEPAGE)`` on the untouched
buffer (what numpy does for its own allocations of 4 MiB and more) makes the kernel fault it in
2 MiB at a time. Standard library only; a no-op where unsupported.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

#: Buffers smaller than this are left alone (numpy uses the same threshold).
THRESHOLD = 4 << 20
_MADV_HUGEPAGE = 14
_PAGE = mmap.PAGESIZE


def _load_madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()


def advise_hugepages(buffer: Any) -> bool:
    """Advise huge pages for the whole pages inside ``buffer`` (writable, C-contiguous).

    Call it before the buffer is first written. Returns whether the advice was given; failures
    (read-only or small buffers, other platforms, a kernel without THP) are silently ignored:
    this only changes speed, never content.
    """
    if _madvise is None:
        return False
    view = memoryview(buffer)
    if view.readonly or view.nbytes < THRESHOLD or not view.c_contiguous:
        return False
    try:
        anchor = ctypes.c_char.from_buffer(view.cast("B"))
    except (TypeError, ValueError):
        return False
    try:
        address = ctypes.addressof(anchor)
        start = (address + _PAGE - 1) & ~(_PAGE - 1)
        end = (address + view.nbytes) & ~(_PAGE - 1)
        return end > start and _madvise(start, end - start, _MADV_HUGEPAGE) == 0
    finally:
        del anchor
