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

``--explain FILE`` (repeatable): add the reports of ``rollout-mock explain`` (the module and op
that made a step non-finite). The health of every step (``ls --health``) is charted when the
dump holds it.

Exit 0 written; 1 written with steps that could not be read (truncated or corrupt: marked in the
page, the other steps shown), or nothing written because the split has no recorded step; 2 bad
input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout_mock.debug.report_data import DEFAULT_MAX_SAMPLES

__all__ = ["COMMANDS", "add_explain_parser", "add_parser", "run", "run_explain"]

_EXPLAIN_DOC = """``rollout-mock explain DUMP --step N -- CMD``: which module and which op made step N's numbers
non-finite.

CMD (an argument vector, no shell: ``sh -c '...'`` for one) is the training script; it runs with
ROLLOUT_MOCK_MODE=mock, ROLLOUT_MOCK_DUMP_DIR=DUMP (absolute; CMD must pass both to its config, as
for ``bisect``) and ROLLOUT_MOCK_EXPLAIN. When a wrapped scheduler of --split starts the call of
step N, rollout_mock starts an anomaly probe on that thread: every ATen op's output is checked
(a TorchDispatchMode), every nn.Module is hooked (forward, and its output gradient in backward).
At the next call of the split (or at exit) the probe stops, writes the JSON report (--out) and
CMD stops. The report names the first op that made NaN/inf from finite inputs (or passed
--max-abs), the module it ran in (none: the loss code), the source line and the statistics of its
inputs; ``rollout-mock report DUMP --explain FILE`` shows it. {dump} in CMD is replaced by DUMP.

Exit 0 step N ran clean; 1 an anomaly was found (printed); 2 bad input; 3 no report: CMD never
called step N of the split (or failed before it).
"""


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
    parser.add_argument("--explain", type=Path, action="append", default=[], metavar="FILE",
                        help="a report of rollout-mock explain to show (repeatable)")
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
                           progress=False if args.no_progress else None, explain=args.explain)
    path = report.write(args.output)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB); open it in a browser (no server needed)")
    bad = report.unreadable
    if bad:
        print(f"rollout-mock report: {len(bad)} step{'s' if len(bad) != 1 else ''} could not be read "
              f"({format_ranges([s.step for s in bad])}; first: step {bad[0].step}: {bad[0].error}); they are "
              f"marked in the page, the other steps are shown", file=sys.stderr)
        return 1
    return 0


def add_explain_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "explain",
        help="replay one step into the training code with anomaly hooks: the module and op that made NaN/inf",
        description=_EXPLAIN_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s DUMP --step N [options] -- CMD [ARG ...]",
    )
    parser.add_argument("dump_dir", metavar="DUMP", type=Path, help="the dump the training replays")
    parser.add_argument("--step", type=int, metavar="N", help="the step to explain (required)")
    parser.add_argument("--split", default="train", help="the split whose step N is watched (default train)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="the JSON report (default: explain-step-N.json in the current folder)")
    parser.add_argument("--max-abs", type=float, metavar="X",
                        help="also report the first op whose output jumps past |X| from inputs below it")
    parser.add_argument("--detect-anomaly", action="store_true",
                        help="run the step under torch.autograd.detect_anomaly: an op blamed in backward "
                             "carries the forward line it differentiates (slower)")
    parser.add_argument("--keep-going", action="store_true",
                        help="let CMD run on after step N (default: it stops once the report is written)")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                        help="most seconds CMD may run (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the training command")
    parser.set_defaults(_explain_parser=parser)
    return parser


def run_explain(args: argparse.Namespace) -> int:
    import json
    import os
    import subprocess
    import sys

    from rollout_mock.cli import resolve_dump
    from rollout_mock.debug.forensics import ENV_VAR, ExplainSpec, format_explain, read_explain
    from rollout_mock.errors import DebugInputError

    if "--" in args.cmd and args.cmd[0] != "--":  # options after DUMP: REMAINDER took them with CMD
        cut = args.cmd.index("--")
        head, rest = args.cmd[:cut], args.cmd[cut:]
        args = args._explain_parser.parse_args([*head, str(args.dump_dir)])
        args.cmd = rest
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.step is None:
        raise DebugInputError("explain: --step N is required: rollout-mock explain DUMP --step N -- CMD")
    if not argv:
        raise DebugInputError("explain: no CMD after --: rollout-mock explain DUMP --step N -- python train.py ...")
    if args.step < 0:
        raise DebugInputError(f"--step {args.step}: must be >= 0")
    dump = Path(resolve_dump(args.dump_dir, "explain", f"--step {args.step} -- CMD")).resolve()
    out = (args.out or Path(f"explain-step-{args.step}.json")).resolve()
    out.unlink(missing_ok=True)
    spec = ExplainSpec(step=args.step, out=str(out), split=args.split, max_abs=args.max_abs,
                       detect_anomaly=args.detect_anomaly, stop=not args.keep_going)
    env = {**os.environ, "ROLLOUT_MOCK_MODE": "mock", "ROLLOUT_MOCK_DUMP_DIR": str(dump), ENV_VAR: spec.to_env()}
    argv = [a.replace("{dump}", str(dump)) for a in argv]
    try:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, timeout=args.timeout, check=False)
        code: int | str = proc.returncode
    except OSError as exc:
        raise DebugInputError(f"explain: cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        code = f"timed out after {args.timeout:g}s"
    if not out.is_file():
        print(f"rollout-mock explain: no report: CMD ({code if isinstance(code, str) else f'exit {code}'}) never "
              f"called step {args.step} of {args.split} through a wrapped scheduler; does it read "
              f"ROLLOUT_MOCK_MODE and ROLLOUT_MOCK_DUMP_DIR, and run that many steps?", file=sys.stderr)
        return 3
    report = read_explain(out)
    print(json.dumps(report, indent=2) if args.json else format_explain(report) + f"\n  report: {out}")
    return 1 if report.get("verdict") == "anomaly" else 0


COMMANDS = {
    "report": (add_parser, run),
    "explain": (add_explain_parser, run_explain),
}
