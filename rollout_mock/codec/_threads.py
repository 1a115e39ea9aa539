"""The codec's two worker threads: chunk reads, compression and CRC-32 release the GIL, so large
steps use both cores of a small machine (and two of a big one, leaving the rest to training)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

__all__ = ["PARALLEL_BYTES", "pool"]

#: Steps (or tensors) at least this large are processed chunk by chunk on two threads.
PARALLEL_BYTES = 8 << 20
_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The shared two-thread pool (created on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rollout-mock-codec")
    return _POOL
