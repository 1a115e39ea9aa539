"""``rollout-mock cut SRC DST --steps 3,5-6``: a minimal repro dump of a few steps and rows.

The new dump has its own manifest and checksums, the source's environment fingerprint, and a
``provenance.json`` saying what was kept; it replays on its own in mock mode. ``--samples`` keeps
rows, ``--groups`` with ``--group-size`` whole GRPO groups (AReaL: list items), ``--keys`` only
some columns; ``--redact`` replaces prompt/response text (not token ids) with placeholders.
Exit 0 written, 2 bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cut",
        help="write a minimal repro dump: some steps, rows and keys of a dump (optionally redacted)",
        description=__doc__,
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


def run(args: argparse.Namespace) -> int:
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
