"""An in-memory store with the same behaviour as the directory store (for tests)."""

from __future__ import annotations

import abc
import fcntl
import hmac
import io
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock import codec
from rollout_mock.batch import count_samples, describe_keys, rejected_count, type_name
from rollout_mock.codec import safe
from rollout_mock.errors import (
    CorruptStepError,
    DumpNotFoundError,
    LockedError,
    StepExistsError,
    StepNotFoundError,
    UnsafePickleError,
)
from rollout_mock.storage.base import BatchInfo, StepStore, _exists_error
from rollout_mock.storage.fileio import (
    Digest,
    is_temp_name,
    read_hashed,
    temp_name,
    write_temp,
)
from rollout_mock.storage.manifest import (
    Manifest,
    StepEntry,
    StreamId,
    manifest_path,
    read_manifest,
    remove_stale_temps,
    update_manifest,
    utc_now,
)
from rollout_mock.storage.verified import _corrupt

logger = logging.getLogger("rollout_mock")

class MemoryStore(StepStore):
    """Steps as encoded bytes in a dict: same semantics as :class:`DirectoryStore`, for tests."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, int], bytes] = {}
        self._manifest = Manifest()

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._data)} steps)"

    def save(
        self,
        stream: StreamId,
        step: int,
        batch: Any,
        info: BatchInfo,
        *,
        method: str | None = None,
        rollout_seconds: float | None = None,
        overwrite: bool = False,
        call: dict[str, Any] | None = None,
    ) -> StepEntry:
        if not overwrite and (stream.key, step) in self._data:
            raise _exists_error(stream, step, f"memory:{stream.relpath(step)}")
        data = codec.encode_bytes(batch)
        digest = Digest()
        digest.update(data)
        checksum, _ = digest.finish()
        entry = StepEntry(
            file=stream.relpath(step), size=len(data), checksum=checksum, samples=info.samples,
            type=info.type, keys=info.keys, written_at=utc_now(), method=method,
            rollout_seconds=rollout_seconds, call=call,
        )
        stream_data = self._manifest.stream(stream, create=True)
        assert stream_data is not None
        stream_data["steps"][str(step)] = entry.to_json()
        self._data[(stream.key, step)] = data
        return entry

    def delete(self, stream: StreamId, step: int) -> None:
        self._data.pop((stream.key, step), None)
        stream_data = self._manifest.stream(stream)
        if stream_data is not None:
            stream_data["steps"].pop(str(step), None)

    def corrupt(self, stream: StreamId, step: int, data: bytes) -> None:
        """Replace a step's bytes behind the manifest's back (for tests)."""
        self._data[(stream.key, step)] = data

    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        entry = self.entry(stream, step)
        if entry is None:
            raise self.missing_step_error(stream, step, mode="mock")
        data = self._data[(stream.key, step)]
        digest = Digest()
        digest.update(data)
        checksum, _ = digest.finish()
        where = Path(f"memory:{entry.file}")
        if len(data) != entry.size or checksum != entry.checksum:
            raise _corrupt(where, stream, step, f"checksum {checksum} does not match the manifest's {entry.checksum}")
        return safe.load(io.BytesIO(data), trusted=trusted, source=str(where))

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        return self._manifest.entry(stream, step)

    def steps(self, stream: StreamId) -> list[int]:
        return self._manifest.steps(stream)

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        return self._manifest.methods(stream)

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        data = self._manifest.stream(stream, create=True)
        assert data is not None
        data["methods"].update(methods)

    def fingerprint(self) -> dict[str, Any] | None:
        return self._manifest.fingerprint

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        if self._manifest.fingerprint is None:
            self._manifest.fingerprint = fingerprint
