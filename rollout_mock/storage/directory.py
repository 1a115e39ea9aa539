"""A dump directory on a local filesystem: atomic files, a manifest, writer locks."""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path
from typing import Any

from rollout_mock import codec
from rollout_mock.errors import (
    CorruptStepError,
    DumpNotFoundError,
    LockedError,
)
from rollout_mock.storage.base import BatchInfo, StepStore, _exists_error, format_ranges
from rollout_mock.storage.fileio import is_temp_name, temp_name, write_temp
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
from rollout_mock.storage.verified import load_verified

logger = logging.getLogger("rollout_mock")

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
        written = write_temp(path, lambda w: codec.encode(batch, w), hmac_key=self.hmac_key)
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
