"""Replaying onto any data-parallel layout, reading only what is needed.

* :func:`rank_rows` — the rows a data-parallel rank gets, the way the frameworks' own ``chunk``
  splits a batch (``torch.chunk`` / verl's ``DataProto.chunk``: contiguous, ``ceil(n / size)``
  rows per rank, the last ranks shorter or empty);
* :class:`FsspecByteSource` — a step object read with ranged requests (``cat_file(start, end)``:
  one HTTP range GET on S3), for :func:`rollout_mock.codec.open_step`;
* :func:`load_partial` — a step's ``keys`` and ``rows`` from any indexed store: a format-2 step
  reads its header and only the chunks covering them (each chunk's CRC is checked by the codec);
  with an HMAC key the whole object is read and authenticated first (a MAC covers the whole
  file), then the selection is decoded.
* :func:`load_resplit` — per-rank dumps (``ranks: all``) replayed on another rank count: the
  recorded ranks' rows are concatenated in rank order and split again for the new layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rollout_mock.batch import concat, count_samples
from rollout_mock.errors import IncompleteDumpError, RolloutMockError
from rollout_mock.storage.manifest import StreamId

__all__ = ["FsspecByteSource", "load_partial", "load_resplit", "open_view", "rank_rows"]


def rank_rows(n_rows: int, dp_rank: int, dp_size: int) -> range:
    """Rows ``dp_rank`` of ``dp_size`` gets from a batch of ``n_rows`` (torch.chunk's split)."""
    if dp_size < 1 or not 0 <= dp_rank < dp_size or n_rows < 0:
        raise ValueError(f"rank_rows: need 0 <= dp_rank < dp_size and n_rows >= 0, got "
                         f"n_rows={n_rows}, dp_rank={dp_rank}, dp_size={dp_size}")
    per = -(-n_rows // dp_size) if n_rows else 0
    start = min(dp_rank * per, n_rows)
    return range(start, min(start + per, n_rows))


class FsspecByteSource:
    """A ByteSource over one object of an fsspec filesystem (ranged reads, no full download)."""

    def __init__(self, fs: Any, path: str, name: str, size: int | None = None) -> None:
        self.fs, self.path, self.name = fs, path, name
        self._size = size
        self.requests = 0
        self.bytes_read = 0

    def size(self) -> int:
        if self._size is None:
            self._size = int(self.fs.size(self.path))
        return self._size

    def read_range(self, offset: int, length: int) -> bytes:
        from rollout_mock.errors import CorruptStepError

        if offset < 0 or length < 0 or offset + length > self.size():
            raise CorruptStepError(f"{self.name}: read of {length} bytes at {offset} is past the end "
                                   f"({self.size()} bytes): the object is truncated or corrupt", path=self.name)
        data = bytes(self.fs.cat_file(self.path, start=offset, end=offset + length)) if length else b""
        self.requests += 1
        self.bytes_read += len(data)
        if len(data) != length:
            raise CorruptStepError(f"{self.name}: short read ({len(data)} of {length} bytes at {offset})",
                                   path=self.name)
        return data

    def readinto_range(self, offset: int, buffer: Any) -> None:
        target = memoryview(buffer).cast("B")
        target[:] = self.read_range(offset, target.nbytes)


def load_partial(store: Any, stream: StreamId, step: int, *, keys: Iterable[str] | None = None,
                 rows: range | slice | None = None, trusted: bool = False, mapped: bool = False) -> Any:
    """``keys`` (top-level) and ``rows`` of a recorded step, reading as little as possible
    (``mapped``: local files are mapped, not read: see :func:`open_view`)."""
    from rollout_mock.codec import select

    if store.hmac_key is not None and not mapped:  # authenticate the whole object, then select
        batch = store.load(stream, step, trusted=trusted)
        if keys is None and rows is None:
            return batch
        return select(batch, keys, rows)
    if keys is None and rows is None and not mapped:
        return store.load(stream, step, trusted=trusted)
    return open_view(store, stream, step, trusted=trusted, mapped=mapped).load(keys=keys, rows=rows)


def open_view(store: Any, stream: StreamId, step: int, *, trusted: bool = False, mapped: bool = True,
              verify: bool = True) -> Any:
    """A recorded step opened lazily (:class:`~rollout_mock.codec.StepView`): only its
    header is read. ``mapped`` (local dumps): its data is mapped, not read, and what ``load``
    returns *is* the file's pages (copy-on-write).

    ``verify`` (default): the file's size and its whole-file CRC-32 are checked against the index
    first (the CRC from the chunk table: nothing of the data is read), and every chunk ``load``
    returns is CRC-checked as it is handed out. ``verify=False`` reads and checks nothing beyond
    the header; the view's ``verified`` attribute is then False. With an HMAC key the step is read
    once into private memory and authenticated, and the view serves those bytes (never the file's
    pages), whatever ``mapped`` and ``verify`` say: see
    :func:`~rollout_mock.storage.verified.open_verified`.
    """
    from rollout_mock.storage.verified import corrupt_error, open_verified

    entry = store.entry(stream, step)
    if entry is None:
        raise store.missing_step_error(stream, step, mode="mock")
    try:
        rel = stream.relpath(step)  # (a backend of one's own may not know ``mapped``)
        source = store.open_source(rel, mapped=True) if mapped else store.open_source(rel)
    except FileNotFoundError:
        raise corrupt_error(store.where(stream.relpath(step)), stream, step,
                            "the file listed in the manifest is missing") from None
    return open_verified(source, entry, stream=stream, step=step, trusted=trusted, verify=verify,
                         hmac_key=store.hmac_key)


def _rows_of(batch: Any) -> int:
    n = count_samples(batch)
    if n is None:
        raise RolloutMockError(f"cannot re-split a {type(batch).__name__}: it has no batch dimension")
    return int(n)


def load_resplit(store: Any, split: str, step: int, *, dp_rank: int, dp_size: int, name: str | None = None,
                 trusted: bool = False) -> Any:
    """This rank's rows of ``step`` when the dump was recorded per rank (``ranks: all``) on a
    possibly different number of ranks: concatenate the recorded ranks in order, split again.

    Refuses (with the reason) when the recorded ranks are not contiguous from 0 or the batch type
    cannot be concatenated (only dicts of tensors/arrays, TensorDicts and verl DataProtos can).
    """
    recorded = sorted(s.rank for s in store.stream_ids()
                      if s.split == split and s.name == name and s.rank is not None and store.contains(s, step))
    if not recorded or recorded != list(range(len(recorded))):
        raise IncompleteDumpError(
            f"[RolloutMock] cannot re-split step {step} of {split}: recorded ranks are {recorded or 'none'}, "
            f"expected 0..R-1 (a per-rank dump with every rank's file)", mode="mock", split=split, step=step)
    if len(recorded) == dp_size:
        return store.load(StreamId(split, name, dp_rank), step, trusted=trusted)
    parts = [store.load(StreamId(split, name, r), step, trusted=trusted) for r in recorded]
    whole = _concat(parts, split, step)
    return _take(whole, rank_rows(_rows_of(whole), dp_rank, dp_size))


def _concat(parts: list[Any], split: str, step: int) -> Any:
    try:
        return concat(parts)
    except RolloutMockError as exc:
        raise RolloutMockError(f"[RolloutMock] cannot re-split step {step} of {split}: {exc}; replay on "
                               f"the recorded rank count instead", split=split, step=step) from exc


def _take(batch: Any, rows: range) -> Any:
    from rollout_mock.codec import select

    return select(batch, None, slice(rows.start, rows.stop))
