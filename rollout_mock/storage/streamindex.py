"""The index of one stream, as its writer keeps it: which steps exist, which entry files are not
folded yet, and the folding into segment files and ``manifest.json`` (the protocol is in
:mod:`rollout_mock.storage.index`).

A :class:`StreamIndex` is what the :class:`~rollout_mock.storage.store.Store` holds for each
stream it writes (composition: the store routes a stream's saves and deletes to it). It never
holds the stream's entries in memory: only the step numbers, and the entries written since the
last fold (at most :data:`~rollout_mock.storage.index.SEGMENT_STEPS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rollout_mock.errors import LockedError
from rollout_mock.storage.backend import ByteBackend
from rollout_mock.storage.index import (
    INLINE_STEPS,
    INVALID,
    SEGMENT_STEPS,
    STREAMS_DIR,
    encode_entry,
    encode_segment,
    encode_stream_record,
    entry_relpath,
    index_dir,
    iter_ranges,
    read_entries,
    read_fingerprint,
    read_segment,
    segment_relpath,
    seq_of_segment_name,
    stream_record_name,
    strip_steps,
    to_ranges,
)
from rollout_mock.storage.manifest import MANIFEST_NAME, Manifest, StreamId, dumps_manifest
from rollout_mock.text import logger

__all__ = ["StreamIndex"]

#: Reads ``manifest.json`` afresh (None when there is none): the store's cached reader.
ReadManifest = Callable[[], "Manifest | None"]


class StreamIndex:
    """A stream claimed for writing (see the module docstring). Build it with :meth:`open`."""

    #: entries per segment, and the longest stream folded inline at close (class attributes so
    #: that a test can make them small)
    segment_steps: ClassVar[int] = SEGMENT_STEPS
    inline_steps: ClassVar[int] = INLINE_STEPS

    def __init__(self, backend: ByteBackend, stream: StreamId, handle: Any, read_manifest: ReadManifest) -> None:
        self.backend, self.stream, self.handle = backend, stream, handle
        self._read_manifest = read_manifest
        self.live: set[int] = set()  # every step of the stream
        self.folded: set[int] = set()  # steps held by manifest.json (inline or in a segment)
        self.pending: dict[int, Any] = {}  # entry files not folded yet: the raw entry, or None (tombstone)
        self.methods: dict[str, dict[str, Any]] = {}
        self.next_seq = 0

    @classmethod
    def open(cls, backend: ByteBackend, stream: StreamId, read_manifest: ReadManifest) -> StreamIndex:
        """Claim ``stream`` (:class:`LockedError` if another writer holds it), remove what a
        crashed writer left (temporary files, an unreferenced segment), fold its leftover entry
        files (at most one segment's worth, whatever the dump's length), announce the stream."""
        handle = backend.lock_stream(stream)
        try:
            index = cls(backend, stream, handle, read_manifest)
            index._resume()
        except BaseException:
            backend.unlock_stream(stream, handle)
            raise
        return index

    def _resume(self) -> None:
        backend, stream = self.backend, self.stream
        backend.recover(stream)
        base = self._read_manifest()
        data = None if base is None else base.streams.get(stream.key)
        self.folded = set(base.steps(stream)) if base is not None else set()
        self.methods = base.methods(stream) if base is not None else {}
        names = backend.listdir(index_dir(stream))
        referenced = {int(ref["seq"]) for ref in (data or {}).get("segments") or ()}
        on_disk = {seq for name in names if (seq := seq_of_segment_name(stream, name)) is not None}
        self.next_seq = max(referenced | on_disk, default=-1) + 1
        orphans = sorted(on_disk - referenced)  # a writer died between a segment and its reference
        if orphans:
            backend.remove([segment_relpath(stream, seq) for seq in orphans])
        leftovers = read_entries(backend, stream, names)
        invalid = [step for step, raw in leftovers.items() if raw is INVALID]
        self.pending = {step: raw for step, raw in leftovers.items() if raw is not INVALID}
        self.live = set(self.folded)
        for step, raw in self.pending.items():
            (self.live.discard if raw is None else self.live.add)(step)
        backend.replace(f"{STREAMS_DIR}/{stream_record_name(stream)}", encode_stream_record(stream, self.methods))
        if invalid:
            backend.remove([entry_relpath(stream, step) for step in invalid])
        if self.pending:
            logger.info("[RolloutMock] %s: folding %d entry file(s) left by an earlier writer", stream,
                        len(self.pending))
            self.fold(final=False)

    # ------------------------------------------------------------------ state
    def lost(self) -> str | None:
        return self.backend.lock_lost(self.handle)

    def check_held(self) -> None:
        lost = self.lost()
        if lost is not None:
            raise LockedError(f"[RolloutMock] lost the writer lock of {self.stream} in {self.backend.where('')}: "
                              f"{lost}", mode="dump", split=self.stream.split)

    def pending_entry(self, step: int) -> tuple[bool, Any]:
        """``(True, raw or None)`` when the step's entry is not folded yet, else ``(False, None)``."""
        if step in self.pending:
            return True, self.pending[step]
        return False, None

    def set_methods(self, methods: dict[str, dict[str, Any]]) -> None:
        self.methods.update(methods)
        self.backend.replace(f"{STREAMS_DIR}/{stream_record_name(self.stream)}",
                             encode_stream_record(self.stream, self.methods))

    # ------------------------------------------------------------------ changes
    def committed(self, step: int, raw: dict[str, Any]) -> None:
        """A step's entry file was created: remember it; fold every ``SEGMENT_STEPS`` entries."""
        self.pending[step] = raw
        self.live.add(step)
        if len(self.pending) >= self.segment_steps:
            self.fold(final=False)

    def deleted(self, step: int) -> None:
        """Hide a step: remove its entry file, or write a tombstone over a folded entry."""
        rel = entry_relpath(self.stream, step)
        if step in self.folded:
            self.backend.replace(rel, encode_entry(self.stream, step, None))
            self.pending[step] = None
        else:
            self.backend.remove([rel])
            self.pending.pop(step, None)
        self.live.discard(step)

    def fold(self, *, final: bool) -> None:
        """Fold the pending entries (see :mod:`rollout_mock.storage.index`): a new segment file,
        then its reference in manifest.json (under the manifest lock), then the entry files go.
        ``final`` (close): a stream of at most ``INLINE_STEPS`` steps is folded inline instead,
        its segments removed, and the stream record goes too."""
        backend, stream = self.backend, self.stream
        entries = {step: raw for step, raw in self.pending.items() if raw is not None}
        inline = final and len(self.live) <= self.inline_steps
        new_seq = None
        if entries and not inline:
            new_seq, self.next_seq = self.next_seq, self.next_seq + 1
            rel, body = segment_relpath(stream, new_seq), encode_segment(stream, new_seq, entries)
            if not backend.create(rel, body):
                backend.replace(rel, body)  # left by a dead writer of this stream (we hold its lock)
        with backend.manifest_lock():
            manifest = self._read_manifest() or Manifest()
            data = manifest.stream(stream, create=True)
            assert data is not None
            data["methods"].update(self.methods)
            emptied = strip_steps(data, set(self.pending))
            for step in self.pending:
                data["steps"].pop(str(step), None)
            if inline:
                emptied += self._inline_segments(data)
                data["steps"].update({str(step): raw for step, raw in entries.items()})
                data["steps"] = dict(sorted(data["steps"].items(), key=lambda kv: int(kv[0])))
            elif new_seq is not None:
                data.setdefault("segments", []).append({"seq": new_seq, "steps": to_ranges(sorted(entries))})
            if not data.get("segments"):
                data.pop("segments", None)
            if manifest.fingerprint is None:
                manifest.fingerprint = read_fingerprint(backend)
            backend.replace(MANIFEST_NAME, dumps_manifest(manifest).encode("utf-8"))
        gone = [entry_relpath(stream, step) for step in self.pending]
        gone += [segment_relpath(stream, seq) for seq in emptied]
        if final:
            gone.append(f"{STREAMS_DIR}/{stream_record_name(stream)}")
        backend.remove(gone)
        if final:
            backend.prune_dirs([index_dir(stream), STREAMS_DIR])
        self.folded = set(self.live)
        self.pending = {}

    def _inline_segments(self, data: dict[str, Any]) -> list[int]:
        """Copy the entries of the stream's segments inline into its manifest data; their seqs."""
        seqs = []
        for ref in data.get("segments") or ():
            segment = read_segment(self.backend, self.stream, int(ref["seq"]))
            for step in iter_ranges(ref["steps"]):
                raw = segment.get(str(step))
                if raw is not None:
                    data["steps"][str(step)] = raw
            seqs.append(int(ref["seq"]))
        data.pop("segments", None)
        return seqs

    def release(self) -> None:
        self.backend.unlock_stream(self.stream, self.handle)
