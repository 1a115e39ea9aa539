"""``rollout-mock diff DUMP_A DUMP_B``: compare two dumps step by step and key by key.

Steps whose manifest checksums are equal are identical without being loaded; the others are
loaded one step at a time (both sides) and compared: shapes, dtypes, bitwise equality (NaN-aware),
max abs difference, first differing sample. Exit 0 identical (or within ``--atol/--rtol``),
1 different (including streams, steps or keys present on one side only), 2 bad input (also: a
step file missing, truncated or corrupt on either side; the report still lists every step).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diff",
        help="compare two dumps: per step and key, shapes, dtypes, exact equality, max difference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_a", metavar="DUMP_A", help="dump directory (holds manifest.json)")
    parser.add_argument("dump_b", metavar="DUMP_B", help="dump directory to compare with DUMP_A")
    parser.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. 0-9 or 0-9,12,20- (inclusive)")
    parser.add_argument("--split", metavar="SPLIT", help="only streams of this split (e.g. train, val)")
    parser.add_argument(
        "--trust", action="store_true",
        help="load steps with the plain unpickler (arbitrary objects: only for dumps you trust)",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="never load step files: compare manifest.json only (checksums, keys, shapes, dtypes)",
    )
    parser.add_argument("--atol", type=float, default=0.0, metavar="X",
                        help="numeric keys pass when |a-b| <= atol + rtol*|b| (default 0: bitwise)")
    parser.add_argument("--rtol", type=float, default=0.0, metavar="X", help="see --atol (default 0)")
    parser.add_argument("--ignore-meta", action="append", default=[], metavar="KEY",
                        help="leave this meta_info key out of the comparison (repeatable)")
    parser.add_argument("--ignore-timing", action="store_true",
                        help="leave out meta_info keys naming a time or duration (e.g. ROLL's "
                             "get_batch_return_start_time, verl's timing)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def run(args: argparse.Namespace) -> int:
    from rollout_mock.compare.diff import diff_dumps, format_diff
    from rollout_mock.errors import DiffInputError

    for name in ("atol", "rtol"):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):
            raise DiffInputError(f"--{name} {value}: must be a finite number >= 0")

    from rollout_mock.cli import resolve_dump

    metrics = [p for p in (args.dump_a, args.dump_b) if _is_metrics(p)]
    if metrics:
        raise DiffInputError(
            f"{metrics[0]} holds a run's metrics, not a dump: diff compares the batches of two dumps; compare "
            f"two runs' metrics with: rollout-mock verify {shlex.quote(args.dump_a)} {shlex.quote(args.dump_b)}")
    dump_a = resolve_dump(args.dump_a, "diff", [str(args.dump_b)])
    dump_b = resolve_dump(args.dump_b, "diff", "")
    report = diff_dumps(
        dump_a,
        dump_b,
        steps=args.steps,
        split=args.split,
        trusted=args.trust,
        quick=args.quick,
        atol=args.atol,
        rtol=args.rtol,
        progress=False if args.no_progress else None,
        ignore_meta=tuple(args.ignore_meta),
        ignore_timing=args.ignore_timing,
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=1, allow_nan=False))
    else:
        print(format_diff(report))
    sys.stdout.flush()
    broken = [(st.stream, s) for st in report.streams for s in st.steps if s.status == "unreadable"]
    if broken:
        stream, first = broken[0]
        print(f"rollout-mock diff: error: {len(broken)} step file(s) missing, truncated or corrupt "
              f"(first: step {first.step} of {stream}: {first.note}); restore them from the original "
              f"dump or re-dump those steps, or leave them out with --steps", file=sys.stderr)
        return 2
    return 0 if report.ok else 1


def _is_metrics(location: str) -> bool:
    """A metrics file (JSONL, CSV, TensorBoard events) or a run folder holding one, and no dump."""
    path = Path(location)
    if path.is_file():
        return path.suffix in (".jsonl", ".ndjson", ".csv") or path.name.startswith("events.out.tfevents")
    if not path.is_dir() or (path / "manifest.json").exists():
        return False
    return (path / "metrics.jsonl").is_file() or any(path.glob("events.out.tfevents*"))
