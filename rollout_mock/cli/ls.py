"""``rollout-mock ls DUMP_DIR``: what a dump holds, read from manifest.json alone (never unpickles).

``--json`` prints the format, writer and streams as JSON (``--all``: the whole manifest, with
the environment fingerprint). ``--keys`` lists each stream's keys (shapes and dtypes) once per
distinct key set, naming the steps that share it, instead of repeating the list for every step.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("ls", help="list the streams and steps of a dump", description=__doc__)
    parser.add_argument("dump_dir",
                        help="dump directory or fsspec URL (s3://bucket/prefix; credentials from AWS_* env)")
    parser.add_argument("--keys", action="store_true", help="also list the keys, shapes and dtypes (once per key set)")
    parser.add_argument("--json", action="store_true",
                        help="print the dump's format, writer and streams (steps, files, keys) as JSON")
    parser.add_argument("--all", action="store_true",
                        help="with --json: the whole manifest, the environment fingerprint included")
    return parser


def _key_set(keys: dict[str, Any]) -> str:
    return json.dumps(keys, sort_keys=True)


def run(args: argparse.Namespace) -> int:
    from rollout_mock.cli._paths import resolve_dump
    from rollout_mock.errors import RolloutMockError
    from rollout_mock.storage.manifest import format_ranges
    from rollout_mock.storage.reader import open_dump

    dump = open_dump(resolve_dump(args.dump_dir, "ls", "--keys" if args.keys else ""))
    if args.all and not args.json:
        raise RolloutMockError(f"--all goes with --json: rollout-mock ls {args.dump_dir} --json --all")
    if args.json:
        manifest = dump.manifest.to_json()
        if not args.all:
            manifest.pop("fingerprint", None)
        print(json.dumps(manifest, indent=1))
        return 0
    writer = dump.manifest.writer
    print(f"{dump.dump_dir}: rollout_mock dump, written by rollout_mock {writer.get('rollout_mock', '?')} "
          f"on Python {writer.get('python', '?')}")
    for stream in dump.streams():
        steps = dump.steps(stream)
        entries = [dump.entry(stream, s) for s in steps]
        total = sum(e.size for e in entries if e is not None)
        methods = ", ".join(f"{m} ({info.get('convention')})" for m, info in dump.manifest.methods(stream).items())
        print(f"\n{stream}: steps {format_ranges(steps)} ({len(steps)} files, {total / 1e6:.2f} MB)"
              + (f"; methods: {methods}" if methods else ""))
        groups: dict[str, list[int]] = {}
        for step, entry in zip(steps, entries):
            assert entry is not None
            print(f"  step {step:>6}  {entry.file}  {entry.size / 1e6:9.2f} MB  samples={entry.samples}  "
                  f"{entry.type}  {entry.checksum}")
            groups.setdefault(_key_set(entry.keys), []).append(step)
        if args.keys:
            for signature, members in groups.items():
                keys = json.loads(signature)
                label = "all steps" if len(groups) == 1 else f"steps {format_ranges(members)}"
                print(f"  keys ({label}): {len(keys)}" + ("" if keys else " (none recorded for this type)"))
                for key, leaf in keys.items():
                    print(f"      {key}: {leaf.get('dtype')} {leaf.get('shape')}")
    return 0
