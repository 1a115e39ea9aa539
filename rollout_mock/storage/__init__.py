"""Where recorded steps live: one :class:`Store` (file names, the index, the codec, checksums and
signatures, verified loads) over a byte backend (a local directory, an fsspec URL, memory), the
background writer, and the readers of dumps.

Data flows ``wrap -> codec -> storage -> disk`` and back; nothing in here knows how a scheduler
is wrapped.
"""

from rollout_mock.storage.backend import BackendDefaults, ByteBackend, MemoryBackend
from rollout_mock.storage.digest import file_digest
from rollout_mock.storage.directory import LocalBackend
from rollout_mock.storage.manifest import StepSet, StreamId, format_ranges
from rollout_mock.storage.objectstore import FsspecBackend
from rollout_mock.storage.reader import (
    Dump,
    Prefetcher,
    RecordedStep,
    load_partial,
    load_resplit,
    load_step,
    open_dump,
    rank_rows,
)
from rollout_mock.storage.store import (
    BatchInfo,
    DirectoryStore,
    FsspecStore,
    MemoryStore,
    StepStore,
    Store,
    StoreSettings,
    open_store,
)
from rollout_mock.storage.verified import load_verified

__all__ = [
    "BackendDefaults",
    "BatchInfo",
    "ByteBackend",
    "DirectoryStore",
    "Dump",
    "FsspecBackend",
    "FsspecStore",
    "LocalBackend",
    "MemoryBackend",
    "MemoryStore",
    "Prefetcher",
    "RecordedStep",
    "StepSet",
    "StepStore",
    "Store",
    "StoreSettings",
    "StreamId",
    "file_digest",
    "format_ranges",
    "load_partial",
    "load_resplit",
    "load_step",
    "load_verified",
    "open_dump",
    "open_store",
    "rank_rows",
]
