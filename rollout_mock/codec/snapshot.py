"""Snapshots of batches (the dump-mode call) and the format-2 writer's entry points.

:func:`capture` is what the dump-mode call blocks on: one copy of every tensor and array (into
the reusable snapshot buffers; small tensors side by side in shared chunks), and, for the plain
Python values of the batch, an in-memory pickle taken by the C pickler (tensors and arrays inside
them go to the buffers too, through ``reducer_override``). That pickle is this process's own
private copy: it is only ever read back by :meth:`Snapshot.materialize` on the writer thread,
never written to a file and never read from one (step files hold msgpack bodies: see
:mod:`~rollout_mock.codec.bodyenc`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from rollout_mock.codec import container
from rollout_mock.codec.buffers import BufferPool
from rollout_mock.codec.encode import _Encoder

__all__ = ["Snapshot", "capture", "encode", "encode_bytes", "encode_snapshot"]


@dataclass
class Snapshot:
    """A batch captured in memory: its node tree and owned copies of its raw data.

    Independent of the original batch (mutating the batch after :func:`capture` returns does not
    change the snapshot). :meth:`materialize` rebuilds an equal batch that shares the copies;
    :func:`encode_snapshot` writes it without another copy.
    """

    root: Any
    chunks: list[tuple[memoryview, int]] = field(default_factory=list)
    owners: list[Any] = field(default_factory=list, repr=False)
    spans: dict[int, memoryview] = field(default_factory=dict, repr=False)
    pool: BufferPool | None = field(default=None, repr=False)
    pooled: list[Any] = field(default_factory=list, repr=False)
    #: header version 4: the chunks of the msgpack body, and whether it holds lone surrogates
    body: list[int] | None = None
    surrogates: bool = False
    #: 4 when written by the version-4 encoder (None: decided by the container: 2 or 3)
    header_version: int | None = None
    #: the in-memory pickles of ``{"$": "snap"}`` nodes (dump-mode captures; never written)
    pickled: list[Any] = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        kept = sum(len(p) if isinstance(p, bytes) else getattr(p, "nbytes", 0) for p in self.pickled)
        return sum(view.nbytes for view, _ in self.chunks) + kept

    def release(self) -> None:
        """Give pooled buffers back (after the snapshot was written): the snapshot, and any batch
        :meth:`materialize` built from it, must not be used afterwards; it is emptied."""
        self.chunks, self.owners, self.spans, self.pickled = [], [], {}, []
        if self.pool is not None:
            self.pool.give(self.pooled)
        self.pooled = []

    def materialize(self, *, batch_class: type | None = None) -> Any:
        from rollout_mock.codec.decode import materialize_snapshot

        return materialize_snapshot(self, batch_class=batch_class)


def capture(obj: Any, *, pool: BufferPool | None = None) -> Snapshot:
    """Snapshot ``obj`` with one copy of its tensor/array data (into ``pool``'s buffers, if given:
    call :meth:`Snapshot.release` once the snapshot is written)."""
    encoder = _Encoder(snapshot=True, pool=pool, pickled=True)
    root = encoder.node(obj)
    body, surrogates = encoder.finish()
    return Snapshot(root, encoder.chunks, encoder._owners, encoder.spans, pool, encoder.pooled, body, surrogates, 4,
                    (encoder.body.pickled or []) if encoder.body is not None else [])


def encode_snapshot(snapshot: Any, file: BinaryIO, *, compression: str = "none") -> int:
    """Write a captured batch as a step file; returns the bytes written. A dump-mode capture's
    plain values (in-memory pickles) are rebuilt and encoded as a msgpack body first."""
    if getattr(snapshot, "pickled", None):
        return encode(snapshot.materialize(), file, compression=compression)
    return container.encode_snapshot(snapshot, file, compression=compression)


def encode(obj: Any, file: BinaryIO, *, compression: str = "none") -> int:
    """Write ``obj`` to ``file`` (anything with ``.write``) as a format-2 step file; returns the
    bytes written."""
    encoder = _Encoder(snapshot=False)
    root = encoder.node(obj)
    body, surrogates = encoder.finish()
    snapshot = Snapshot(root, encoder.chunks, encoder._owners, encoder.spans, body=body, surrogates=surrogates,
                        header_version=4)
    return container.encode_snapshot(snapshot, file, compression=compression)


def encode_bytes(obj: Any, *, compression: str = "none") -> bytes:
    buffer = io.BytesIO()
    encode(obj, buffer, compression=compression)
    return buffer.getvalue()
