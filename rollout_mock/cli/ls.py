"""``rollout-mock ls DUMP_DIR``: what a dump holds, read from manifest.json alone (never unpickles)."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser("ls", help="list the streams and steps of a dump", description=__doc__)
    parser.add_argument("dump_dir", help="dump directory or fsspec URL (s3://bucket/prefix; credentials from AWS_* env)")
    parser.add_argument("--keys", action="store_true", help="also list each step's keys, shapes and dtypes")
    parser.add_argument("--json", action="store_true", help="print the manifest's streams as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from rollout_mock.storage.base import format_ranges
    from rollout_mock.storage.reader import open_dump

    dump = open_dump(args.dump_dir)
    if args.json:
        print(json.dumps(dump.manifest.to_json(), indent=1))
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
        for step, entry in zip(steps, entries):
            assert entry is not None
            print(f"  step {step:>6}  {entry.file}  {entry.size / 1e6:9.2f} MB  samples={entry.samples}  "
                  f"{entry.type}  {entry.checksum}")
            if args.keys:
                for key, leaf in entry.keys.items():
                    print(f"      {key}: {leaf.get('dtype')} {leaf.get('shape')}")
    return 0
