"""Where recorded steps live: a small store interface, a directory store and an in-memory one.

The directory layout is ROLL's, ``{dump_dir}/{split}/step_{step:06d}.pkl``, plus
``manifest.json`` (see :mod:`rollout_mock.manifest`). Each step is written crash-safely in this
order: temporary file + fsync, manifest entry (atomic replace), rename into place + directory
fsync. So a ``step_*.pkl`` that exists is always complete and listed in the manifest; a crash
between the manifest update and the rename leaves an entry without a file, which the next writer
removes when it opens the stream (:meth:`DirectoryStore.open_writer`).
"""

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

from rollout_mock import codec, safe
from rollout_mock.describe import count_samples, describe_keys, rejected_count, type_name
from rollout_mock.errors import (
    CorruptStepError,
    DumpNotFoundError,
    LockedError,
    StepExistsError,
    StepNotFoundError,
    UnsafePickleError,
)
from rollout_mock.fileio import Digest, is_temp_name, read_hashed, temp_name, write_temp
from rollout_mock.manifest import (
    Manifest,
    StepEntry,
    StreamId,
    manifest_path,
    read_manifest,
    remove_stale_temps,
    update_manifest,
    utc_now,
)

logger = logging.getLogger("rollout_mock")


@dataclass(frozen=True)
class BatchInfo:
    """What the manifest says about a batch, computed from the live object before it is written."""

    type: str
    samples: int | None
    keys: dict[str, dict[str, Any]]
    rejected: int = 0

    @classmethod
    def of(cls, batch: Any) -> BatchInfo:
        return cls(type_name(batch), count_samples(batch), describe_keys(batch), rejected_count(batch))


def format_ranges(steps: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``; ``"none"`` when empty."""
    if not steps:
        return "none"
    parts: list[str] = []
    start = prev = steps[0]
    for step in steps[1:] + [None]:  # type: ignore[list-item]
        if step is not None and step == prev + 1:
            prev = step
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(parts)


def _exists_error(stream: StreamId, step: int, where: str) -> StepExistsError:
    return StepExistsError(
        f"[RolloutMock] refusing to overwrite step {step} of {stream} (mode=dump): {where} already "
        f"exists. Either set `overwrite: true` in the rollout_mock config (e.g. when resuming a "
        f"dump run from a checkpoint), or point dump_dir at a new directory.",
        mode="dump",
        split=stream.split,
        step=step,
        path=where,
    )


class StepStore(abc.ABC):
    """Saves and loads recorded steps of streams. Implementations must be thread-safe for one
    writer thread plus readers of *other* steps."""

    @abc.abstractmethod
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
        """Record ``batch`` as ``step`` of ``stream``. If the step exists and not ``overwrite``,
        raise :class:`StepExistsError` and change nothing."""

    @abc.abstractmethod
    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        """Return a fresh copy of the recorded batch; :class:`StepNotFoundError` if absent,
        :class:`CorruptStepError` if it does not match its entry."""

    @abc.abstractmethod
    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        """The manifest entry of a step, or ``None``."""

    @abc.abstractmethod
    def steps(self, stream: StreamId) -> list[int]:
        """Recorded steps of ``stream``, ascending."""

    @abc.abstractmethod
    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        """Calling conventions recorded for the stream's intercepted methods."""

    @abc.abstractmethod
    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        """Record (merge) the calling conventions of the stream's intercepted methods."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any] | None:
        """The environment fingerprint recorded by the first writer, if any."""

    @abc.abstractmethod
    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Record the environment fingerprint unless one is recorded already."""

    @abc.abstractmethod
    def delete(self, stream: StreamId, step: int) -> None:
        """Remove a recorded step (file and manifest entry). Absent steps: silently nothing."""

    def contains(self, stream: StreamId, step: int) -> bool:
        return self.entry(stream, step) is not None

    def describe_location(self, stream: StreamId, step: int) -> str:
        """A human-readable location of a step (a path for directory stores)."""
        return f"{stream.relpath(step)}"

    def open_writer(self, stream: StreamId) -> None:
        """Claim ``stream`` for writing by this object (no-op for stores without locking)."""

    def close(self) -> None:
        """Release locks held by this store."""

    def missing_step_error(self, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
        recorded = self.steps(stream)
        location = self.describe_location(stream, step)
        return StepNotFoundError(
            f"[RolloutMock] Mock file not found: {location}\n"
            f"Recorded steps for {stream}: {format_ranges(recorded)}\n"
            f"Possible reasons:\n"
            f"  1. step {step} was not run in dump mode (or dump_steps excluded it)\n"
            f"  2. dump_dir is incorrect\n"
            f"  3. mode mismatch (current: {stream.split}): train and val are recorded separately"
            + ("" if stream.name is None else f", and this scheduler is named {stream.name!r}"),
            mode=mode,
            split=stream.split,
            step=step,
            path=location,
        )


def _decode(data: io.BufferedIOBase | Any, *, trusted: bool, source: str) -> Any:
    return safe.load(data, trusted=trusted, source=source)


class DirectoryStore(StepStore):
    """Steps as files under ``dump_dir``, indexed by ``manifest.json``.

    ``hmac_key`` signs steps on save and is required to match on load. ``verify=False`` skips
    checksum verification on load (sizes are still checked).
    """

    def __init__(
        self, dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None, verify: bool = True
    ) -> None:
        self.dump_dir = Path(dump_dir)
        self.hmac_key = hmac_key
        self.verify = verify
        self._manifest: Manifest | None = None
        self._lock_fds: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self.dump_dir)!r})"

    # ------------------------------------------------------------------ manifest access
    def manifest(self, *, refresh: bool = False) -> Manifest:
        """The manifest (cached; ``refresh=True`` re-reads it). Empty if there is none."""
        if self._manifest is None or refresh:
            self._manifest = read_manifest(self.dump_dir) or Manifest()
        return self._manifest

    def require_manifest(self, *, mode: str, split: str | None = None) -> Manifest:
        """The manifest, or :class:`DumpNotFoundError` naming what is missing and the fix."""
        if not self.dump_dir.is_dir():
            raise DumpNotFoundError(
                f"[RolloutMock] dump directory not found: {self.dump_dir} (mode={mode}). Run the "
                f"same steps in dump mode first, or fix dump_dir.",
                mode=mode,
                split=split,
                path=self.dump_dir,
            )
        manifest = read_manifest(self.dump_dir)
        if manifest is None:
            pickles = sorted(self.dump_dir.glob("*/step_*.pkl"))
            hint = (
                f" It holds {len(pickles)} step file(s) but no manifest: it was probably written "
                f"by ROLL or an older tool; convert it with `rollout-mock import {self.dump_dir} NEW_DIR "
                f"--trust` and point dump_dir at NEW_DIR."
                if pickles
                else " Run the same steps in dump mode first, or fix dump_dir."
            )
            raise DumpNotFoundError(
                f"[RolloutMock] no manifest.json in {self.dump_dir} (mode={mode}).{hint}",
                mode=mode,
                split=split,
                path=manifest_path(self.dump_dir),
            )
        self._manifest = manifest
        return manifest

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        entry = self.manifest().entry(stream, step)
        if entry is None:
            entry = self.manifest(refresh=True).entry(stream, step)
        return entry

    def steps(self, stream: StreamId) -> list[int]:
        return self.manifest(refresh=True).steps(stream)

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        return self.manifest().methods(stream)

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        def change(manifest: Manifest) -> None:
            data = manifest.stream(stream, create=True)
            assert data is not None
            data["methods"].update(methods)

        self._manifest = update_manifest(self.dump_dir, change)

    def fingerprint(self) -> dict[str, Any] | None:
        return self.manifest().fingerprint

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        def change(manifest: Manifest) -> None:
            if manifest.fingerprint is None:
                manifest.fingerprint = fingerprint

        self._manifest = update_manifest(self.dump_dir, change)

    def path_of(self, stream: StreamId, step: int) -> Path:
        return self.dump_dir / stream.relpath(step)

    def describe_location(self, stream: StreamId, step: int) -> str:
        return str(self.path_of(stream, step))

    # ------------------------------------------------------------------ writing
    def open_writer(self, stream: StreamId) -> None:
        """Lock ``stream`` for this process and repair what a crashed writer left behind.

        A second live writer of the same stream (another process, or another unnamed scheduler
        in this one) gets :class:`LockedError`. The lock is an ``flock``: it dies with its owner.
        """
        if stream.key in self._lock_fds:
            return
        directory = self.dump_dir / stream.directory
        directory.mkdir(parents=True, exist_ok=True)
        suffix = "" if stream.rank is None else f"-rank{stream.rank}"
        lock_path = directory / f".writer{suffix}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise LockedError(
                f"[RolloutMock] another writer is already dumping {stream} into {self.dump_dir} "
                f"({owner}). Two schedulers on one dump_dir and split must each have a distinct "
                f"`name` (files go to {stream.split}/<name>/); two runs need two dump_dirs.",
                mode="dump",
                split=stream.split,
                path=lock_path,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename} since {utc_now()}".encode(), 0)
        self._lock_fds[stream.key] = fd
        self._recover(stream)

    def _recover(self, stream: StreamId) -> None:
        for stale in remove_stale_temps(self.dump_dir):
            logger.warning("[RolloutMock] removing leftover temporary manifest %s", stale)
        directory = self.dump_dir / stream.directory
        suffix = "" if stream.rank is None else f"_rank{stream.rank}"
        pattern = re.compile(rf"^\.step_-?\d+{re.escape(suffix)}\.pkl\.tmp-")
        for child in directory.iterdir():
            if is_temp_name(child.name) and pattern.match(child.name):
                logger.warning("[RolloutMock] removing leftover temporary file %s", child)
                child.unlink(missing_ok=True)
        manifest = self.manifest(refresh=True)
        dangling = [
            step for step in manifest.steps(stream) if not self.path_of(stream, step).exists()
        ]
        if dangling:
            logger.warning(
                "[RolloutMock] %s: steps %s are in the manifest but their files are missing "
                "(a crash before the final rename); removing them from the manifest",
                stream,
                format_ranges(dangling),
            )

            def change(m: Manifest) -> None:
                data = m.stream(stream)
                if data is not None:
                    for step in dangling:
                        data["steps"].pop(str(step), None)

            self._manifest = update_manifest(self.dump_dir, change)

    def check_writable(self, stream: StreamId, step: int, *, overwrite: bool) -> None:
        """Raise :class:`StepExistsError` if saving ``step`` would replace a recording."""
        if overwrite:
            return
        path = self.path_of(stream, step)
        if path.exists() or self.manifest().entry(stream, step) is not None:
            raise _exists_error(stream, step, str(path))

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
        self.check_writable(stream, step, overwrite=overwrite)
        path = self.path_of(stream, step)
        if overwrite and (path.exists() or self.manifest().entry(stream, step) is not None):
            self._forget(stream, step)
        written = write_temp(path, lambda w: codec.dump(batch, w), hmac_key=self.hmac_key)
        entry = StepEntry(
            file=stream.relpath(step),
            size=written.size,
            checksum=written.checksum,
            hmac=written.hmac,
            samples=info.samples,
            type=info.type,
            keys=info.keys,
            written_at=utc_now(),
            method=method,
            rollout_seconds=rollout_seconds, call=call,
        )

        def change(manifest: Manifest) -> None:
            data = manifest.stream(stream, create=True)
            assert data is not None
            data["steps"][str(step)] = entry.to_json()

        try:
            self._manifest = update_manifest(self.dump_dir, change)
        except BaseException:
            written.discard()
            raise
        written.commit()
        return entry

    def delete(self, stream: StreamId, step: int) -> None:
        self._forget(stream, step)

    def _forget(self, stream: StreamId, step: int) -> None:
        """Remove a step's file and manifest entry (overwrite: old data goes first).

        The file is first renamed to a temporary name, so a crash at any point leaves either the
        old step intact, or an entry without a file plus a temporary file (both repaired by
        :meth:`_recover`), never a step file that is not in the manifest.
        """
        path = self.path_of(stream, step)
        doomed = path.parent / temp_name(path.name)
        try:
            os.replace(path, doomed)
        except FileNotFoundError:
            doomed = None

        def change(manifest: Manifest) -> None:
            data = manifest.stream(stream)
            if data is not None:
                data["steps"].pop(str(step), None)

        self._manifest = update_manifest(self.dump_dir, change)
        if doomed is not None:
            doomed.unlink(missing_ok=True)

    def close(self) -> None:
        for fd in self._lock_fds.values():
            os.close(fd)
        self._lock_fds.clear()

    # ------------------------------------------------------------------ reading
    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        entry = self.entry(stream, step)
        path = self.path_of(stream, step)
        if entry is None:
            if path.exists():
                raise CorruptStepError(
                    f"[RolloutMock] {path} exists but step {step} of {stream} is not in "
                    f"{manifest_path(self.dump_dir)}: the dump is incomplete or was copied "
                    f"together by hand; re-dump the step",
                    mode="mock",
                    split=stream.split,
                    step=step,
                    path=path,
                )
            raise self.missing_step_error(stream, step, mode="mock")
        return load_verified(
            path, entry, stream=stream, step=step, trusted=trusted, verify=self.verify,
            hmac_key=self.hmac_key,
        )


def _corrupt(path: Path, stream: StreamId | None, step: int | None, what: str) -> CorruptStepError:
    where = f"step {step} of {stream}" if stream is not None else f"step {step}"
    return CorruptStepError(
        f"[RolloutMock] {path} ({where}) is corrupt: {what}. Do not use it: re-dump the step or "
        f"restore the dump from a copy.",
        mode="mock",
        split=None if stream is None else stream.split,
        step=step,
        path=path,
    )


def load_verified(
    path: Path,
    entry: StepEntry | None,
    *,
    stream: StreamId | None,
    step: int | None,
    trusted: bool,
    verify: bool = True,
    hmac_key: bytes | None = None,
) -> Any:
    """Load a step file, checking size, checksum and signature against ``entry`` when given.

    With the safe loader the checksum is computed while the file is decoded (one read). When the
    file will be unpickled without restrictions (``trusted``) or must be authenticated
    (``hmac_key``), the whole file is verified *before* anything is unpickled, so a tampered file
    never gets to run code. A configured ``hmac_key`` is checked even when ``verify`` is off.
    """
    source = str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise _corrupt(path, stream, step, "the file listed in the manifest is missing") from None
    if entry is not None and size != entry.size:
        raise _corrupt(path, stream, step, f"size is {size} bytes, manifest says {entry.size}")
    if entry is not None and hmac_key is not None:
        verify = True
        if not entry.hmac:
            raise _corrupt(
                path, stream, step, "the manifest has no HMAC signature for it, but a key is configured"
            )

    def decode(file: Any) -> Any:
        try:
            return safe.load(file, trusted=trusted, source=source)
        except UnsafePickleError as exc:
            exc.step, exc.split = step, None if stream is None else stream.split
            raise

    def decode_path(failure: str) -> Any:
        with open(path, "rb") as file:
            try:
                return decode(file)
            except UnsafePickleError:
                raise
            except Exception as exc:
                raise _corrupt(path, stream, step, f"{failure} ({exc!r})") from exc

    if entry is None or not verify:
        return decode_path("cannot be decoded")

    def check(checksum: str, mac: str | None) -> None:
        if checksum != entry.checksum:
            raise _corrupt(
                path, stream, step, f"checksum {checksum} does not match the manifest's {entry.checksum}"
            )
        if hmac_key is not None and not hmac.compare_digest(str(mac), str(entry.hmac)):
            raise _corrupt(
                path, stream, step,
                "HMAC signature does not match: the file (or its manifest entry) was changed "
                "after dumping, or the key differs from the one used to dump",
            )

    if trusted or hmac_key is not None:
        check(*file_digest(path, hmac_key))
        return decode_path("checksum matches but decoding failed")
    try:
        batch, result = read_hashed(path, decode)
    except Exception as exc:
        check(*file_digest(path))
        if isinstance(exc, UnsafePickleError):
            raise
        raise _corrupt(path, stream, step, f"checksum matches but decoding failed ({exc!r})") from exc
    check(result.checksum, result.hmac)
    return batch


def file_digest(path: Path, hmac_key: bytes | None = None) -> tuple[str, str | None]:
    """Checksum (and HMAC) of a whole file, streamed."""
    digest = Digest(hmac_key)
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(16 << 20):
            digest.update(chunk)
    return digest.finish()


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
        data = codec.dumps(batch)
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
