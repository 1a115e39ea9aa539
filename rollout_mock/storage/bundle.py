"""One-file bundles (``.rmb``): a few steps of a dump in one file that opens anywhere.

A bundle holds the files of a small dump under their dump-relative names: ``manifest.json``
(only the bundled steps), the step files byte for byte (data-only, their CRC-32 and HMAC
unchanged) and ``expected/*.jsonl``. :class:`BundleBackend` reads it in place (a read-only
:class:`~rollout_mock.storage.backend.ByteBackend`: the one :class:`~rollout_mock.storage.store.Store`
loads and verifies steps from it as from a directory); :class:`BundleWriter` writes one, a
write-only one-file backend.

The copies of a few steps live here too, as operations of the store (``Store.slice``, ``pack``,
``pull``, ``unpack``): :func:`slice_store` chooses the files (the chosen steps' files byte for byte,
their CRC-32 checked on the way; a ``manifest.json`` of only those steps with every field as
recorded; the packs of their further calls; the rows of those steps of the dump run's metrics),
and :func:`copy_parts` writes them into a :class:`BundleWriter` (``pack``) or into a
:class:`StagedDirectory`, a new dump directory renamed into place whole (``pull``, ``unpack``).
``rollout-mock pack``/``unpack``/``pull`` (:mod:`rollout_mock.cli.bundle`) are their commands.

Format, version 1 (integers little-endian)::

    0              header, 32 bytes: magic b"\x89RMB\r\n\x1a\n", u16 version (1),
                   u16 flags (0), u32 alignment (4096), 16 zero bytes
    ...            the members' bytes, each at an offset that is a multiple of the alignment,
                   zero bytes in between
    toc_offset     table of contents, UTF-8 JSON: {"format": "rollout_mock.bundle", "version": 1,
                   "meta": {...}, "members": [{"name", "offset", "size", "sha256"}, ...]}
                   (members in ascending offsets)
    size - 64      footer, 64 bytes: u64 toc_offset, u64 toc_size, SHA-256 of the TOC (32 bytes),
                   8 zero bytes, b"RMB-END\n"

Nothing is compressed (a ``grep`` of the file sees what it holds). The **bundle digest**
(``sha256:`` of the TOC, in the footer) covers every member through the SHA-256 the TOC gives
it; :meth:`Bundle.scan` checks every byte (members, zero padding); a read in place checks the
TOC, and each member up to 1 MiB read whole (the manifest, metrics, small steps) against its
SHA-256; larger steps, read whole or in ranges, are covered by their own CRC-32 (and HMAC), which
the store checks on every load.

Every reader refuses, with a :class:`~rollout_mock.errors.BundleError` naming the file: a short
or truncated file, a bad magic, header or footer, a newer version, a TOC over
:data:`MAX_TOC_BYTES` or failing its SHA-256, more than :data:`MAX_MEMBERS` members (counted
before the JSON is parsed), offsets or sizes outside the file, overlapping members, names that
are not plain relative paths of safe components (``..``, absolute, backslashes, NUL, a name that
is also a directory of another) and a member failing its SHA-256. No allocation is larger than
the file itself, whatever the TOC says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import struct
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rollout_mock.crc import crc32
from rollout_mock.errors import BundleError, DebugInputError, DumpNotWritableError, ManifestError, UnsafePathError
from rollout_mock.jsonio import loads_bounded
from rollout_mock.storage.backend import BackendDefaults
from rollout_mock.storage.directory import LocalBackend, TempFile, fsync_dir, fsync_path, temp_name
from rollout_mock.storage.index import MANIFEST_BYTES, pack_relpath
from rollout_mock.storage.manifest import (
    FORMAT,
    MANIFEST_NAME,
    StepEntry,
    StreamId,
    dumps_manifest,
    format_ranges,
    parse_manifest,
)
from rollout_mock.storage.paths import check_relpath, is_url, open_regular
from rollout_mock.storage.verified import corrupt_error
from rollout_mock.text import ProgressBar, progress_bar, short_repr
from rollout_mock.version import __version__

if TYPE_CHECKING:
    from rollout_mock.storage.store import Store

__all__ = [
    "ALIGNMENT", "BUNDLE_FORMAT", "CHECKED_READ_BYTES", "INFO_NAME", "MAGIC", "MAX_EXPECTED_BYTES", "MAX_MEMBERS",
    "MAX_TOC_BYTES", "SUFFIX", "VERSION", "Bundle", "BundleBackend", "BundleInfo", "BundleWriter", "DumpSlice",
    "Member", "Part", "StagedDirectory", "copy_parts", "is_bundle", "open_bundle", "pack_store", "pull_store",
    "slice_store", "unpack_bundle",
]

MAGIC = b"\x89RMB\r\n\x1a\n"
END_MAGIC = b"RMB-END\n"
VERSION = 1
BUNDLE_FORMAT = "rollout_mock.bundle"
SUFFIX = ".rmb"
#: Members start at multiples of this (a member can be mapped on its own).
ALIGNMENT = 4096
#: Largest table of contents read (65,536 members take about 10 MB).
MAX_TOC_BYTES = 16 << 20
#: Most members a bundle may list (checked before the table of contents is parsed).
MAX_MEMBERS = 65_536
#: Longest member name.
MAX_NAME = 512
#: A member up to this size read whole in place (the manifest, metrics, small steps) is checked
#: against its SHA-256; a larger one is a step, checked by its CRC-32 on every load (SHA-256 runs
#: at ~1.7 GB/s, CRC-32 at ~17: hashing a large step twice would double the cost of a load).
CHECKED_READ_BYTES = 1 << 20
#: Where ``rollout-mock unpack`` writes the bundle's description (digest, meta) in the dump it
#: makes (a name no member may have).
INFO_NAME = "bundle.json"
_HEADER = struct.Struct("<8sHHI16s")
_FOOTER = struct.Struct("<QQ32s8s8s")
_CHUNK = 8 << 20
_COMPONENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127}", re.ASCII)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
_FORGED = "the bundle was forged or damaged; ask for a new copy"


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------

def _check_name(name: object, where: str) -> str:
    """``name`` if it is a member name a bundle may hold (a plain relative path of components
    of letters, digits, ``_ . -``, none ``.`` or ``..``, not :data:`INFO_NAME`), else BundleError."""
    shown = short_repr(name, 80)
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise BundleError(f"{where}: member name {shown} is not a string of 1-{MAX_NAME} characters; {_FORGED}",
                          path=where)
    try:
        check_relpath(name)
    except UnsafePathError:
        raise BundleError(f"{where}: member name {shown} is not a plain relative path ('..', absolute paths, "
                          f"backslashes and NUL are refused): {_FORGED}", path=where) from None
    if not all(_COMPONENT.fullmatch(part) for part in name.split("/")) or name == INFO_NAME:
        raise BundleError(f"{where}: member name {shown} holds a component that is not letters, digits, '_', '.' "
                          f"or '-' (or is reserved): {_FORGED}", path=where)
    return name


def _starts_with_magic(path: Path) -> bool:
    """Whether the regular file ``path`` begins with the bundle magic (never blocks on a FIFO)."""
    try:
        fd = open_regular(os.fspath(path))
    except (OSError, UnsafePathError):
        return False
    try:
        return os.read(fd, len(MAGIC)) == MAGIC
    finally:
        os.close(fd)


def is_bundle(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a bundle: a URL ending in ``.rmb``, or a local regular file
    that ends in ``.rmb`` or starts with the bundle magic (so a mis-named bundle still opens, and
    a ``.rmb`` that is not one gets :class:`BundleError` rather than "not a directory")."""
    text = os.fspath(location)
    if is_url(text) and not text.startswith("file://"):
        return text.rstrip("/").endswith(SUFFIX)
    path = text.removeprefix("file://")
    if not os.path.isfile(path):
        return False
    if path.endswith(SUFFIX):
        return True
    try:
        fd = open_regular(path)  # (never blocks on a FIFO swapped in meanwhile)
    except (OSError, UnsafePathError):
        return False
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

class _Ranged(Protocol):
    """What a bundle is read through: its size and reads of exact ranges."""

    where: str
    size: int

    def pread(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


class _LocalFile:
    """A local bundle file, held open (a regular file only: no FIFO or device is opened)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.where = os.fspath(path)
        self.fd = -1
        self.fd = open_regular(path)
        self.size = os.fstat(self.fd).st_size

    def pread(self, offset: int, length: int) -> bytes:
        parts, got = [], 0
        while got < length:
            piece = os.pread(self.fd, min(length - got, 1 << 30), offset + got)
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        if got != length:
            raise BundleError(f"{self.where}: the file ended at byte {offset + got} while reading {length} bytes at "
                              f"{offset}: it was truncated (or replaced) while open", path=self.where)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class _StoredObject:
    """A bundle stored as one object of a backend (``s3://bucket/x.rmb``): ranged reads."""

    def __init__(self, backend: Any, rel: str) -> None:
        self.backend, self.rel = backend, rel
        self.where = backend.where(rel)
        size = backend.size(rel)
        if size is None:
            raise FileNotFoundError(f"bundle not found: {self.where}")
        self.size = int(size)

    def pread(self, offset: int, length: int) -> bytes:
        data = self.backend.read(self.rel, offset, offset + length) if length else b""
        if data is None or len(data) != length:
            raise BundleError(f"{self.where}: short read at {offset} ({0 if data is None else len(data)} of {length} "
                              f"bytes): the object was truncated or replaced while open", path=self.where)
        return bytes(data)

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Member:
    """One file of a bundle: its dump-relative name, where its bytes are, their SHA-256 (hex)."""

    name: str
    offset: int
    size: int
    sha256: str

    @property
    def end(self) -> int:
        return self.offset + self.size


class Bundle:
    """A bundle opened for reading: header, footer and table of contents checked (see the module
    docstring); nothing else is read until asked. Thread-safe (positioned reads)."""

    def __init__(self, source: _Ranged) -> None:
        self.source = source
        self.where = source.where
        self.members: dict[str, Member] = {}
        self.meta: dict[str, Any] = {}
        self.digest = ""
        self.toc_offset = 0
        self._dirs: dict[str, list[str]] = {}
        try:
            self._load()
        except BaseException:
            source.close()
            raise

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Bundle:
        """A local bundle file (``FileNotFoundError`` if absent)."""
        return cls(_LocalFile(path))

    def __repr__(self) -> str:
        return f"Bundle({self.where!r}, {len(self.members)} members)"

    def close(self) -> None:
        self.source.close()

    def _bad(self, why: str) -> BundleError:
        return BundleError(f"{self.where}: {why}", path=self.where)

    def _load(self) -> None:
        size = self.source.size
        if size < _HEADER.size + _FOOTER.size:
            raise self._bad(f"{size} bytes, too short to be a rollout_mock bundle (a {_HEADER.size}-byte header and a "
                            f"{_FOOTER.size}-byte footer at least): truncated, or not a bundle")
        magic, version, flags, alignment, reserved = _HEADER.unpack(self.source.pread(0, _HEADER.size))
        if magic != MAGIC:
            raise self._bad("not a rollout_mock bundle (it does not start with the bundle magic); make one with "
                            "`rollout-mock pack DUMP --steps N -o FILE.rmb`")
        if version > VERSION:
            raise self._bad(f"written by bundle format version {version}, but this rollout_mock ({__version__}) reads "
                            f"versions up to {VERSION}; upgrade rollout_mock")
        if version < 1 or flags or any(reserved) or not 0 < alignment <= 1 << 20 or alignment & (alignment - 1):
            raise self._bad(f"malformed bundle header (version {version}, flags {flags}, alignment {alignment}); "
                            f"{_FORGED}")
        toc_offset, toc_size, toc_sha, zeros, end = _FOOTER.unpack(self.source.pread(size - _FOOTER.size, _FOOTER.size))
        if end != END_MAGIC or any(zeros):
            raise self._bad("no bundle footer at its end: the file is truncated (an interrupted download or copy?) "
                            "or something was appended to it; ask for a new copy")
        if toc_size > MAX_TOC_BYTES:
            raise self._bad(f"its table of contents is {toc_size:,} bytes, more than the {MAX_TOC_BYTES:,} accepted; "
                            f"{_FORGED}")
        if toc_offset < _HEADER.size or toc_offset + toc_size != size - _FOOTER.size:
            raise self._bad(f"the footer places the table of contents at {toc_offset:,} ({toc_size:,} bytes), which "
                            f"does not end where the footer starts ({size - _FOOTER.size:,}): truncated or {_FORGED}")
        toc = self.source.pread(toc_offset, toc_size)
        if hashlib.sha256(toc).digest() != toc_sha:
            raise self._bad(f"the table of contents fails its SHA-256: {_FORGED}")
        if toc.count(b"{") + toc.count(b"[") > 2 * MAX_MEMBERS + 4096:  # before parsing: no object bomb
            raise self._bad(f"the table of contents lists more than {MAX_MEMBERS:,} members (or nests that many "
                            f"values); {_FORGED}")
        doc = loads_bounded(toc, where=self.where, error=BundleError, what="bundle table of contents",
                            max_bytes=MAX_TOC_BYTES, fix=_FORGED)
        if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT or doc.get("version") != version:
            raise self._bad(f"the table of contents is not a {BUNDLE_FORMAT} version {version} one; {_FORGED}")
        members, meta = doc.get("members"), doc.get("meta", {})
        if not isinstance(members, list) or not isinstance(meta, dict):
            raise self._bad(f"the table of contents has no member list (or a meta that is not an object); {_FORGED}")
        if len(members) > MAX_MEMBERS:
            raise self._bad(f"the table of contents lists {len(members):,} members, more than {MAX_MEMBERS:,}; "
                            f"{_FORGED}")
        self.toc_offset, self.meta = toc_offset, meta
        self.digest = "sha256:" + toc_sha.hex()
        self._check_members(members)

    def _check_members(self, raw: list[Any]) -> None:
        position = _HEADER.size
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"name", "offset", "size", "sha256"}:
                raise self._bad(f"member {short_repr(item, 120)} is not {{name, offset, size, sha256}}; {_FORGED}")
            name = _check_name(item["name"], self.where)
            offset, size, digest = item["offset"], item["size"], item["sha256"]
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (offset, size)) or \
                    not isinstance(digest, str) or not _HEX64.fullmatch(digest):
                raise self._bad(f"member {name!r} has a bad offset, size or sha256 ({short_repr(item, 160)}); "
                                f"{_FORGED}")
            if offset < position or offset + size > self.toc_offset:
                raise self._bad(f"member {name!r} at {offset:,} ({size:,} bytes) overlaps the previous member or the "
                                f"header, or runs past the table of contents at {self.toc_offset:,}; {_FORGED}")
            if name in self.members:
                raise self._bad(f"member {name!r} is listed twice; {_FORGED}")
            self.members[name] = Member(name, offset, size, digest)
            position = offset + size
        dirs: dict[str, set[str]] = {}
        for name in self.members:  # a name that is also another's directory cannot be unpacked
            parts = name.split("/")
            for i, part in enumerate(parts):
                parent = "/".join(parts[:i])
                if i and parent in self.members:
                    raise self._bad(f"member {parent!r} is both a file and the directory of {name!r}; {_FORGED}")
                dirs.setdefault(parent, set()).add(part)
        self._dirs = {key: sorted(names) for key, names in dirs.items()}

    # ------------------------------------------------------------------ access
    def listdir(self, rel_dir: str) -> list[str]:
        """Names directly under ``rel_dir`` (``""``: the top)."""
        return list(self._dirs.get(rel_dir, ()))

    @property
    def payload_bytes(self) -> int:
        return sum(m.size for m in self.members.values())

    def _check(self, member: Member, digest: str) -> None:
        if digest != member.sha256:
            raise self._bad(f"member {member.name!r} fails its SHA-256 (the file was damaged in transit or edited); "
                            f"ask for a new copy")

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start:end)`` of member ``name`` (slice semantics), or None if absent; a
        member of at most :data:`CHECKED_READ_BYTES` read whole is checked against its SHA-256."""
        member = self.members.get(name)
        if member is None:
            return None
        start = min(max(start, 0), member.size)
        stop = member.size if end is None else min(max(end, 0), member.size)
        if stop <= start:
            return b""
        data = self.source.pread(member.offset + start, stop - start)
        if start == 0 and stop == member.size and member.size <= CHECKED_READ_BYTES:
            self._check(member, hashlib.sha256(data).hexdigest())
        return data

    def chunks(self, member: Member, bar: ProgressBar | None = None) -> Iterator[bytes]:
        """A member's bytes, piece by piece, checked against its SHA-256 after the last piece
        (the caller discards what it wrote on the error)."""
        digest = hashlib.sha256()
        for start in range(0, member.size, _CHUNK):
            piece = self.source.pread(member.offset + start, min(_CHUNK, member.size - start))
            digest.update(piece)
            if bar is not None:
                bar.update(len(piece))
            yield piece
        self._check(member, digest.hexdigest())

    def check_gap(self, start: int, end: int) -> None:
        """The bytes ``[start, end)`` between members are zero (alignment padding)."""
        for offset in range(start, end, _CHUNK):
            if any(self.source.pread(offset, min(_CHUNK, end - offset))):
                raise self._bad(f"non-zero bytes between members at {offset:,}: {_FORGED}")

    def ordered(self) -> list[Member]:
        return sorted(self.members.values(), key=lambda m: m.offset)

    def scan(self, bar: ProgressBar | None = None) -> Iterator[tuple[Member, Iterator[bytes]]]:
        """Every member in file order with its pieces (:meth:`chunks`: consume them before the
        next member), the padding around it checked zero: a full pass checks every byte."""
        position = _HEADER.size
        for member in self.ordered():
            self.check_gap(position, member.offset)
            yield member, self.chunks(member, bar)
            position = member.end
        self.check_gap(position, self.toc_offset)

    def verify(self, *, progress: bool | None = False) -> None:
        """Check every byte (:meth:`scan`); :class:`BundleError` naming the first bad member."""
        bar = progress_bar(self.payload_bytes, enabled=progress, desc="verify")
        try:
            for _, pieces in self.scan(bar):
                for _ in pieces:
                    pass
        finally:
            bar.close()


def open_bundle(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> Bundle:
    """The bundle at a local path or a URL (``s3://bucket/bad-step.rmb``: ranged reads)."""
    text = os.fspath(location)
    if is_url(text) and not text.startswith("file://"):
        from rollout_mock.storage.objectstore import FsspecBackend

        parent, _, name = text.rstrip("/").rpartition("/")
        if not name or parent.endswith(":/"):
            raise BundleError(f"{text}: a bundle URL names an object inside a bucket (s3://bucket/x.rmb)", path=text)
        return Bundle(_StoredObject(FsspecBackend(parent, storage_options=storage_options), name))
    return Bundle.open(text.removeprefix("file://"))


class BundleBackend(BackendDefaults):
    """A bundle read in place, as a **read-only** byte backend: ``Store(BundleBackend(b))`` (what
    :func:`~rollout_mock.storage.store.open_store` builds for a ``.rmb``) loads, verifies (CRC-32,
    HMAC) and replays its steps like a dump directory's; every write is refused with
    :class:`~rollout_mock.errors.DumpNotWritableError` saying to unpack it first."""

    def __init__(self, bundle: Bundle | str | os.PathLike[str]) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)

    def __repr__(self) -> str:
        return f"BundleBackend({self.bundle.where!r})"

    def where(self, rel: str) -> str:
        return f"{self.bundle.where}:{rel}" if rel else self.bundle.where

    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        return self.bundle.read(check_relpath(rel), start, end)

    def _refuse(self, rel: str) -> DumpNotWritableError:
        return DumpNotWritableError(
            f"[RolloutMock] {self.bundle.where} is a bundle, read-only: it replays in place, but nothing can be "
            f"written into it (here: {rel or 'the dump'}). Unpack it first: rollout-mock unpack "
            f"{shlex.quote(self.bundle.where)} -o DIR, and point dump_dir at DIR.", path=self.bundle.where)

    def create(self, rel: str, data: bytes) -> bool:
        raise self._refuse(rel)

    def replace(self, rel: str, data: bytes) -> None:
        raise self._refuse(rel)

    def remove(self, rels: list[str]) -> None:
        raise self._refuse(", ".join(rels[:3]))

    def lock(self, rel: str, holder: str, *, wait: float = 0.0) -> Any:
        raise self._refuse(rel)

    def listdir(self, rel_dir: str) -> list[str]:
        return self.bundle.listdir(check_relpath(rel_dir) if rel_dir else "")

    def size(self, rel: str) -> int | None:
        member = self.bundle.members.get(rel)
        return None if member is None else member.size

    def signature(self, rel: str) -> Hashable | None:
        member = self.bundle.members.get(rel)
        return None if member is None else (member.offset, member.size, member.sha256)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

@dataclass
class BundleInfo:
    """What :meth:`BundleWriter.commit` wrote."""

    path: Path
    size: int
    digest: str
    members: list[Member]
    meta: dict[str, Any] = field(default_factory=dict)


class _MemberUpload:
    """One member of a :class:`BundleWriter` being written (its :meth:`BundleWriter.open_upload`)."""

    def __init__(self, writer: BundleWriter, name: str) -> None:
        self.writer, self.name = writer, name
        self.offset = writer._begin(name)
        self.digest = hashlib.sha256()

    def write(self, data: memoryview) -> None:
        self.digest.update(data)
        self.writer._write(data)

    def commit(self) -> None:
        self.writer.members.append(Member(self.name, self.offset, self.writer.position - self.offset,
                                          self.digest.hexdigest()))

    def abort(self) -> None:
        return None  # the bundle is aborted as a whole


class BundleWriter:
    """A bundle being written: a write-only, one-file backend. Members are appended one after the
    other (:meth:`open_upload`, or :meth:`add`) into a temporary file beside ``path`` (a
    :class:`~rollout_mock.storage.directory.TempFile`, the atomic writer of every file); :meth:`commit`
    writes the table of contents and moves it into place (a reader sees no bundle or the whole
    one), :meth:`abort` (or an error in a ``with`` block) leaves nothing. An existing ``path`` is
    refused unless ``overwrite``."""

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False, alignment: int = ALIGNMENT) -> None:
        self.path, self.overwrite, self.alignment = Path(path), overwrite, alignment
        if self.path.is_dir():
            raise DebugInputError(f"{self.path} is a directory; name the bundle file to write, e.g. "
                                  f"{self.path / 'bad-step.rmb'}")
        if self.path.exists() or self.path.is_symlink():
            if not overwrite:
                raise DebugInputError(f"{self.path} exists; pick another name, or pass --overwrite (overwrite=True) "
                                      f"to replace it")
            if self.path.is_symlink() or not self.path.is_file() or not _starts_with_magic(self.path):
                raise DebugInputError(f"refusing to replace {self.path} with --overwrite: it is not a bundle "
                                      f"(--overwrite replaces only a bundle file); pick another name")
        self.upload = TempFile(self.path)
        self.members: list[Member] = []
        self._names: set[str] = set()
        self._write(_HEADER.pack(MAGIC, VERSION, 0, alignment, bytes(16)))

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            self.abort()

    @property
    def position(self) -> int:
        return self.upload.position

    def _write(self, data: bytes | memoryview) -> None:
        self.upload.write(memoryview(data).cast("B"))

    def _begin(self, name: str) -> int:
        if _check_name(name, str(self.path)) in self._names:
            raise BundleError(f"{self.path}: member {name!r} added twice", path=self.path)
        self._names.add(name)
        self._write(bytes(-self.position % self.alignment))
        return self.position

    def open_upload(self, rel: str) -> _MemberUpload:
        """Start member ``rel`` at the next aligned offset (write its bytes, then commit it, before
        the next member starts)."""
        return _MemberUpload(self, rel)

    def add(self, name: str, chunks: Iterable[bytes | memoryview]) -> Member:
        """Append a member (at the next aligned offset) from its bytes, piece by piece."""
        upload = self.open_upload(name)
        for chunk in chunks:
            upload.write(memoryview(chunk))
        upload.commit()
        return self.members[-1]

    def commit(self, meta: dict[str, Any]) -> BundleInfo:
        """Write the table of contents and the footer, fsync, and move the file into place."""
        toc = json.dumps({"format": BUNDLE_FORMAT, "version": VERSION, "meta": meta,
                          "members": [{"name": m.name, "offset": m.offset, "size": m.size, "sha256": m.sha256}
                                      for m in self.members]},
                         separators=(",", ":"), allow_nan=False).encode("utf-8")
        if len(toc) > MAX_TOC_BYTES or len(self.members) > MAX_MEMBERS:
            raise DebugInputError(f"{self.path}: {len(self.members):,} members, more than a bundle holds "
                                  f"({MAX_MEMBERS:,}); bundle fewer steps")
        digest = hashlib.sha256(toc).digest()
        toc_offset = self.position
        self._write(toc)
        self._write(_FOOTER.pack(toc_offset, len(toc), digest, bytes(8), END_MAGIC))
        size = self.position
        if self.overwrite:
            self.upload.commit()
        elif not self.upload.commit_new():  # refuses a file that appeared meanwhile
            raise DebugInputError(f"{self.path} appeared while the bundle was written; nothing was replaced")
        return BundleInfo(self.path, size, "sha256:" + digest.hex(), list(self.members), meta)

    def abort(self) -> None:
        self.upload.abort()


# ---------------------------------------------------------------------------------------------
# A selection of a dump: what pack and pull copy
# ---------------------------------------------------------------------------------------------

#: Largest expected-metrics file of a dump that is filtered into a selection.
MAX_EXPECTED_BYTES = 256 << 20


@dataclass(frozen=True)
class Part:
    """One file of a :class:`DumpSlice`: its dump-relative name, size, and its bytes as pieces."""

    name: str
    size: int
    read: Callable[[], Iterator[bytes]]


@dataclass
class DumpSlice:
    """The files of a dump restricted to some steps (see :func:`slice_dump`)."""

    source: str
    streams: dict[str, list[int]]
    parts: list[Part]
    expected_rows: int = 0

    @property
    def nbytes(self) -> int:
        return sum(part.size for part in self.parts)


def _whole(name: str, body: bytes) -> Part:
    return Part(name, len(body), lambda: iter([body]))


def _step_part(store: Store, stream: StreamId, step: int) -> Part:
    """A step file, read in pieces and checked against its index entry (size, CRC-32) as it is
    copied: a damaged step never goes into a bundle or a pulled dump."""
    entry = store.entry(stream, step)
    assert entry is not None
    return _file_part(store, entry, stream, step)


def _file_part(store: Store, entry: StepEntry, stream: StreamId, step: int | None) -> Part:
    """A file of the dump (``entry.file``) read in pieces, checked against ``entry``'s size and
    CRC-32 as it is copied."""
    rel, backend, where = entry.file, store.backend, store.where(entry.file)

    def pieces() -> Iterator[bytes]:
        size = backend.size(rel)
        if size != entry.size:
            raise corrupt_error(where, stream, step, "the file is missing" if size is None else
                                f"it has {size} bytes, its index entry says {entry.size}")
        crc, done = 0, 0
        while done < entry.size:
            piece = backend.read(rel, done, min(done + _CHUNK, entry.size))
            if not piece:
                raise corrupt_error(where, stream, step, f"it ended after {done} of {entry.size} bytes")
            crc = crc32(piece, crc)
            done += len(piece)
            yield piece
        if f"crc32:{crc:08x}" != entry.checksum:
            raise corrupt_error(where, stream, step, f"checksum crc32:{crc:08x} does not match the index's "
                                                     f"{entry.checksum}")

    return Part(rel, entry.size, pieces)


def _pack_parts(store: Store, stream: StreamId, steps: set[int]) -> list[Part]:
    """The packs of extra calls holding a call of ``steps``, whole (record and data; a replay of
    the selection ignores the calls of steps it does not hold), the data checked as it is copied."""
    parts = []
    for pack in store.packs(stream):
        if not any(call.step in steps for call in pack.calls) and not set(pack.drop) & steps:
            continue
        record = pack_relpath(stream, pack.seq, ".json")
        body = store.backend.read(record, 0, MANIFEST_BYTES + 1)
        if body is None:
            continue
        entry = StepEntry(file=pack.file, size=pack.size, checksum=pack.checksum, samples=None, type="", keys={},
                          written_at="")
        parts += [_whole(record, body), _file_part(store, entry, stream, None)]
    return parts


#: A metrics row's ``"step": N`` (rows are filtered on it before any is parsed), and the longest
#: row kept (a longer one is no metrics row the dump writer wrote: skipped).
_STEP_FIELD = re.compile(rb'"step"\s*:\s*(-?[0-9]{1,20})(?![0-9.eE])')
_MAX_ROW = 1 << 20


def _expected_parts(store: Store, steps: set[int]) -> tuple[list[Part], int]:
    """The dump run's metrics (:meth:`Store.expected_names`), each reduced to the rows of ``steps``
    (lines that do not parse, such as a torn last line, are left out); files left empty are
    dropped. Each file is read in pieces (bounded memory), and a line is parsed only when a
    ``"step"`` field of one of ``steps`` appears in it: 8 MB of other lines cost one
    regular-expression scan."""
    parts, rows = [], 0
    for rel in store.expected_names():
        kept = _rows_of_steps(store, rel, steps)
        if kept:
            parts.append(_whole(rel, b"".join(kept)))
            rows += len(kept)
    return parts, rows


def _rows_of_steps(store: Store, rel: str, steps: set[int]) -> list[bytes]:
    """The lines of ``rel`` whose ``step`` is one of ``steps`` (see :func:`_expected_parts`)."""
    kept: list[bytes] = []
    offset, carry, skipping = 0, b"", False
    while True:
        piece = store.read_expected(rel=rel, start=offset, end=offset + _CHUNK)
        if not piece:
            break
        offset += len(piece)
        if offset > MAX_EXPECTED_BYTES:
            raise DebugInputError(f"{store.where(rel)} is larger than {MAX_EXPECTED_BYTES:,} bytes; not bundled")
        block = carry + piece
        cut = block.rfind(b"\n") + 1
        if skipping and cut:  # the rest of an over-long line: dropped
            block, cut, skipping = block[block.find(b"\n") + 1:], cut - block.find(b"\n") - 1, False
        if not cut:
            carry, skipping = (b"", True) if skipping or len(block) > _MAX_ROW else (block, False)
            continue
        kept += _scan_rows(block[:cut], steps, store.where(rel))
        carry = block[cut:]
        if len(carry) > _MAX_ROW:
            carry, skipping = b"", True
        if len(piece) < _CHUNK:
            break
    if carry and not skipping:
        kept += _scan_rows(carry, steps, store.where(rel))
    return kept


def _scan_rows(block: bytes, steps: set[int], where: str) -> list[bytes]:
    kept: list[bytes] = []
    done = -1
    for match in _STEP_FIELD.finditer(block):
        if int(match.group(1)) not in steps:
            continue
        start = block.rfind(b"\n", 0, match.start()) + 1
        if start == done:
            continue
        done = start
        end = block.find(b"\n", match.end())
        line = block[start:len(block) if end < 0 else end + 1]
        if len(line) > _MAX_ROW:
            continue
        try:
            record = loads_bounded(line, where=where, what="metrics line", allow_nan=True)
        except ManifestError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step in steps:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    return kept


def slice_store(store: Store, *, steps: Sequence[int] | None, splits: Sequence[str] | None = None) -> DumpSlice:
    """The files of ``store``'s dump that hold ``steps`` (None: every step) of every stream of
    ``splits`` (None: all) that recorded them: a ``manifest.json`` listing only those steps (its
    fields, the streams' fields and the entries copied as recorded: rollout settings, request
    digests, calling conventions, fingerprint), the step files, and the expected metrics of those
    steps. Only the index and those steps' objects are read. :class:`DebugInputError` for a step
    recorded in no chosen stream or a split that is not there."""
    view = store.require_manifest(mode="read")
    source = store.where("")
    streams = [s for s in view.stream_ids() if splits is None or s.split in splits]
    if not streams:
        present = sorted({s.split for s in view.stream_ids()})
        raise DebugInputError(f"{source}: no split {', '.join(splits or ())} recorded (splits present: "
                              f"{', '.join(present) or 'none'})")
    if steps is not None:
        missing = [s for s in steps if not any(s in view.steps(stream) for stream in streams)]
        if missing:
            raise DebugInputError(
                f"{source}: steps {format_ranges(missing)} are recorded in no stream"
                + ("" if splits is None else f" of splits {list(splits)}")
                + f" (recorded: {'; '.join(f'{s}: {format_ranges(view.steps(s))}' for s in streams)})")
    chosen: dict[str, list[int]] = {}
    selected: dict[StreamId, list[int]] = {}
    parts: list[Part] = []
    for stream in streams:
        wanted = list(view.steps(stream)) if steps is None else [s for s in steps if s in view.steps(stream)]
        if not wanted:
            continue
        selected[stream] = chosen[stream.key] = wanted
        parts += [_step_part(store, stream, step) for step in wanted]
        parts += _pack_parts(store, stream, set(wanted))
    where = f"{source} ({MANIFEST_NAME} of the selection)"
    body = dumps_manifest(view.select(selected, source=where)).encode("utf-8")
    parse_manifest(body, where)  # what a reader will accept
    expected, rows = _expected_parts(store, {s for wanted in chosen.values() for s in wanted})
    return DumpSlice(source, chosen, [_whole(MANIFEST_NAME, body), *parts, *expected], rows)


# ---------------------------------------------------------------------------------------------
# A new dump directory
# ---------------------------------------------------------------------------------------------

#: What a dump directory holds at its top (files; directories are splits, expected/...).
_DUMP_TOP_FILES = frozenset({MANIFEST_NAME, INFO_NAME, "provenance.json"})  # the last: cut's (debug.cut)


def _replaceable(dst: Path) -> str | None:
    """Why the non-empty directory ``dst`` may not be replaced by ``--overwrite`` (None: it is a
    dump: a rollout_mock ``manifest.json``, and no file at its top a dump does not hold)."""
    manifest = dst / MANIFEST_NAME
    if manifest.is_symlink() or not manifest.is_file():
        return f"it is not a dump (no {MANIFEST_NAME})"
    try:
        head = manifest.open("rb").read(4096)
    except OSError as exc:
        return f"its {MANIFEST_NAME} cannot be read ({exc.strerror})"
    if FORMAT.encode() not in head:
        return f"its {MANIFEST_NAME} is not a rollout_mock manifest"
    for entry in os.scandir(dst):
        if entry.is_symlink() or (not entry.is_dir(follow_symlinks=False) and entry.name not in _DUMP_TOP_FILES
                                  and not entry.name.startswith(".")):
            return f"it holds {entry.name!r}, which is no part of a dump"
    return None


class StagedDirectory:
    """A new dump directory, written into a temporary directory beside ``dst`` (:meth:`open_upload`:
    each file a :class:`~rollout_mock.storage.directory.TempFile` at a name the
    :class:`~rollout_mock.storage.directory.LocalBackend` there checks: no link followed, no name
    outside it) and renamed into place at :meth:`commit`, every file and folder fsync-ed first (a
    reader sees no directory or the whole one). ``dst`` must not exist or be empty, unless
    ``overwrite`` (then it is replaced, when it is a dump and holds none of ``protect``)."""

    def __init__(self, dst: str | os.PathLike[str], *, overwrite: bool, protect: Sequence[str] = ()) -> None:
        self.dst = Path(dst)
        self.replaces = False
        if self.dst.is_symlink() or (self.dst.exists() and not self.dst.is_dir()):
            raise DebugInputError(f"{self.dst} exists and is not a directory; pick a new directory for the dump")
        if self.dst.is_dir() and any(self.dst.iterdir()):
            if not overwrite:
                raise DebugInputError(f"{self.dst} is not empty; pick a new or empty directory, or pass --overwrite "
                                      f"(overwrite=True) to replace it")
            real = os.path.realpath(self.dst)
            for kept in protect:
                inside = os.path.realpath(kept)
                if inside == real or inside.startswith(real.rstrip(os.sep) + os.sep):
                    raise DebugInputError(f"refusing to replace {self.dst}: it holds {kept}, which is being read")
            why = _replaceable(self.dst)
            if why is not None:  # --overwrite replaces a dump, never a folder of other files
                raise DebugInputError(f"refusing to replace {self.dst} with --overwrite: {why}; pick a new or "
                                      f"empty directory")
            self.replaces = True
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.temp = self.dst.parent / temp_name(self.dst.name)
        os.mkdir(self.temp, 0o755)
        self.backend = LocalBackend(self.temp)

    def __enter__(self) -> StagedDirectory:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            self.abort()

    def open_upload(self, rel: str) -> TempFile:
        """A file of the new directory (its fsyncs wait for :meth:`commit`: nothing is visible before)."""
        return TempFile(self.backend.path(rel), durable=False)

    def replace(self, rel: str, data: bytes) -> None:
        upload = self.open_upload(rel)
        try:
            upload.write(memoryview(data))
        except BaseException:
            upload.abort()
            raise
        upload.commit()

    def commit(self) -> None:
        """Move the directory into place (replacing ``dst`` when allowed), durably (every file
        and folder of it fsync-ed first, deepest first)."""
        for folder, _, files in sorted(os.walk(self.temp), key=lambda item: len(item[0]), reverse=True):
            for name in files:
                fsync_path(Path(folder) / name)
            fsync_dir(Path(folder))
        if not self.replaces:
            try:
                os.rename(self.temp, self.dst)  # replaces an empty directory, refuses a non-empty one
            except OSError as exc:
                self.abort()
                raise DebugInputError(f"{self.dst} could not be created ({exc.strerror}): it was filled meanwhile?") \
                    from None
        else:
            backup = self.dst.parent / temp_name(self.dst.name + ".old")
            os.rename(self.dst, backup)
            try:
                os.rename(self.temp, self.dst)
            except BaseException:
                os.rename(backup, self.dst)
                raise
            shutil.rmtree(backup)
        fsync_dir(self.dst.parent)

    def abort(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# pack, pull, unpack: a selection copied into a one-file backend or a new dump directory
# ---------------------------------------------------------------------------------------------

class _Target(Protocol):
    """Where a selection is copied: a backend that takes uploads (a bundle, a staged directory)."""

    def open_upload(self, rel: str) -> Any: ...


def copy_parts(parts: Iterable[tuple[str, Iterable[bytes | memoryview]]], target: _Target,
               bar: ProgressBar | None = None) -> None:
    """Write each ``(name, pieces)`` into ``target`` as one upload (committed whole, or aborted)."""
    for name, pieces in parts:
        upload = target.open_upload(name)
        try:
            for piece in pieces:
                upload.write(memoryview(piece))
                if bar is not None:
                    bar.update(len(piece))
            upload.commit()
        except BaseException:
            upload.abort()
            raise


def pack_store(store: Store, out: str | os.PathLike[str], *, steps: Sequence[int], splits: Sequence[str] | None = None,
               meta: dict[str, Any] | None = None, overwrite: bool = False,
               progress: bool | None = False) -> BundleInfo:
    """Write ``steps`` of ``store``'s dump (:func:`slice_store`) as the bundle ``out``, a one-file
    backend (:class:`BundleWriter`). ``meta`` is added to the bundle's description (``tolerances``,
    ``redacted``...); the description also says which streams and steps it holds, how many
    expected-metrics rows, and which rollout_mock wrote it (not where the dump was: nothing private)."""
    chosen = slice_store(store, steps=steps, splits=splits)
    description = {"created_by": f"rollout_mock {__version__}", "streams": chosen.streams,
                   "expected_rows": chosen.expected_rows, **(meta or {})}
    bar = progress_bar(chosen.nbytes, enabled=progress, desc="pack")
    try:
        with BundleWriter(out, overwrite=overwrite) as writer:
            copy_parts(((part.name, part.read()) for part in chosen.parts), writer, bar)
            return writer.commit(description)
    finally:
        bar.close()


def pull_store(store: Store, dst: str | os.PathLike[str], *, steps: Sequence[int] | None,
               splits: Sequence[str] | None = None, overwrite: bool = False, protect: Sequence[str] = (),
               progress: bool | None = False) -> DumpSlice:
    """Copy ``steps`` of ``store``'s dump (:func:`slice_store`: only the index and those steps'
    objects are read) into the new local dump directory ``dst``, atomically (:class:`StagedDirectory`)."""
    chosen = slice_store(store, steps=steps, splits=splits)
    bar = progress_bar(chosen.nbytes, enabled=progress, desc="pull")
    try:
        with StagedDirectory(dst, overwrite=overwrite, protect=protect) as out:
            copy_parts(((part.name, part.read()) for part in chosen.parts), out, bar)
            out.commit()
    finally:
        bar.close()
    return chosen


def unpack_bundle(bundle: Bundle, dst: str | os.PathLike[str], *, overwrite: bool = False,
                  protect: Sequence[str] = (), progress: bool | None = False) -> Bundle:
    """Write the dump ``bundle`` holds into the dump directory ``dst`` (new or empty; a non-empty
    one only with ``overwrite``), atomically: every byte is checked on the way (each member's
    SHA-256, the padding: :meth:`Bundle.scan`), and nothing is left behind on an error. The
    bundle's digest and description go to ``dst/bundle.json``."""
    manifest = bundle.read(MANIFEST_NAME, 0, None)
    if manifest is None:
        raise BundleError(f"{bundle.where}: holds no {MANIFEST_NAME}: not a bundle of a dump", path=bundle.where)
    parse_manifest(manifest, f"{bundle.where}:{MANIFEST_NAME}")
    bar = progress_bar(bundle.payload_bytes, enabled=progress, desc="unpack")
    try:
        with StagedDirectory(dst, overwrite=overwrite, protect=protect) as out:
            copy_parts(((member.name, pieces) for member, pieces in bundle.scan()), out, bar)
            info = {"format": BUNDLE_FORMAT, "version": VERSION, "digest": bundle.digest, "meta": bundle.meta}
            out.replace(INFO_NAME, json.dumps(info, indent=1, allow_nan=False).encode("utf-8") + b"\n")
            out.commit()
    finally:
        bar.close()
    return bundle
