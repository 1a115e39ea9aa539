"""Loading a step file with its checksum (and HMAC) verified before it is decoded."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from rollout_mock.codec import safe
from rollout_mock.errors import (
    CorruptStepError,
    UnsafePickleError,
)
from rollout_mock.storage.fileio import Digest, read_hashed
from rollout_mock.storage.manifest import (
    StepEntry,
    StreamId,
)

__all__ = ["file_digest", "load_verified"]


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
