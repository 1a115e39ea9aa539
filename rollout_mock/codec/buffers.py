"""Reusable snapshot buffers: the dump-mode call copies a batch into memory that is already
mapped, instead of fresh memory whose first touch costs a page fault per 4 KiB.

A :class:`BufferPool` hands out byte tensors (best fit, at most twice the size asked for) and
takes them back when the background writer has written the snapshot that used them
(:meth:`Snapshot.release`). It keeps at most ``keep`` snapshots' worth of bytes (``max_pending``
of the writer): the memory a dump run holds anyway while steps wait to be written.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["BufferPool"]


class BufferPool:
    """Byte buffers for snapshots, reused across steps (thread-safe)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = max(1, keep)
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self._largest_set = 0

    def __repr__(self) -> str:
        return f"BufferPool(keep={self.keep}, free={len(self._free)} buffers, {self.free_bytes} bytes)"

    @property
    def free_bytes(self) -> int:
        return sum(buffer.numel() for buffer in self._free)

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes`` (callers use its first ``nbytes``)."""
        with self._lock:
            best = None
            for index, buffer in enumerate(self._free):
                size = buffer.numel()
                if nbytes <= size <= 2 * nbytes and (best is None or size < self._free[best].numel()):
                    best = index
            if best is not None:
                return self._free.pop(best)
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffers: list[torch.Tensor]) -> None:
        """Take back the buffers of one snapshot; beyond ``keep`` snapshots' worth, drop the oldest."""
        if not buffers:
            return
        with self._lock:
            self._largest_set = max(self._largest_set, sum(b.numel() for b in buffers))
            self._free.extend(buffers)
            limit = self.keep * self._largest_set
            while self._free and sum(b.numel() for b in self._free) > limit:
                self._free.pop(0)
