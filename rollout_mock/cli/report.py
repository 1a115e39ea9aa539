"""``rollout-mock report DUMP -o report.html``: one self-contained HTML file to look at a dump.

Per-step charts (reward, response length and token log-prob distributions, rejected samples,
GRPO groups without signal, log-prob mismatch with ``--logprobs-json``, the dump run's metrics
when stored), a per-step table and a sample browser (step -> sortable, searchable previews ->
messages, per-key tensor statistics), decoded with ``--tokenizer DIR`` (local only) or shown as
token ids. ``--against OTHER``: compare with a second dump (first differing step, max abs
difference per key and step, a chart of the divergence), or with a metrics file of another run
(a mock run's, from MetricsWriter) against the dump run's recorded metrics (first divergence,
bitwise, both runs and |A - B| per metric). Nothing in the file is fetched from the network: open it
from disk, offline. Charts: hover for values, drag to zoom, a step range and smoothing for all.

Exit 0 written; 1 written with steps that could not be read (truncated or corrupt: marked in the
page, the other steps shown), or nothing written because the split has no recorded step; 2 bad
input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout_mock.debug.report_data import DEFAULT_MAX_SAMPLES

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML report of a dump (plots and a sample browser)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_dir", metavar="DUMP", type=Path, help="dump directory (holds manifest.json)")
    parser.add_argument("-o", "--output", type=Path, default=Path("report.html"),
                        help="output file (default report.html)")
    parser.add_argument("--split", default=None,
                        help="the split to show (default: train, or the first split with steps when train has none)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR",
                        help="decode token ids with this local tokenizer directory")
    parser.add_argument("--logprobs-json", type=Path, metavar="FILE",
                        help="output of `rollout-mock logprobs --json`, plotted per step")
    parser.add_argument("--against", type=Path, nargs="+", metavar="OTHER",
                        help="a second dump to compare with, step by step and key by key; or a metrics "
                             "file of another run (e.g. the mock run's), against the dump run's metrics; "
                             "several (dumps or metrics files): every run overlaid, one colour each, with "
                             "|X − A| per metric")
    parser.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES, metavar="N",
                        help="sample previews per step: the first ones, the lowest and the highest rewards "
                             f"(default {DEFAULT_MAX_SAMPLES})")
    parser.add_argument("--trust", action="store_true",
                        help="load steps with the plain unpickler (only for dumps you trust)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def run(args: argparse.Namespace) -> int:
    import sys

    from rollout_mock.cli.show import load_tokenizer
    from rollout_mock.debug.report import nothing_to_report, render_report, report_stream
    from rollout_mock.errors import DebugInputError
    from rollout_mock.storage import format_ranges, open_dump

    if args.max_samples < 0:
        raise DebugInputError(f"--max-samples {args.max_samples}: must be >= 0")
    dump = open_dump(args.dump_dir)
    empty = nothing_to_report(dump, report_stream(dump, args.split))
    if empty is not None:
        print(f"rollout-mock report: {empty}; nothing written", file=sys.stderr)
        return 1
    tokenizer = None if args.tokenizer is None else load_tokenizer(args.tokenizer)
    report = render_report(args.dump_dir, split=args.split, tokenizer=tokenizer, logprobs_json=args.logprobs_json,
                           max_samples=args.max_samples, trusted=args.trust,
                           against=args.against[0] if args.against and len(args.against) == 1 else args.against,
                           progress=False if args.no_progress else None)
    path = report.write(args.output)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB); open it in a browser (no server needed)")
    bad = report.unreadable
    if bad:
        print(f"rollout-mock report: {len(bad)} step{'s' if len(bad) != 1 else ''} could not be read "
              f"({format_ranges([s.step for s in bad])}; first: step {bad[0].step}: {bad[0].error}); they are "
              f"marked in the page, the other steps are shown", file=sys.stderr)
        return 1
    return 0
