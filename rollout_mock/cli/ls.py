"""``rollout-mock ls DUMP_DIR``: what a dump holds, read from manifest.json alone (never unpickles).

``--json`` prints the format, writer and streams as JSON (``--all``: the whole manifest, with
the environment fingerprint). ``--keys`` lists each stream's keys (shapes and dtypes) once per
distinct key set, naming the steps that share it, instead of repeating the list for every step.

A step written with ``compression:`` (zstd, lz4) shows it after its checksum, and each stream
line says which steps are compressed.

Steps kept by the flight recorder (``keep:``, ``pin_steps``, ``MockScheduler.pin``) are marked
``PINNED`` with their reasons, after a per-stream count; ``--json`` adds ``"pinned": {stream:
{step: [reasons]}}``.

Each step file of a local dump is also checked against its index entry for what costs nothing
to read: that it is there and has the recorded size (a truncated or missing file is marked
DAMAGED). ``--verify`` reads every step file and checks its checksum too (object stores as
well), with a progress bar on a terminal. Exit 0 when nothing is found wrong, 1 when a step file
is damaged, 2 bad input.

Every step the dump run wrote has a health line (kept when ``keep:`` drops its batch): ``ls``
marks the steps whose health stands out (``HEALTH: zero:mask``...) and counts them per stream;
``--health`` prints the health of every step the run wrote, the dropped ones included (per key:
values, NaN/inf, min/max/mean, token lengths); ``--json`` adds ``"health": {stream: [...]}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("ls", help="list the streams and steps of a dump", description=__doc__)
    parser.add_argument("dump_dir",
                        help="dump directory or fsspec URL (s3://bucket/prefix; credentials from AWS_* env)")
    parser.add_argument("--keys", action="store_true", help="also list the keys, shapes and dtypes (once per key set)")
    parser.add_argument("--json", action="store_true",
                        help="print the dump's format, writer and streams (steps, files, keys) as JSON")
    parser.add_argument("--all", action="store_true",
                        help="with --json: the whole manifest, the environment fingerprint included")
    parser.add_argument("--health", action="store_true",
                        help="print the health summary of every step the run wrote (dropped batches included)")
    parser.add_argument("--verify", action="store_true",
                        help="read every step file and check its size and checksum against the index "
                             "(without it: sizes of local files only)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def _damage(dump: Any, entry: Any, *, verify: bool, bar: Any) -> str | None:
    """What is wrong with one step's file, or ``None``. Without ``verify`` only a local file's
    existence and size (one ``stat``); with it, every byte: size and whole-file checksum."""
    from rollout_mock.storage.digest import Digest

    store = dump.store
    if not verify:
        path = store.local_path(entry.file)
        if path is None:  # an object store: a request per step is not cheap; --verify reads them
            return None
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return "missing"
        return None if size == entry.size else f"size is {size} bytes, the index says {entry.size} (truncated?)"
    try:
        source = store.open_source(entry.file)
    except FileNotFoundError:
        bar.update(entry.size)
        return "missing"
    try:
        size = source.size()
        if size != entry.size:
            bar.update(entry.size)
            return f"size is {size} bytes, the index says {entry.size} (truncated?)"
        digest, pos = Digest(), 0
        while pos < size:
            piece = source.read_range(pos, min(16 << 20, size - pos))
            if not piece:
                return f"ends after {pos} of {size} bytes"
            digest.update(piece)
            pos += len(piece)
            bar.update(len(piece))
        checksum, _ = digest.finish()
    finally:
        if callable(close := getattr(source, "close", None)):  # a file; ranged-GET sources hold nothing open
            close()
    return None if checksum == entry.checksum else f"checksum {checksum} does not match the index's {entry.checksum}"


def _check_files(dump: Any, *, verify: bool, progress: bool | None) -> dict[str, dict[int, str]]:
    """``{stream key: {step: what is wrong}}`` for the damaged steps of the dump."""
    from rollout_mock.text import progress_bar

    entries = [(stream, step, dump.entry(stream, step)) for stream in dump.streams() for step in dump.steps(stream)]
    packs = [(stream, pack) for stream in dump.streams() for pack in dump.store.packs(stream)]
    total = (sum(e.size for _, _, e in entries if e is not None) + sum(p.size for _, p in packs)) if verify else 0
    damaged: dict[str, dict[int, str]] = {}
    with progress_bar(total, enabled=progress if verify else False, desc="verify") as bar:
        for stream, step, entry in entries:
            if entry is not None and (what := _damage(dump, entry, verify=verify, bar=bar)) is not None:
                damaged.setdefault(stream.key, {})[step] = what
        for stream, pack in packs:  # a pack of further calls: each step with a call in it is damaged
            if (what := _damage(dump, pack, verify=verify, bar=bar)) is not None:
                for step in {call.step for call in pack.calls}:
                    damaged.setdefault(stream.key, {}).setdefault(step, f"{pack.file} (its further calls): {what}")
    return damaged


def _verdict(damaged: dict[str, dict[int, str]], where: str, args: argparse.Namespace) -> int:
    """The exit code; damaged steps (``where``: which) are summed up on stderr."""
    count = sum(map(len, damaged.values()))
    if not count:
        if args.verify and not args.json:
            print("\nverified: every step file's size and checksum match the index")
        return 0
    them = "them" if count > 1 else "it"
    print(f"rollout-mock ls: {count} damaged step file{'s' * (count > 1)} ({where}): replaying {them} fails with "
          f"CorruptStepError; re-dump {them} (dump mode with overwrite: true) or restore the dump from a copy"
          + ("" if args.verify else f"; rollout-mock ls {shlex.quote(args.dump_dir)} --verify checks every checksum"),
          file=sys.stderr)
    return 1


def _pinned(dump: Any) -> dict[str, dict[str, list[str]]]:
    """``{stream key: {step: reasons}}`` of the pinned steps (the entries of every step are read:
    a long stream's entries live in index segments, outside the manifest ``--json`` prints)."""
    pinned: dict[str, dict[str, list[str]]] = {}
    for stream in dump.streams():
        for step in dump.steps(stream):
            entry = dump.entry(stream, step)
            if entry is not None and entry.pin:
                pinned.setdefault(stream.key, {})[str(step)] = list(entry.pin)
    return pinned


def _key_set(keys: dict[str, Any]) -> str:
    return json.dumps(keys, sort_keys=True)


def _health_key(key: str, value: Any) -> str:
    """One key of a health line: ``rewards n=6 lo=0 hi=1 mean=0.5`` (``nf=`` NaN/inf, ``len=`` lengths)."""
    if not isinstance(value, dict):
        return key
    parts = [f"{name}={value[name]}" for name in ("n", "nf", "lo", "hi", "mean") if value.get(name) is not None]
    if isinstance(value.get("len"), list):
        parts.append("len=" + "/".join(str(x) for x in value["len"]))
    return f"{key} " + " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from rollout_mock.cli import resolve_dump
    from rollout_mock.errors import RolloutMockError
    from rollout_mock.storage.manifest import format_ranges
    from rollout_mock.storage.reader import open_dump

    dump = open_dump(resolve_dump(args.dump_dir, "ls", "--keys" if args.keys else ""))
    if args.all and not args.json:
        raise RolloutMockError(
            f"--all goes with --json: rollout-mock ls {shlex.quote(str(args.dump_dir))} --json --all")
    damaged = _check_files(dump, verify=args.verify, progress=False if args.no_progress else None)
    where = "; ".join(f"{key} step{'s' * (len(bad) > 1)} {format_ranges(sorted(bad))}" for key, bad in damaged.items())
    if args.json:
        manifest = dump.manifest.to_json()
        if not args.all:
            manifest.pop("fingerprint", None)
        manifest["pinned"] = _pinned(dump)
        manifest["health"] = {stream.key: dump.health(stream) for stream in dump.streams()}
        print(json.dumps(manifest, indent=1))
        return _verdict(damaged, where, args)
    writer = dump.manifest.writer
    print(f"{dump.dump_dir}: rollout_mock dump, written by rollout_mock {writer.get('rollout_mock', '?')} "
          f"on Python {writer.get('python', '?')}")
    for stream in dump.streams():
        steps = dump.steps(stream)
        entries = [dump.entry(stream, s) for s in steps]
        total = sum(e.size for e in entries if e is not None)
        methods = ", ".join(f"{m} ({info.get('convention')})" for m, info in dump.manifest.methods(stream).items())
        pinned = [step for step, entry in zip(steps, entries) if entry is not None and entry.pin]
        compressed: dict[str, list[int]] = {}
        for step, entry in zip(steps, entries):
            if entry is not None and entry.compression:
                compressed.setdefault(entry.compression, []).append(step)
        compression = "; ".join(f"compression: {name} (steps {format_ranges(members)})"
                                for name, members in compressed.items())
        extra = dump.store.extra_calls(stream)
        packs = dump.store.packs(stream)
        calls = (f"; {sum(map(len, extra.values()))} further call(s) of steps {format_ranges(sorted(extra))} in "
                 f"{len(packs)} pack(s), {sum(p.size for p in packs) / 1e6:.2f} MB") if extra else ""
        print(f"\n{stream}: steps {format_ranges(steps)} ({len(steps)} files, {total / 1e6:.2f} MB)"
              + calls + (f"; methods: {methods}" if methods else "")
              + (f"; pinned: {format_ranges(pinned)}" if pinned else "")
              + (f"; {compression}" if compression else ""))
        health = {line["step"]: line for line in dump.health(stream)}
        flagged = [s for s, line in health.items() if line.get("anomalies")]
        if health:
            stand_out = (f", {len(flagged)} stand out: {format_ranges(sorted(flagged))}" if flagged
                         else ", none stands out")
            print(f"  health: {len(health)} step(s) summarised{stand_out}")
        if args.health:
            for step, line in health.items():
                print(f"  health {step:>6}  " + (f"[{', '.join(line['anomalies'])}]  " if line.get("anomalies") else "")
                      + "  ".join(_health_key(k, v) for k, v in (line.get("keys") or {}).items()))
        groups: dict[str, list[int]] = {}
        for step, entry in zip(steps, entries):
            assert entry is not None
            what = damaged.get(stream.key, {}).get(step)
            print(f"  step {step:>6}  {entry.file}  {entry.size / 1e6:9.2f} MB  samples={entry.samples}  "
                  f"{entry.type}  {entry.checksum}" + (f"  {entry.compression}" if entry.compression else "")
                  + ("" if what is None else f"  DAMAGED: {what}")
                  + (f"  HEALTH: {', '.join(health[step]['anomalies'])}" if health.get(step, {}).get("anomalies")
                     else "")
                  + ("" if not entry.pin else f"  PINNED: {'; '.join(entry.pin)}")
                  + (f"  +{len(extra[step])} call(s)" if step in extra else ""))
            groups.setdefault(_key_set(entry.keys), []).append(step)
        if args.keys:
            for signature, members in groups.items():
                keys = json.loads(signature)
                label = "all steps" if len(groups) == 1 else f"steps {format_ranges(members)}"
                print(f"  keys ({label}): {len(keys)}" + ("" if keys else " (none recorded for this type)"))
                for key, leaf in keys.items():
                    print(f"      {key}: {leaf.get('dtype')} {leaf.get('shape')}")
    return _verdict(damaged, where, args)
