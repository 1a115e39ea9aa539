"""``rollout-mock demo``: record a toy GRPO run, replay it with the rollout never built, verify.

Exit code 0 when the replay is bit-identical to the recording (and, with
``--negative-control``, when the deliberately changed run is caught); 1 otherwise.
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
from pathlib import Path

COLUMNS = ("pg_loss", "grad_norm", "approx_kl", "reward_mean")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "demo",
        help="record a toy RL run, replay it from disk, and verify the metrics are bit-identical",
        description=__doc__,
    )
    parser.add_argument("--steps", type=int, default=8, help="training steps per run (default 8)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step (default 64)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where dumps and metrics go (default: a new temporary directory, kept for inspection)",
    )
    parser.add_argument(
        "--negative-control",
        action="store_true",
        help="also replay with a different micro-batch split (a change in summation order) and "
        "show that verification catches it",
    )
    return parser


def _say(*parts: object) -> None:
    """print, flushed: the log lines (stderr) and this output (stdout) keep their order when both
    are piped into one file or pager."""
    print(*parts, flush=True)


def _check_sizes(steps: int, batch_size: int) -> None:
    """Bad sizes fail before anything runs, with the valid values."""
    from rollout_mock.demo import GROUP_SIZE
    from rollout_mock.errors import RolloutMockError

    if steps < 1:
        raise RolloutMockError(f"--steps {steps}: must be at least 1, e.g. rollout-mock demo --steps 8")
    if batch_size < GROUP_SIZE or batch_size % GROUP_SIZE:
        fix = max(GROUP_SIZE, batch_size // GROUP_SIZE * GROUP_SIZE)
        raise RolloutMockError(
            f"--batch-size {batch_size}: must be a positive multiple of {GROUP_SIZE} (the demo samples "
            f"{GROUP_SIZE} responses per prompt), e.g. rollout-mock demo --batch-size {fix}")


def _fmt(value: float) -> str:
    return f"{value: .10f}"


def _print_table(dump: dict[int, dict[str, float]], mock: dict[int, dict[str, float]]) -> None:
    header = ["step"] + [f"{name} ({side})" for name in COLUMNS[:2] for side in ("dump", "mock")]
    header += ["reward_mean", "bit-identical"]
    rows = []
    for step in sorted(dump):
        a, b = dump[step], mock.get(step, {})
        same = a == b and all(repr(a[k]) == repr(b.get(k)) for k in a)
        rows.append(
            [str(step)]
            + [_fmt(m[name]) if name in m else "-" for name in COLUMNS[:2] for m in (a, b)]
            + [f"{a['reward_mean']:.3f}", "yes" if same else "NO"]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    _say("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        _say("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def run(args: argparse.Namespace) -> int:
    from rollout_mock.compare.verify import format_report, verify
    from rollout_mock.demo import run_pipeline
    from rollout_mock.errors import RolloutMockError
    from rollout_mock.storage.manifest import MANIFEST_NAME

    _check_sizes(args.steps, args.batch_size)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rollout-mock-demo-"))
    if workdir.exists() and not workdir.is_dir():
        raise RolloutMockError(f"--workdir {workdir} is a file; pass a folder, e.g. "
                               f"rollout-mock demo --workdir {shlex.quote(f'{workdir}.d')}")
    dump_dir = workdir / "dump"
    if (dump_dir / MANIFEST_NAME).is_file() or (workdir.is_dir() and any(workdir.iterdir())):
        fresh = workdir.parent / (workdir.name + "-2")
        n = 2
        while fresh.exists():
            n += 1
            fresh = workdir.parent / f"{workdir.name}-{n}"
        raise RolloutMockError(
            f"--workdir {workdir} is not empty (a previous demo's dump would be overwritten); "
            f"use a new folder: rollout-mock demo --workdir {shlex.quote(str(fresh))}  (or delete {workdir})")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RolloutMockError(f"--workdir {workdir}: cannot create it ({exc.strerror}); pick a writable "
                               f"folder, e.g. rollout-mock demo --workdir /tmp/rollout-mock-demo") from None
    common = {"steps": args.steps, "batch_size": args.batch_size}
    _say(f"rollout-mock demo: {args.steps} GRPO steps on a toy policy, CPU; files in {workdir}\n")

    dump = run_pipeline("dump", dump_dir, workdir / "dump_metrics.jsonl", **common)
    _say(f"1. dump run: rollouts sampled from the policy and recorded to {dump_dir} "
          f"({dump.seconds:.2f} s, scheduler built {dump.scheduler_constructed}x)")
    mock = run_pipeline("mock", dump_dir, workdir / "mock_metrics.jsonl", **common)
    _say(f"2. mock run: rollouts replayed from disk ({mock.seconds:.2f} s, scheduler built "
          f"{mock.scheduler_constructed}x — no inference engine in mock mode)\n")
    _print_table(dump.metrics, mock.metrics)

    report = verify(dump.metrics_path, mock.metrics_path)
    _say(f"\n3. rollout-mock verify {dump.metrics_path.name} {mock.metrics_path.name}")
    _say(format_report(report))
    ok = report.ok and mock.scheduler_constructed == 0
    verdict = "BIT-IDENTICAL" if report.ok else "DIFFERENT"
    _say(f"\nResult: replayed metrics are {verdict} to the recorded run; "
          f"dump {dump.seconds:.2f} s vs mock {mock.seconds:.2f} s "
          f"({dump.seconds / max(mock.seconds, 1e-9):.1f}x faster without rollouts).")

    if args.negative_control:
        _say("\n4. negative control: the same replay with 4 micro-batches instead of 2 "
             "(same maths, different summation order); the verdict lines below are expected")
        changed = run_pipeline("mock", dump_dir, workdir / "changed_metrics.jsonl", micro_batches=4, **common)
        negative = verify(dump.metrics_path, changed.metrics_path)
        _say(format_report(negative))
        caught = not negative.ok
        first = negative.first_divergence
        if caught and first is not None:
            _say(f"Caught: first divergence at step {first.first_divergent_step} in {first.name} "
                  f"({first.baseline_value!r} vs {first.candidate_value!r}).")
        else:
            _say("NOT caught: the changed computation produced identical numbers.")
        ok = ok and caught
    dump_arg, report_arg = shlex.quote(str(dump_dir)), shlex.quote(str(workdir / "report.html"))  # paths with spaces
    _say(f"\nnext: rollout-mock ls {dump_arg} --keys   (what was recorded)\n"
         f"      rollout-mock show {dump_arg} --step 0   (the rollouts as readable traces)\n"
         f"      rollout-mock report {dump_arg} -o {report_arg}   (plots and a sample browser)\n"
         f"      rollout-mock logprobs {dump_arg} --model rollout_mock.demo:initial_policy --steps 0   "
         f"(recompute the recorded log-probs)")
    return 0 if ok else 1
