"""Where recorded steps live: the store interface, its backends, the manifest, file I/O, the
background writer, the prefetcher and the dump reader.

Data flows ``wrap -> codec -> storage -> disk`` and back; nothing in here knows how a scheduler
is wrapped.
"""

from rollout_mock.storage.backend import ByteBackend
from rollout_mock.storage.base import BatchInfo, StepStore, format_ranges
from rollout_mock.storage.directory import DirectoryStore, LocalBackend
from rollout_mock.storage.memory import MemoryBackend, MemoryStore
from rollout_mock.storage.objectstore import FsspecBackend, FsspecStore
from rollout_mock.storage.partial import load_resplit, rank_rows
from rollout_mock.storage.reader import Dump, RecordedStep, load_step, open_dump
from rollout_mock.storage.store import IndexedStore, Store
from rollout_mock.storage.stores import open_store
from rollout_mock.storage.verified import file_digest, load_verified

__all__ = [
    "BatchInfo",
    "ByteBackend",
    "DirectoryStore",
    "Dump",
    "FsspecBackend",
    "FsspecStore",
    "IndexedStore",
    "LocalBackend",
    "MemoryBackend",
    "MemoryStore",
    "RecordedStep",
    "StepStore",
    "Store",
    "file_digest",
    "format_ranges",
    "load_step",
    "load_verified",
    "open_dump",
    "open_store",
    "rank_rows",
    "load_resplit",
]
