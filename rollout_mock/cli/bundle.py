"""``rollout-mock pack``, ``unpack`` and ``pull``: a few steps of a dump as one file to attach to
a bug report or send to a colleague, that file back as a dump directory, and a few steps fetched
from an object store (or a directory, or a bundle) into a local dump.

What they copy is one selection (:func:`slice_dump`): the chosen steps' files byte for byte
(data-only, their CRC-32 checked on the way, their HMACs unchanged), a ``manifest.json`` of only
those steps with every field of their entries and streams as recorded (rollout settings, request
digests, calling conventions, the environment fingerprint), and the rows of those steps of
``expected/*.jsonl``. :func:`pack_store` writes it as a bundle (:mod:`rollout_mock.storage.bundle`,
with the tolerances and a SHA-256 per member and of the whole), :func:`pull_store` as a dump
directory; :func:`unpack` turns a bundle back into one. Directories are written into a
temporary directory and renamed into place: nothing half-written is ever visible.

A bundle opens in place too: ``open_dump("bad-step.rmb")``, ``dump_dir: bad-step.rmb`` in mock
mode, ``rollout-mock ls bad-step.rmb``. Exit 0 written, 2 bad input (a step not recorded, an
existing output, a damaged bundle).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_mock.crc import crc32
from rollout_mock.errors import BundleError, DebugInputError, ManifestError
from rollout_mock.jsonio import loads_bounded
from rollout_mock.storage.bundle import (
    BUNDLE_FORMAT,
    INFO_NAME,
    VERSION,
    Bundle,
    BundleInfo,
    BundleWriter,
    is_bundle,
    open_bundle,
)
from rollout_mock.storage.directory import fsync_dir
from rollout_mock.storage.index import MANIFEST_BYTES, pack_relpath, read_doc
from rollout_mock.storage.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    StepEntry,
    StreamId,
    format_ranges,
    parse_manifest,
)
from rollout_mock.storage.paths import NAME_PATTERN, check_relpath, is_url, open_inside
from rollout_mock.storage.verified import corrupt_error
from rollout_mock.text import progress_bar, short_repr
from rollout_mock.version import __version__

if TYPE_CHECKING:
    from rollout_mock.storage.store import Store

__all__ = ["COMMANDS", "DumpSlice", "Part", "pack", "pack_store", "pull_store", "slice_dump", "unpack"]

#: Pieces steps and members are copied in.
_CHUNK = 8 << 20
#: Largest expected-metrics file of a dump that is filtered into a selection.
MAX_EXPECTED_BYTES = 256 << 20


# ------------------------------------------------------------------ outputs that spare the input
def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def local_input(store: Store) -> str | None:
    """The local file or directory a store reads (a dump directory, a bundle file), else None."""
    from rollout_mock.storage.bundle import BundleBackend

    local = store.backend.local_path("")
    if local is not None:
        return os.fspath(local)
    backend = store.backend
    if isinstance(backend, BundleBackend) and not is_url(backend.bundle.where):
        return backend.bundle.where
    return None


def refuse_own_input(out: str | os.PathLike[str], source: str | os.PathLike[str] | None, command: str) -> None:
    """:class:`DebugInputError` when the output ``out`` is the input ``source``, lies inside it
    or holds it (symlinks resolved): no command writes over what it reads."""
    if source is None or is_url(os.fspath(source)):
        return
    real_out, real_in = os.path.realpath(out), os.path.realpath(source)
    how = ("is" if real_out == real_in else "is inside" if _inside(real_out, real_in)
           else "holds" if _inside(real_in, real_out) else None)
    if how is not None:
        raise DebugInputError(f"rollout-mock {command}: refusing to write {out}: it {how} the input {source} "
                              f"(symlinks resolved); pick an output outside the input")


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


# ------------------------------------------------------------------ a new dump directory
class _DirWriter:
    """A new dump directory, written into a temporary directory beside ``dst`` and renamed into
    place at :meth:`commit` (a reader sees no directory or the whole one). ``dst`` must not exist
    or be empty, unless ``overwrite`` (then it is replaced, except when it holds one of
    ``protect``). Files are written with :func:`~rollout_mock.storage.paths.open_inside` (no link
    followed, created exclusively), so no name can land outside the directory."""

    def __init__(self, dst: str | os.PathLike[str], *, overwrite: bool, protect: Sequence[str] = ()) -> None:
        self.dst = Path(dst)
        self.replace = False
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
            self.replace = True
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.temp = self.dst.parent / f".{self.dst.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        os.mkdir(self.temp, 0o755)
        self.dirs: set[str] = set()

    def __enter__(self) -> _DirWriter:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            self.abort()

    def add(self, name: str, chunks: Iterable[bytes | memoryview]) -> int:
        fd = open_inside(self.temp, check_relpath(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, make_dirs=True)
        written = 0
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                written += view.nbytes
                while view.nbytes:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        parts = name.split("/")
        self.dirs.update("/".join(parts[:i]) for i in range(len(parts)))
        return written

    def commit(self) -> None:
        for rel in sorted(self.dirs, key=len, reverse=True):
            fsync_dir(self.temp / rel if rel else self.temp)
        if not self.replace:
            try:
                os.rename(self.temp, self.dst)  # replaces an empty directory, refuses a non-empty one
            except OSError as exc:
                self.abort()
                raise DebugInputError(f"{self.dst} could not be created ({exc.strerror}): it was filled meanwhile?") \
                    from None
        else:
            backup = self.dst.parent / f".{self.dst.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
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


# ------------------------------------------------------------------ the selection pack and pull copy

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
    """The dump's ``expected/*.jsonl`` metrics, each reduced to the rows of ``steps`` (lines that
    do not parse, such as a torn last line, are left out); files left empty are dropped. Each
    file is read in pieces (bounded memory), and a line is parsed only when a ``"step"`` field
    of one of ``steps`` appears in it: 8 MB of other lines cost one regular-expression scan."""
    parts, rows = [], 0
    for name in sorted(store.backend.listdir("expected")):
        if not name.endswith(".jsonl") or not NAME_PATTERN.fullmatch(name):
            continue
        rel = f"expected/{name}"
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
        piece = store.backend.read(rel, offset, offset + _CHUNK)
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


def slice_dump(store: Store, *, steps: Sequence[int] | None, splits: Sequence[str] | None = None) -> DumpSlice:
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
    raw = read_doc(store.backend, MANIFEST_NAME, "manifest", MANIFEST_BYTES)
    top = {k: v for k, v in raw.items() if k != "streams"} if isinstance(raw, dict) else {
        k: v for k, v in view.to_json().items() if k != "streams"}
    top.update(format=FORMAT, format_version=top.get("format_version", FORMAT_VERSION), fingerprint=view.fingerprint)
    requires = [r for r in top.pop("requires", None) or () if r != "index-segments"]
    manifest: dict[str, Any] = {**top, **({"requires": requires} if requires else {}), "streams": {}}
    chosen: dict[str, list[int]] = {}
    parts: list[Part] = []
    for stream in streams:
        wanted = list(view.steps(stream)) if steps is None else [s for s in steps if s in view.steps(stream)]
        if not wanted:
            continue
        data = {k: v for k, v in (view.stream(stream) or {}).items() if k not in ("steps", "segments")}
        data["methods"] = view.methods(stream)
        data["steps"] = {}
        for step in wanted:
            view.entry(stream, step)  # validated (file name, fields) before it is copied
            data["steps"][str(step)] = view.raw_entry(stream, step)
            parts.append(_step_part(store, stream, step))
        parts += _pack_parts(store, stream, set(wanted))
        manifest["streams"][stream.key] = data
        chosen[stream.key] = wanted
    body = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode("utf-8")
    parse_manifest(body, f"{source} ({MANIFEST_NAME} of the selection)")  # what a reader will accept
    expected, rows = _expected_parts(store, {s for wanted in chosen.values() for s in wanted})
    return DumpSlice(source, chosen, [_whole(MANIFEST_NAME, body), *parts, *expected], rows)


# ------------------------------------------------------------------ pack, unpack, pull

def _counted(pieces: Iterator[bytes], bar: Any) -> Iterator[bytes]:
    for piece in pieces:
        bar.update(len(piece))
        yield piece


def pack_store(store: Store, out: str | os.PathLike[str], *, steps: Sequence[int], splits: Sequence[str] | None = None,
               meta: dict[str, Any] | None = None, overwrite: bool = False,
               progress: bool | None = False) -> BundleInfo:
    """Write ``steps`` of ``store``'s dump (see :func:`slice_dump`) as the bundle ``out``.
    ``meta`` is added to the bundle's description (``tolerances``, ``redacted``...); the
    description also says which streams and steps it holds, how many expected-metrics rows, and
    which rollout_mock wrote it (not where the dump was: nothing private)."""
    refuse_own_input(out, local_input(store), "pack")
    chosen = slice_dump(store, steps=steps, splits=splits)
    description = {"created_by": f"rollout_mock {__version__}", "streams": chosen.streams,
                   "expected_rows": chosen.expected_rows, **(meta or {})}
    bar = progress_bar(chosen.nbytes, enabled=progress, desc="pack")
    try:
        with BundleWriter(out, overwrite=overwrite) as writer:
            for part in chosen.parts:
                writer.add(part.name, _counted(part.read(), bar))
            return writer.commit(description)
    finally:
        bar.close()


def pull_store(store: Store, dst: str | os.PathLike[str], *, steps: Sequence[int] | None,
               splits: Sequence[str] | None = None, overwrite: bool = False,
               progress: bool | None = False) -> DumpSlice:
    """Copy ``steps`` of ``store``'s dump (see :func:`slice_dump`: only the index and those
    steps' objects are read) into the new local dump directory ``dst``, atomically."""
    local = local_input(store)
    refuse_own_input(dst, local, "pull")
    chosen = slice_dump(store, steps=steps, splits=splits)
    bar = progress_bar(chosen.nbytes, enabled=progress, desc="pull")
    try:
        with _DirWriter(dst, overwrite=overwrite, protect=[] if local is None else [local]) as out:
            for part in chosen.parts:
                out.add(part.name, _counted(part.read(), bar))
            out.commit()
    finally:
        bar.close()
    return chosen


def unpack(location: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False,
           progress: bool | None = False, storage_options: dict[str, Any] | None = None) -> Bundle:
    """Turn the bundle at ``location`` back into the dump directory ``dst`` (new or empty; a
    non-empty one only with ``overwrite``), atomically: every byte is checked on the way (each
    member's SHA-256, the padding), and nothing is left behind on an error. The bundle's digest
    and description go to ``dst/bundle.json``. Returns the (closed) bundle."""
    refuse_own_input(dst, location, "unpack")
    bundle = open_bundle(location, storage_options=storage_options)
    try:
        manifest = bundle.read(MANIFEST_NAME, 0, None)
        if manifest is None:
            raise BundleError(f"{bundle.where}: holds no {MANIFEST_NAME}: not a bundle of a dump", path=bundle.where)
        parse_manifest(manifest, f"{bundle.where}:{MANIFEST_NAME}")
        bundle_tolerances(bundle)  # a forged description: refused before anything is written
        bar = progress_bar(bundle.payload_bytes, enabled=progress, desc="unpack")
        protect = [] if is_url(os.fspath(location)) else [os.fspath(location)]
        try:
            with _DirWriter(dst, overwrite=overwrite, protect=protect) as out:
                for member, pieces in bundle.scan(bar):
                    out.add(member.name, pieces)
                info = {"format": BUNDLE_FORMAT, "version": VERSION, "digest": bundle.digest, "meta": bundle.meta}
                out.add(INFO_NAME, [json.dumps(info, indent=1, allow_nan=False).encode("utf-8") + b"\n"])
                out.commit()
        finally:
            bar.close()
    finally:
        bundle.close()
    return bundle


def bundle_tolerances(bundle: Bundle) -> dict[str, dict[str, float]] | None:
    """The tolerances a bundle's description records (``{"rtol": {"default": 0.0, METRIC: x}, "atol":
    {...}}``, what ``pack --rtol/--atol`` writes), or None; :class:`BundleError` naming the field
    when they are not that: each a finite number >= 0 (a forged or damaged description)."""
    tolerances = bundle.meta.get("tolerances")
    if tolerances is None:
        return None

    def bad(field: str, why: str) -> BundleError:
        return BundleError(f"{bundle.where}: its description's tolerances{field} {why}; the bundle was edited or "
                           f"damaged: pack it again", path=bundle.where)

    if not isinstance(tolerances, dict):
        raise bad("", f"are a {type(tolerances).__name__}, not a mapping of rtol and atol")
    out: dict[str, dict[str, float]] = {}
    for kind, values in tolerances.items():
        if kind not in ("rtol", "atol"):
            raise bad("", f"hold {str(kind)[:40]!r}: expected only rtol and atol")
        if not isinstance(values, dict):
            raise bad(f".{kind}", f"is a {type(values).__name__}, not a mapping of metric to tolerance")
        out[kind] = {}
        for metric, value in values.items():
            ok = type(value) in (int, float) and 0 <= value <= 1e300 and not math.isnan(value)
            if not ok:
                raise bad(f".{kind}[{str(metric)[:80]!r}]",
                          f"is {short_repr(value, 60)}: expected a finite number >= 0")
            out[kind][str(metric)] = float(value)
    return out


# ------------------------------------------------------------------ the commands
_PROGRESS = "no progress bar (default: on a TTY only)"


def _common(parser: argparse.ArgumentParser, *, output: str) -> None:
    parser.add_argument("-o", "--output", required=True, type=Path, metavar=output.split()[0], help=output)
    parser.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    parser.add_argument("--no-progress", action="store_true", help=_PROGRESS)


def add_pack_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "pack", help="write some steps of a dump as one .rmb file to share (optionally redacted)",
        description="Write the chosen steps of a dump (a directory, an s3:// URL or a bundle) as one bundle file: "
                    "the step files byte for byte, a manifest of only those steps (rollout settings, request "
                    "digests, fingerprint), their expected metrics and tolerances, a SHA-256 per member and of the "
                    "whole. Nothing is compressed. Open it with open_dump(FILE), dump_dir: FILE in mock mode, or "
                    "`rollout-mock unpack FILE -o DIR`. Exit 0 written, 2 bad input.",
    )
    parser.add_argument("dump", metavar="DUMP", help="the dump: a directory, an fsspec URL (s3://...) or a bundle")
    parser.add_argument("--steps", required=True, metavar="RANGES", help="steps to bundle, e.g. 1234,1235 or 10-12")
    parser.add_argument("--split", action="append", dest="splits", metavar="SPLIT",
                        help="bundle only this split (repeatable; default: every stream holding the steps)")
    parser.add_argument("--redact", action="store_true",
                        help="replace prompt/response text with placeholders (as `cut --redact`; token ids are "
                             "kept; the steps are re-encoded, so they lose their HMAC)")
    parser.add_argument("--rtol", action="append", default=[], metavar="[METRIC=]FLOAT",
                        help="tolerance recorded with the expected metrics, as for verify (default 0: bitwise)")
    parser.add_argument("--atol", action="append", default=[], metavar="[METRIC=]FLOAT", help="as --rtol")
    parser.add_argument("--import", action="append", dest="imports", metavar="MODULE", default=None,
                        help="with --redact: import MODULE first (registers your batch classes)")
    parser.add_argument("--trust", action="store_true",
                        help="with --redact: load steps with the plain unpickler (only for dumps you trust)")
    _common(parser, output="FILE.rmb: the bundle to write")
    return parser


def add_unpack_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "unpack", help="turn a .rmb bundle back into a dump directory",
        description="Write the dump a bundle holds into a new (or empty) directory, atomically, checking every "
                    "byte (each member's SHA-256) on the way; the bundle's digest and description go to "
                    "DIR/bundle.json. Exit 0 written, 2 bad input (a damaged or forged bundle: nothing is written).",
    )
    parser.add_argument("bundle", metavar="FILE.rmb", help="the bundle (a path or an s3:// URL)")
    _common(parser, output="DIR: the dump directory to write (new or empty, unless --overwrite)")
    return parser


def add_pull_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "pull", help="fetch some steps of a dump (s3://..., a directory or a bundle) into a local dump",
        description="Copy the chosen steps of a dump into a new local dump directory, reading only the index, "
                    "those steps' objects and the expected metrics (not the other steps): the step files byte for "
                    "byte, checked against their checksums, and a manifest of only those steps. Credentials and "
                    "endpoints of object stores come from the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID...). "
                    "Exit 0 written, 2 bad input.",
    )
    parser.add_argument("dump", metavar="DUMP", help="the dump: an fsspec URL (s3://bucket/prefix), a directory or "
                                                     "a bundle")
    parser.add_argument("--steps", metavar="RANGES", help="steps to fetch, e.g. 1234 or 10-12 (default: all)")
    parser.add_argument("--split", action="append", dest="splits", metavar="SPLIT",
                        help="fetch only this split (repeatable; default: every stream holding the steps)")
    _common(parser, output="DIR: the local dump directory to write (new or empty, unless --overwrite)")
    return parser


def _tolerances(rtol: Sequence[str], atol: Sequence[str]) -> dict[str, dict[str, float]]:
    from rollout_mock.cli.verify import parse_tolerances

    out = {}
    for name, values in (("rtol", rtol), ("atol", atol)):
        default, per_metric = parse_tolerances(values, f"--{name}")
        out[name] = {"default": default, **per_metric}
    return out


def pack(dump: str | os.PathLike[str], out: str | os.PathLike[str], *, steps: Sequence[int] | str,
         splits: Sequence[str] | None = None, redact: bool = False, rtol: Sequence[str] = (),
         atol: Sequence[str] = (), overwrite: bool = False, trusted: bool = False,
         imports: Sequence[str] | None = None, progress: bool | None = False) -> BundleInfo:
    """``rollout-mock pack``: :func:`~rollout_mock.storage.bundle.pack_store` of the dump at
    ``dump`` (a directory, URL or bundle); with ``redact``, the steps are first cut into a
    temporary dump by :func:`~rollout_mock.debug.cut.cut_dump` with ``redact=True`` (an object
    store dump is pulled first, only those steps), and that dump is bundled. Returns the
    :class:`~rollout_mock.storage.bundle.BundleInfo`; its ``meta`` says what was redacted."""
    from rollout_mock.debug.cut import cut_dump, parse_ranges
    from rollout_mock.storage.store import open_store

    step_list = parse_ranges(steps, "--steps") if isinstance(steps, str) else sorted(set(steps))
    refuse_own_input(out, None if is_url(os.fspath(dump)) else dump, "pack")
    meta: dict[str, Any] = {"tolerances": _tolerances(rtol, atol), "redacted": None}
    if not redact:
        return pack_store(open_store(dump), out, steps=step_list, splits=splits, meta=meta, overwrite=overwrite,
                          progress=progress)
    work = Path(tempfile.mkdtemp(prefix=".rollout-mock-pack-", dir=Path(out).parent if Path(out).parent.is_dir()
                                 else None))
    try:
        source: Any = dump
        if is_url(os.fspath(dump)) or is_bundle(dump):  # cut reads a local directory
            source = work / "pulled"
            pull_store(open_store(dump), source, steps=step_list, splits=splits, progress=progress)
        result = cut_dump(source, work / "redacted", steps=step_list, splits=splits, redact=True, trusted=trusted,
                          imports=imports, progress=progress)
        meta["redacted"] = result.redacted
        return pack_store(open_store(work / "redacted"), out, steps=step_list, splits=splits, meta=meta,
                          overwrite=overwrite, progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def run_pack(args: argparse.Namespace) -> int:
    from rollout_mock.cli import resolve_dump

    dump = resolve_dump(args.dump, "pack", ["--steps", str(args.steps), "-o", str(args.output)])
    info = pack(dump, args.output, steps=args.steps, splits=args.splits, redact=args.redact, rtol=args.rtol,
                atol=args.atol, overwrite=args.overwrite, trusted=args.trust, imports=args.imports,
                progress=False if args.no_progress else None)
    print(f"wrote {info.path} ({_mb(info.size)}, {len(info.members)} members)")
    for stream, steps in info.meta["streams"].items():
        print(f"  {stream}: steps {format_ranges(steps)}")
    print(f"  expected metrics: {info.meta['expected_rows']} row(s)")
    if args.redact:
        print(f"  redacted fields: {', '.join(info.meta['redacted']) or 'none found'} (token ids kept)")
    print(f"  digest: {info.digest}")
    print(f"open it in place: open_dump({str(info.path)!r}), or dump_dir: {info.path} in mock mode; "
          f"or: rollout-mock unpack {shlex.quote(str(info.path))} -o DIR")
    return 0


def run_unpack(args: argparse.Namespace) -> int:
    bundle = unpack(args.bundle, args.output, overwrite=args.overwrite, progress=False if args.no_progress else None)
    print(f"wrote {args.output} ({len(bundle.members)} files, {_mb(bundle.payload_bytes)}; every member's SHA-256 "
          f"checked; digest {bundle.digest})")
    tolerances = bundle_tolerances(bundle)
    if tolerances is not None and bundle.members.get("expected/metrics.jsonl") is not None:
        flags = " ".join(f"--{kind} " + shlex.quote(f"{value:g}" if metric == "default" else f"{metric}={value:g}")
                         for kind in ("rtol", "atol") for metric, value in tolerances.get(kind, {}).items()
                         if metric != "default" or value)
        expected = shlex.quote(str(Path(args.output) / "expected/metrics.jsonl"))
        print(f"compare a replay with the bundled metrics: rollout-mock verify {expected} RUN_METRICS"
              + (f" {flags}" if flags else "   (bitwise)"))
        print(f"  or in mock mode: verdict: {json.dumps({k: tolerances.get(k) for k in ('rtol', 'atol')})}")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    from rollout_mock.cli import resolve_dump
    from rollout_mock.debug.cut import parse_ranges
    from rollout_mock.storage.store import open_store

    dump = resolve_dump(args.dump, "pull", ["-o", str(args.output)])
    steps = None if args.steps is None else parse_ranges(args.steps, "--steps")
    pulled = pull_store(open_store(dump), args.output, steps=steps, splits=args.splits, overwrite=args.overwrite,
                        progress=False if args.no_progress else None)
    print(f"wrote {args.output} ({_mb(pulled.nbytes)}, {len(pulled.parts)} files from {pulled.source})")
    for stream, chosen in pulled.streams.items():
        print(f"  {stream}: steps {format_ranges(chosen)}")
    print(f"  expected metrics: {pulled.expected_rows} row(s)")
    return 0


#: The commands of this module: name -> (add_parser, run).
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], argparse.ArgumentParser],
                          Callable[[argparse.Namespace], int]]] = {
    "pack": (add_pack_parser, run_pack),
    "unpack": (add_unpack_parser, run_unpack),
    "pull": (add_pull_parser, run_pull),
}
