"""Loading a step with its checksum (and bound HMAC) verified before it is decoded.

With a key configured, every load path refuses a step that is not signed for *that* stream and
step: the MAC is HMAC-SHA256 over :func:`~rollout_mock.storage.digest.mac_context` (stream key,
step) followed by the bytes, and is stored as ``"hmac-sha256:<hex>"``. Format-1 dumps stored a
bare hex HMAC of the bytes alone; it cannot be bound to a stream and step, so it is refused with
a message saying so.
"""

from __future__ import annotations

import hmac
import io
from pathlib import Path
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.codec import ByteSource, StepView
from rollout_mock.errors import CorruptStepError, UnsafePickleError
from rollout_mock.storage.digest import MAC_ALGORITHM, Digest, file_digest, mac_context, read_hashed, source_digest
from rollout_mock.storage.manifest import StepEntry, StreamId

__all__ = ["corrupt_error", "load_bytes_verified", "load_source_verified", "load_verified", "open_verified"]


def corrupt_error(path: Path | str, stream: StreamId | None, step: int | None, what: str) -> CorruptStepError:
    where = f"step {step} of {stream}" if stream is not None else f"step {step}"
    return CorruptStepError(
        f"[RolloutMock] {path} ({where}) is corrupt: {what}. Do not use it: re-dump the step or "
        f"restore the dump from a copy.",
        mode="mock",
        split=None if stream is None else stream.split,
        step=step,
        path=path,
    )


def _require_signature(path: Path | str, entry: StepEntry | None, stream: StreamId | None,
                       step: int | None) -> bytes:
    """The MAC context to check, or an error when the step cannot be authenticated at all."""
    if entry is None or stream is None or step is None:
        raise corrupt_error(path, stream, step, "an HMAC key is configured, but the file has no index "
                       "entry naming its stream and step, so its signature cannot be checked")
    if not entry.hmac:
        raise corrupt_error(path, stream, step, "the index has no HMAC signature for it, but a key is configured")
    if not entry.hmac.startswith(f"{MAC_ALGORITHM}:"):
        raise corrupt_error(
            path, stream, step,
            f"its signature is the format-1 HMAC of the bytes alone (no {MAC_ALGORITHM}: prefix), "
            f"which does not bind it to its stream and step; re-dump it with this rollout_mock",
        )
    return mac_context(stream.key, step)


def _check(path: Path | str, entry: StepEntry, stream: StreamId | None, step: int | None,
           checksum: str, mac: str | None, keyed: bool) -> None:
    if checksum != entry.checksum:
        raise corrupt_error(path, stream, step, f"checksum {checksum} does not match the manifest's {entry.checksum}")
    if keyed and not hmac.compare_digest(str(mac), str(entry.hmac)):
        raise corrupt_error(
            path, stream, step,
            "HMAC signature does not match: the file (or its index entry) was changed or moved "
            "to another step or stream after dumping, or the key differs from the one used to dump",
        )


def _decode(file: Any, *, trusted: bool, source: str, stream: StreamId | None, step: int | None) -> Any:
    try:
        return codec.decode(codec.BytesSource(file.read(), source), trusted=trusted)
    except UnsafePickleError as exc:
        exc.step, exc.split = step, None if stream is None else stream.split
        raise


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
    """Load a local step file, checking size, checksum and signature against ``entry``.

    With the safe loader the checksum is computed while the file is decoded (one read). When the
    file will be unpickled without restrictions (``trusted``) or must be authenticated
    (``hmac_key``), the whole file is verified *before* anything is unpickled, so a tampered file
    never gets to run code. A configured ``hmac_key`` is checked even when ``verify`` is off, and
    even without an entry (then the file is refused: it cannot be authenticated).
    """
    from rollout_mock.codec import FileSource

    source = str(path)
    if hmac_key is not None:
        _require_signature(path, entry, stream, step)
    try:
        opened = FileSource(path)  # one open (and one read of the head) serves the whole load
    except FileNotFoundError:
        raise corrupt_error(path, stream, step, "the file listed in the manifest is missing") from None
    try:
        size = opened.size()
        if entry is not None and size != entry.size:
            raise corrupt_error(path, stream, step, f"size is {size} bytes, manifest says {entry.size}")
        if _format_version(opened) == 2:
            return _load_v2(opened, entry, stream=stream, step=step, trusted=trusted, verify=verify,
                            hmac_key=hmac_key)
        if entry is not None and (trusted or hmac_key is not None):
            # authenticated (or unpickled without restrictions): one read, and exactly the bytes
            # checked are decoded; a second read of the file could return other bytes
            data = bytearray(size)
            opened.readinto_range(0, data)
            return load_bytes_verified(data, entry, where=source, stream=stream, step=step,
                                       trusted=trusted, verify=True, hmac_key=hmac_key)
    finally:
        opened.close()

    def decode_path(failure: str) -> Any:
        with open(path, "rb") as file:
            try:
                return _decode(file, trusted=trusted, source=source, stream=stream, step=step)
            except UnsafePickleError:
                raise
            except Exception as exc:
                raise corrupt_error(path, stream, step, f"{failure} ({exc!r})") from exc

    if entry is None or not (verify or hmac_key is not None):
        return decode_path("cannot be decoded")
    try:
        batch, result = read_hashed(
            path, lambda f: _decode(f, trusted=trusted, source=source, stream=stream, step=step)
        )
    except Exception as exc:
        _check(path, entry, stream, step, *file_digest(path), keyed=False)
        if isinstance(exc, UnsafePickleError):
            raise
        raise corrupt_error(path, stream, step, f"checksum matches but decoding failed ({exc!r})") from exc
    _check(path, entry, stream, step, result.checksum, result.hmac, keyed=False)
    return batch


def _format_version(source: Any) -> int | None:
    from rollout_mock.codec import sniff_version

    try:
        return sniff_version(source.read_range(0, min(64, source.size())))
    except CorruptStepError:
        return None


def _authenticated(source: Any, entry: StepEntry | None, *, stream: StreamId | None, step: int | None,
                   hmac_key: bytes) -> Any:
    """The step's bytes read ONCE into private memory and authenticated there; what is decoded
    and handed out afterwards is exactly these bytes (a file or object changed after this read
    cannot show through, as it could through a second read or a mapping)."""
    from rollout_mock.codec import BytesSource

    context = _require_signature(source.name, entry, stream, step)
    assert entry is not None  # _require_signature refuses a step without an entry
    size = source.size()
    if size != entry.size:
        raise corrupt_error(source.name, stream, step, f"size is {size} bytes, manifest says {entry.size}")
    buffer = bytearray(size)
    view, digest, pos = memoryview(buffer), Digest(hmac_key, context), 0
    while pos < size:
        length = min(16 << 20, size - pos)
        source.readinto_range(pos, view[pos:pos + length])
        digest.update(view[pos:pos + length])
        pos += length
    _check(source.name, entry, stream, step, *digest.finish(), keyed=True)
    return BytesSource(buffer, source.name)


def open_verified(source: ByteSource, entry: StepEntry | None, *, stream: StreamId | None, step: int | None,
                  trusted: bool, verify: bool, hmac_key: bytes | None) -> StepView:
    """A format-2 step opened lazily (:class:`~rollout_mock.codec.StepView`) and checked:
    the one read path of full, partial and lazy (mapped or not) loads, on every backend.

    Without a key, ``verify`` checks the size and the whole-file CRC-32 against the index (from
    the chunk table, without reading the data), and every chunk handed out is CRC-checked as it
    is read. With a key the whole step is read once into private memory and authenticated, and
    the view decodes those bytes only (see :func:`_authenticated`), whatever ``verify`` and the
    source (a mapping, a file, ranged GETs) are.
    """
    from rollout_mock.codec import open_step

    if entry is not None and source.size() != entry.size:
        raise corrupt_error(source.name, stream, step, f"size is {source.size()} bytes, manifest says {entry.size}")
    if hmac_key is not None:
        source = _authenticated(source, entry, stream=stream, step=step, hmac_key=hmac_key)
        verify = True
    view = open_step(source, trusted=trusted, verify=verify)
    if verify and hmac_key is None and entry is not None:
        checksum = f"crc32:{view.file_crc32():08x}"
        if checksum != entry.checksum:
            raise corrupt_error(source.name, stream, step, f"checksum {checksum} does not match the "
                                f"manifest's {entry.checksum}")
    return view


def _load_v2(source: Any, entry: StepEntry | None, *, stream: StreamId | None, step: int | None,
             trusted: bool, verify: bool, hmac_key: bytes | None) -> Any:
    """A whole format-2 step through :func:`open_verified`, with errors that name their cause."""
    path = source.name
    try:
        return open_verified(source, entry, stream=stream, step=step, trusted=trusted, verify=verify,
                             hmac_key=hmac_key).load()
    except UnsafePickleError as exc:
        exc.step, exc.split = step, None if stream is None else stream.split
        raise
    except CorruptStepError as exc:
        if exc.step is not None:
            raise
        if entry is not None and (verify or hmac_key is not None):
            # say what changed: a checksum that differs names the cause (the file was
            # damaged or replaced); only a matching one means a decoder problem
            checksum, _ = source_digest(source)
            if checksum != entry.checksum:
                raise corrupt_error(path, stream, step, f"checksum {checksum} does not match the "
                                    f"manifest's {entry.checksum} ({exc})") from exc
            raise corrupt_error(path, stream, step, f"checksum matches but decoding failed ({exc})") from exc
        raise corrupt_error(path, stream, step, f"cannot be decoded ({exc})") from exc


def load_source_verified(source: Any, entry: StepEntry, *, stream: StreamId, step: int, trusted: bool,
                         verify: bool = True, hmac_key: bytes | None = None) -> Any:
    """Like :func:`load_verified` for a step behind a ranged-read source (an object store): a
    format-2 step is read chunk by chunk straight into its tensors (memory: the batch plus one
    chunk, not the file twice); a format-1 step is read whole, then checked and decoded."""
    if hmac_key is not None:
        _require_signature(source.name, entry, stream, step)
    if source.size() != entry.size:
        raise corrupt_error(source.name, stream, step, f"size is {source.size()} bytes, manifest says {entry.size}")
    if _format_version(source) == 2:
        return _load_v2(source, entry, stream=stream, step=step, trusted=trusted, verify=verify, hmac_key=hmac_key)
    data = bytearray(entry.size)
    source.readinto_range(0, data)
    return load_bytes_verified(data, entry, where=source.name, stream=stream, step=step, trusted=trusted,
                               verify=verify, hmac_key=hmac_key)


def load_bytes_verified(
    data: bytes | bytearray,
    entry: StepEntry,
    *,
    where: str,
    stream: StreamId | None,
    step: int | None,
    trusted: bool,
    verify: bool = True,
    hmac_key: bytes | None = None,
) -> Any:
    """Like :func:`load_verified` for a step already read into memory (object stores)."""
    context = _require_signature(where, entry, stream, step) if hmac_key is not None else b""
    if len(data) != entry.size:
        raise corrupt_error(where, stream, step, f"size is {len(data)} bytes, manifest says {entry.size}")
    if verify or hmac_key is not None:
        digest = Digest(hmac_key, context)
        digest.update(data)
        _check(where, entry, stream, step, *digest.finish(), keyed=hmac_key is not None)
    try:
        return _decode(io.BytesIO(data), trusted=trusted, source=where, stream=stream, step=step)
    except UnsafePickleError:
        raise
    except Exception as exc:
        raise corrupt_error(where, stream, step, f"cannot be decoded ({exc!r})") from exc
