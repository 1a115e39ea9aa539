"""``rollout-mock show DUMP_DIR``: print a recorded step's rollouts as readable traces.

Each sequence becomes one trace: its reward, then its messages labelled by role (from the
attention and loss masks: 1 = assistant, the first 0 run = user, later 0 runs = tool; a chat
prompt recorded as text is shown as-is). Token ids are shown as ids unless ``--tokenizer`` names a
local tokenizer directory to decode them with. Steps are loaded with the safe loader (``--trust``
for dumps holding other objects). Exit 0 shown, 2 bad input (missing step, bad tokenizer, ...).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.storage.manifest import StepSet

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show",
        help="print a recorded step's rollouts as readable traces (prompt, completion, reward)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_dir", metavar="DUMP_DIR", help="dump directory or fsspec URL (holds manifest.json)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="this step (default: the first recorded step)")
    which.add_argument("--steps", metavar="RANGES", help="the recorded steps in these ranges, e.g. 0-3 or 0-9,12,20-")
    parser.add_argument("--split", default="train",
                        help="the split to read (default: train; all its named streams, e.g. ROLL's "
                             "per-domain train/math, train/code), or one stream key such as train/math")
    parser.add_argument("--max", type=int, default=32, metavar="N", dest="max_traces",
                        help="at most N traces per step; rejected trajectories count (default: 32)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR",
                        help="decode token ids with this local tokenizer directory (transformers; never downloads)")
    parser.add_argument("--jsonl", action="store_true", help="one JSON object per trace on stdout")
    parser.add_argument("--trust", action="store_true",
                        help="load steps with the plain unpickler (arbitrary objects: only for dumps you trust)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (default: over several steps, when stderr is a terminal and the "
                             "output is not)")
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_tokenizer(directory: Path) -> Any:
    """``AutoTokenizer.from_pretrained(directory, local_files_only=True)``, or a one-line
    :class:`~rollout_mock.compare.traces.TraceError` when transformers is missing or the directory holds
    no tokenizer (never a download, never a traceback)."""
    from rollout_mock.errors import TraceError

    if not directory.is_dir():
        raise TraceError(f"--tokenizer {directory}: not a directory")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TraceError(f"--tokenizer needs transformers (pip install transformers): {_one_line(exc)}") from None
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a bad directory
        raise TraceError(f"--tokenizer {directory}: not a tokenizer directory ({_one_line(exc)})") from None


def _selected_steps(args: argparse.Namespace, recorded: StepSet) -> list[int]:
    """The steps to show; a requested step that is not recorded is kept so that loading it raises
    the library's StepNotFoundError (and so is the first step of a range that matches none). The
    recorded steps are intersected run by run: a forged index of millions of steps costs nothing
    unless those steps are asked for."""
    from rollout_mock.compare.diff import parse_steps

    if args.step is not None:
        return [args.step]
    if args.steps is None:
        return recorded[:1] or [0]
    ranges = parse_steps(args.steps)
    chosen = sorted({step for lo, hi in ranges for first, last in recorded.runs()
                     for step in range(max(first, lo), (last if hi is None else min(last, hi)) + 1)})
    return chosen or [ranges[0][0]]


def run(args: argparse.Namespace) -> int:
    from rollout_mock.errors import TraceError
    from rollout_mock.storage.reader import open_dump

    if args.max_traces < 0:
        raise TraceError(f"--max {args.max_traces}: must be >= 0")
    from rollout_mock.cli import resolve_dump
    from rollout_mock.errors import StepNotFoundError
    from rollout_mock.storage.manifest import format_ranges

    tokenizer = None if args.tokenizer is None else load_tokenizer(args.tokenizer)
    dump = open_dump(resolve_dump(args.dump_dir, "show"))
    streams = [s for s in dump.streams() if s.key == args.split]
    if not streams:
        streams = [s for s in dump.streams() if s.split == args.split and s.rank is None]
    if not streams:
        known = ", ".join(s.key for s in dump.streams()) or "none"
        raise StepNotFoundError(
            f"{dump.dump_dir} has no stream {args.split!r} (recorded: {known}); pass one with --split",
            split=args.split, path=dump.dump_dir,
        )
    from rollout_mock.text import progress_bar

    # a bar over the steps when the traces go to a file or a pipe (on a terminal they are the progress)
    shown = not args.no_progress and not sys.stdout.isatty()
    total = sum(len(_selected_steps(args, dump.steps(stream))) for stream in streams)
    i = 0
    said: set[int] = set()  # the steps whose "no sequences" hint was printed (once is enough)
    with progress_bar(total if total > 1 else 0, enabled=None if shown else False, unit="step", unit_scale=False,
                      desc="show") as bar:
        for stream in streams:
            i = _show_stream(args, dump, stream, tokenizer, i, format_ranges, bar, said)
    sys.stdout.flush()
    return 0


def _show_stream(args: argparse.Namespace, dump: Any, stream: Any, tokenizer: Any, i: int, format_ranges: Any,
                 bar: Any, said: set[int]) -> int:
    from rollout_mock.compare.traces import batch_traces, count_traces, format_traces, traces_to_jsonl
    from rollout_mock.errors import StepNotFoundError

    recorded = dump.steps(stream)
    for step in _selected_steps(args, recorded):
        if step not in recorded:
            raise StepNotFoundError(
                f"step {step} is not in {dump.dump_dir} (stream {stream}: recorded steps "
                f"{format_ranges(recorded)}); pick one of those with --step",
                split=stream.split, step=step, path=dump.dump_dir,
            )
        batch = dump.load(step, stream, trusted=args.trust, mapped=True)
        traces = batch_traces(batch, max_traces=args.max_traces, tokenizer=tokenizer, step=step)
        bar.update(1)
        total = count_traces(batch)
        hint = None
        if not total:
            hint = _no_sequences(dump, stream, step) if not said else f"no sequences (see step {min(said)})"
        if hint is not None:
            said.add(step)
        if args.jsonl:
            sys.stdout.write(traces_to_jsonl(traces, step))
            if hint is not None and len(said) == 1:
                print(f"rollout-mock show: {stream} step {step}: {hint}", file=sys.stderr)
            i += 1
            continue
        rejected = sum(t.status == "rejected" for t in traces)
        print(("\n" if i else "") + f"=== {stream} step {step}: {len(traces)} of {total if total is not None else '?'} "
              f"traces shown ({rejected} rejected)")
        i += 1
        if traces:
            print(format_traces(traces))
        elif hint is not None:
            print(f"  {hint}")
    return i


def _no_sequences(dump: Any, stream: Any, step: int) -> str:
    """Why a step shows no trace: it holds no token or text sequence; what it holds instead, and
    where its numbers can be read."""
    entry = dump.entry(stream, step)
    keys = [] if entry is None else list(entry.keys)
    if any(k.rsplit(".", 1)[-1] in ("input_ids", "prompts", "responses") for k in keys):
        return "no sequences to show: the batch has 0 rows"
    more = f" and {len(keys) - 12} more" if len(keys) > 12 else ""
    listed = ", ".join(keys[:12]) + more if keys else "none recorded"
    where = shlex.quote(str(dump.dump_dir))
    return (f"no sequences to show: show reads token ids (input_ids, or prompts + responses), slime samples, "
            f"AReaL trajectories or chat text (raw_prompt, messages, prompt), and this step holds none of them "
            f"(its keys: {listed}). Its values: rollout-mock ls {where} --keys, rollout-mock report {where}, "
            f"or open_dump({str(dump.dump_dir)!r}).load({step}) in Python")
