"""``rollout-mock logprobs DUMP --model DIR``: recompute recorded log-probs with a training model.

Compares, per response token, the log-prob the rollout engine recorded with the one a training-side
model gives (a local Hugging Face directory, or ``package.module:factory``). Prints the mean/max
``|Δlogp|``, NeMo-RL's ``token_mult_prob_error`` (mean of ``exp|Δlogp|``), a per-step table and the
worst samples and tokens. Keys of ROLL, verl, AReaL and slime batches are found automatically.
Exit 0 within the threshold, 1 over it, 2 on bad input.

Try it on a ``rollout-mock demo`` dump with the demo's own policy (step 0 matches; later steps
were sampled after training updates and do not)::

    rollout-mock logprobs DUMP --model rollout_mock.demo:initial_policy --steps 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "logprobs",
        help="recompute recorded log-probs with a training-side model and compare (CI gate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_dir", metavar="DUMP", type=Path, help="dump directory (holds manifest.json)")
    parser.add_argument("--model", required=True, metavar="HF_DIR|MODULE:FACTORY",
                        help="local Hugging Face model directory (never downloads), or package.module:factory "
                             "returning a model or fn(input_ids, attention_mask) -> logits")
    parser.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. 0-3,7 (default: all recorded)")
    parser.add_argument("--split", default="train", help="the split to read (default: train)")
    parser.add_argument("--keys", metavar="logprobs=K,tokens=K,mask=K",
                        help="name the batch keys instead of finding them")
    parser.add_argument("--threshold", type=float, default=1.05,
                        help="fail (exit 1) when token_mult_prob_error exceeds this, overall or in any step "
                             "(default 1.05, NeMo-RL's)")
    parser.add_argument("--max-abs-threshold", type=float, default=None, metavar="X",
                        help="also fail when any token's |Δlogp| exceeds X")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass (default 8)")
    parser.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="load the model in this dtype (default: the model's own)")
    parser.add_argument("--top", type=int, default=5, help="worst samples and tokens listed (default 5)")
    parser.add_argument("--json", action="store_true", help="print the report as strict JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    parser.add_argument("--trust", action="store_true",
                        help="load steps with the plain unpickler (only for dumps you trust)")
    return parser


def parse_step_ranges(text: str) -> list[int]:
    """``"0-3,7"`` -> ``[0, 1, 2, 3, 7]`` (bounded ranges only)."""
    from rollout_mock.errors import DebugInputError

    steps: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise DebugInputError(f"{text!r}: expected ranges like 0-3,7") from None
        if last < first:
            raise DebugInputError(f"{text!r}: range {part} is empty")
        steps += range(first, last + 1)
    return sorted(set(steps))


def run(args: argparse.Namespace) -> int:
    import torch

    from rollout_mock.cli import resolve_dump
    from rollout_mock.debug.logprobs import format_logprob_report, logprob_consistency
    from rollout_mock.text import dumps_json

    dump_dir = resolve_dump(args.dump_dir, "logprobs", ["--model", str(args.model)])
    report = logprob_consistency(
        dump_dir,
        args.model,
        steps=None if args.steps is None else parse_step_ranges(args.steps),
        split=args.split,
        keys=args.keys,
        threshold=args.threshold,
        max_abs_threshold=args.max_abs_threshold,
        batch_size=args.batch_size,
        device=args.device,
        dtype=None if args.dtype is None else getattr(torch, args.dtype),
        trusted=args.trust,
        top=args.top,
        progress=False if args.no_progress else None,
    )
    if args.json:
        print(dumps_json(report.to_json(), indent=2))
    else:
        print(format_logprob_report(report))
    sys.stdout.flush()
    return 0 if report.ok else 1
