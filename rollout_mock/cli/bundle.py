"""``rollout-mock pack``, ``unpack``, ``pull`` and ``cut``: a few steps of a dump as one file to
attach to a bug report or send to a colleague, that file back as a dump directory, a few steps
fetched from an object store (or a directory, or a bundle) into a local dump, and a minimal repro
dump of a few steps, rows and keys (``cut``: :func:`rollout_mock.debug.cut.cut_dump`).

The commands only: what is copied and how it is written are the store's
(:meth:`Store.slice <rollout_mock.storage.store.Store.slice>`, ``pack``, ``pull``, ``unpack``; see
:mod:`rollout_mock.storage.bundle`): the chosen steps' files byte for byte (data-only, their
CRC-32 checked on the way, their HMACs unchanged), a ``manifest.json`` of only those steps with
every field as recorded, and the rows of those steps of the dump run's metrics, written as a
bundle (a one-file backend, with the tolerances and a SHA-256 per member and of the whole) or as
a new dump directory renamed into place whole. Here: the redaction before a pack
(:func:`pack`), the refusal to write over the input, the bundle's recorded tolerances.

A bundle opens in place too: ``open_dump("bad-step.rmb")``, ``dump_dir: bad-step.rmb`` in mock
mode, ``rollout-mock ls bad-step.rmb``. Exit 0 written, 2 bad input (a step not recorded, an
existing output, a damaged bundle).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_mock.errors import BundleError, DebugInputError
from rollout_mock.storage.bundle import (
    Bundle,
    BundleBackend,
    BundleInfo,
    DumpSlice,
    Part,
    is_bundle,
    open_bundle,
)
from rollout_mock.storage.manifest import format_ranges
from rollout_mock.storage.paths import is_url
from rollout_mock.text import short_repr

if TYPE_CHECKING:
    from rollout_mock.storage.store import Store

__all__ = ["COMMANDS", "DumpSlice", "Part", "pack", "pack_store", "pull_store", "slice_dump", "unpack"]


# ------------------------------------------------------------------ outputs that spare the input
def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


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


# ------------------------------------------------------------------ pack, unpack, pull (the store's)
def slice_dump(store: Store, *, steps: Sequence[int] | None, splits: Sequence[str] | None = None) -> DumpSlice:
    """The files of ``store``'s dump that hold ``steps``: :meth:`Store.slice
    <rollout_mock.storage.store.Store.slice>`."""
    return store.slice(steps=steps, splits=splits)


def pack_store(store: Store, out: str | os.PathLike[str], *, steps: Sequence[int], splits: Sequence[str] | None = None,
               meta: dict[str, Any] | None = None, overwrite: bool = False,
               progress: bool | None = False) -> BundleInfo:
    """Write ``steps`` of ``store``'s dump as the bundle ``out`` (:meth:`Store.pack
    <rollout_mock.storage.store.Store.pack>`), never over the input."""
    refuse_own_input(out, store.local_source(), "pack")
    return store.pack(out, steps=steps, splits=splits, meta=meta, overwrite=overwrite, progress=progress)


def pull_store(store: Store, dst: str | os.PathLike[str], *, steps: Sequence[int] | None,
               splits: Sequence[str] | None = None, overwrite: bool = False,
               progress: bool | None = False) -> DumpSlice:
    """Copy ``steps`` of ``store``'s dump (only the index and those steps' objects are read) into
    the new local dump directory ``dst``, atomically (:meth:`Store.pull
    <rollout_mock.storage.store.Store.pull>`), never over the input."""
    refuse_own_input(dst, store.local_source(), "pull")
    return store.pull(dst, steps=steps, splits=splits, overwrite=overwrite, progress=progress)


def unpack(location: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False,
           progress: bool | None = False, storage_options: dict[str, Any] | None = None) -> Bundle:
    """Turn the bundle at ``location`` back into the dump directory ``dst`` (new or empty; a
    non-empty one only with ``overwrite``), atomically: every byte is checked on the way (each
    member's SHA-256, the padding), and nothing is left behind on an error (:meth:`Store.unpack
    <rollout_mock.storage.store.Store.unpack>`). The bundle's digest and description go to
    ``dst/bundle.json``. Returns the (closed) bundle."""
    from rollout_mock.storage.store import Store

    refuse_own_input(dst, location, "unpack")
    bundle = open_bundle(location, storage_options=storage_options)
    try:
        bundle_tolerances(bundle)  # a forged description: refused before anything is written
        return Store(BundleBackend(bundle)).unpack(dst, overwrite=overwrite, progress=progress)
    finally:
        bundle.close()


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
    from rollout_mock.storage.store import expected_path, expected_relpath

    bundle = unpack(args.bundle, args.output, overwrite=args.overwrite, progress=False if args.no_progress else None)
    print(f"wrote {args.output} ({len(bundle.members)} files, {_mb(bundle.payload_bytes)}; every member's SHA-256 "
          f"checked; digest {bundle.digest})")
    tolerances = bundle_tolerances(bundle)
    if tolerances is not None and bundle.members.get(expected_relpath()) is not None:
        flags = " ".join(f"--{kind} " + shlex.quote(f"{value:g}" if metric == "default" else f"{metric}={value:g}")
                         for kind in ("rtol", "atol") for metric, value in tolerances.get(kind, {}).items()
                         if metric != "default" or value)
        expected = shlex.quote(str(expected_path(args.output)))
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


#: ``rollout-mock cut --help``'s description.
_CUT_DESCRIPTION = """``rollout-mock cut SRC DST --steps 3,5-6``: a minimal repro dump of a few steps and rows.

The new dump has its own manifest and checksums, the source's environment fingerprint, and a
``provenance.json`` saying what was kept; it replays on its own in mock mode. ``--samples`` keeps
rows, ``--groups`` with ``--group-size`` whole GRPO groups (AReaL: list items), ``--keys`` only
some columns; ``--redact`` replaces prompt/response text (not token ids) with placeholders.
Exit 0 written, 2 bad input.
"""


def add_cut_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cut",
        help="write a minimal repro dump: some steps, rows and keys of a dump (optionally redacted)",
        description=_CUT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", metavar="SRC", type=Path, help="source dump directory")
    parser.add_argument("dst", metavar="DST", type=Path, help="new dump directory (must not exist, or be empty)")
    parser.add_argument("--steps", required=True, metavar="RANGES", help="steps to keep, e.g. 3,5-6")
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument("--samples", metavar="RANGES", help="rows to keep, e.g. 0-7 (default: all)")
    rows.add_argument("--groups", metavar="RANGES", help="groups to keep (with --group-size), e.g. 0,2")
    parser.add_argument("--group-size", type=int, metavar="N", help="rows per group (GRPO's n)")
    parser.add_argument("--keys", metavar="K1,K2,...",
                        help="keep only these columns, as `ls --keys` prints them (batch.rewards) or bare "
                             "(rewards); default: all")
    parser.add_argument("--split", action="append", dest="splits", metavar="SPLIT",
                        help="cut only this split (repeatable; default: every stream holding the steps)")
    parser.add_argument("--redact", action="store_true", help="replace prompt/response text with placeholders")
    parser.add_argument("--import", action="append", dest="imports", metavar="MODULE", default=None,
                        help="import MODULE first (repeatable): registers your batch classes "
                             "(register_batch_class) so the cut dump keeps them")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    parser.add_argument("--trust", action="store_true",
                        help="load steps with the plain unpickler (only for dumps you trust)")
    return parser


def run_cut(args: argparse.Namespace) -> int:
    from rollout_mock.cli import resolve_dump
    from rollout_mock.debug.cut import cut_dump

    src = resolve_dump(args.src, "cut", [str(args.dst), "--steps", str(args.steps)])
    result = cut_dump(
        src, args.dst, steps=args.steps, samples=args.samples, groups=args.groups,
        group_size=args.group_size, keys=args.keys, redact=args.redact, splits=args.splits,
        trusted=args.trust, imports=args.imports, progress=False if args.no_progress else None,
    )
    print(result.summary())
    return 0


#: The commands of this module: name -> (add_parser, run).
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], argparse.ArgumentParser],
                          Callable[[argparse.Namespace], int]]] = {
    "pack": (add_pack_parser, run_pack),
    "unpack": (add_unpack_parser, run_unpack),
    "pull": (add_pull_parser, run_pull),
    "cut": (add_cut_parser, run_cut),
}
