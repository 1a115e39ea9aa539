"""``rollout-mock bisect --good REV --bad REV --dump DUMP -- CMD``: the commit that changed the numbers.

Every commit replays the same dump in mock mode. CMD runs at --good (its metrics are the reference,
or must match --reference dump|FILE), at --bad (if it matches, there is nothing to find), then
the commits between, halving the range each time (the split points of ``git rev-list
--bisect-all``), all in a temporary ``git worktree add --detach`` removed at the end (also on errors
and Ctrl-C): your checkout, index, HEAD, branches and bisect state are never touched (no ``git
bisect`` runs). No git hook of the repository runs (every git command gets ``core.hooksPath`` = an
empty folder); each run starts from a clean checkout. A --metrics-file whose folder a commit makes
a symlink out of the worktree skips that commit; nothing is removed or created through it.

CMD is an argument vector run in the worktree's root, with no shell (``sh -c '...'`` for one);
``{dump}``, ``{metrics}`` and ``{rev}`` in it are replaced, and its environment holds
ROLLOUT_MOCK_MODE=mock, ROLLOUT_MOCK_DUMP_DIR (absolute), ROLLOUT_MOCK_METRICS (the file to write:
fresh per commit, outside the worktree; or --metrics-file) and ROLLOUT_MOCK_BISECT_REV. A commit is
good when its metrics match the reference by verify's rules (bitwise unless --rtol/--atol), bad
otherwise, skipped (never blamed) when CMD fails, times out or writes none.

Exit codes: 0 good (--bad reproduces the reference: no bad commit), 1 bad (the first bad commit is
named with its first divergent step, metric and both values), 2 bad input (no repository,
unknown revision, no dump, git failed), 3 inconclusive (--good or --bad does not run, --good does
not match the reference, skipped commits hide the first bad one, --max-tests reached), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout_mock.cli import resolve_dump
from rollout_mock.cli.verify import Tolerance, first_failure, parse_metric_names, parse_tolerances, verify_with_options
from rollout_mock.compare.metrics import MetricsTable, read_metrics
from rollout_mock.errors import BisectError, MetricsError
from rollout_mock.text import json_float

__all__ = ["EXIT_BAD", "EXIT_GOOD", "EXIT_INCONCLUSIVE", "add_parser", "run"]

EXIT_GOOD, EXIT_BAD, EXIT_INCONCLUSIVE = 0, 1, 3
_VERDICTS = ("good", "bad", "skip")
_GRACE_S = 5.0
_GIT = ("git",)


def _git_env() -> dict[str, str]:
    """This process's environment plus ``core.hooksPath`` = an empty folder of ours, through
    ``GIT_CONFIG_COUNT``/``KEY``/``VALUE`` (after any the user set): no hook of the repository
    (``post-checkout``, ``reference-transaction``...) runs for any git command bisect starts."""
    env = dict(os.environ)
    try:
        count = int(env.get("GIT_CONFIG_COUNT") or 0)
    except ValueError:
        count = 0
    env.update({"GIT_CONFIG_COUNT": str(count + 1), f"GIT_CONFIG_KEY_{count}": "core.hooksPath",
                f"GIT_CONFIG_VALUE_{count}": _no_hooks()})
    return env


_NO_HOOKS: list[str] = []


def _no_hooks() -> str:
    """An empty folder (made once per process, removed at exit) that git takes as the hooks folder."""
    if not _NO_HOOKS:
        import atexit

        _NO_HOOKS.append(tempfile.mkdtemp(prefix="rollout-mock-no-hooks-"))
        atexit.register(shutil.rmtree, _NO_HOOKS[0], True)
    return _NO_HOOKS[0]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bisect", help="find the commit that changed the metrics (a bisection, one dump replayed at each commit)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --good REV --bad REV --dump DUMP [options] -- CMD [ARG ...]")
    add = parser.add_argument
    add("--good", required=True, metavar="REV", help="a revision whose numbers are right")
    add("--bad", required=True, metavar="REV", help="a later revision whose numbers differ")
    add("--dump", required=True, metavar="DUMP", help="the dump every commit replays in mock mode")
    add("--reference", default="good", metavar="REF",
        help="the metrics to match: good (CMD's at --good; default), dump (the dump run's, stored in DUMP) or a FILE")
    add("--metrics-file", metavar="PATH", help="where CMD writes its metrics, relative to the repository root "
        "(default: a fresh file per commit outside the worktree: {metrics}, $ROLLOUT_MOCK_METRICS)")
    add("--rtol", action="append", default=[], metavar="[METRIC=]FLOAT", help="as for verify (default 0: bitwise)")
    add("--atol", action="append", default=[], metavar="[METRIC=]FLOAT", help="as for verify (default 0: bitwise)")
    add("--metrics", metavar="A,B,...", help="compare only these metrics (default: every metric)")
    add("--repo", default=".", metavar="DIR", help="the git repository (default: the current folder's)")
    add("--timeout", type=float, default=3600.0, metavar="S",
        help="most seconds CMD may run at one commit; past it the commit is skipped (default 3600)")
    add("--git-timeout", type=float, default=600.0, metavar="S", help="most seconds for one git command (default 600)")
    add("--max-tests", type=int, default=64, metavar="N", help="most commits tested between the two ends (default 64)")
    add("--log-dir", metavar="DIR", help="keep CMD's output there, one REV.log per commit")
    add("--json", action="store_true", help="print the result as JSON on stdout")
    add("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command run at each commit")
    return parser


@dataclass
class _Plan:
    """What testing one commit needs."""

    argv: list[str]
    worktree: str
    work: str  # the scratch folder: metrics/ and logs/
    dump: str
    metrics_file: str | None
    timeout: float
    git_timeout: float
    max_tests: int
    log_dir: str
    names: list[str] | None
    rtol: Tolerance
    atol: Tolerance


@dataclass
class _Tested:
    """One commit's result; ``step``, ``metric`` and both values locate a bad one's first divergence."""

    rev: str
    subject: str
    verdict: str  # good | bad | skip
    reason: str
    seconds: float
    log: str
    step: int | None = None
    metric: str | None = None
    reference_value: float | None = None
    value: float | None = None


def _git(args: Sequence[str], cwd: str | Path, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run([*_GIT, *args], cwd=cwd, capture_output=True, encoding="utf-8", errors="replace",
                              stdin=subprocess.DEVNULL, timeout=timeout, env=_git_env())
    except FileNotFoundError:
        raise BisectError("git is not installed (or not on PATH); bisect checks out commits with git") from None
    except subprocess.TimeoutExpired:
        raise BisectError(f"`git {' '.join(args)}` took more than {timeout:g}s; raise --git-timeout") from None
    said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    if check and proc.returncode != 0:
        raise BisectError(f"`git {' '.join(args)}` failed in {cwd}: {said[-1] if said else proc.returncode}")
    return proc


@contextmanager
def _worktree(repo: Path, rev: str, timeout: float) -> Iterator[tuple[Path, Path]]:
    """A detached worktree of ``rev`` in a new temporary folder, and the folder: removed on any exit."""
    tmp = Path(tempfile.mkdtemp(prefix="rollout-mock-bisect-"))
    tree, admin = tmp / tmp.name, None  # a unique name: git names the worktree after its folder
    try:
        _git(["worktree", "add", "--detach", str(tree), rev], repo, timeout)
        admin = Path(_git(["rev-parse", "--absolute-git-dir"], tree, timeout).stdout.strip())
        yield tree, tmp
    finally:
        try:  # a failure here is reported (exit 2); what is left is then a stale `git worktree list` entry
            if admin is not None:
                _git(["worktree", "remove", "--force", "--force", str(tree)], repo, timeout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _kill(proc: subprocess.Popen[Any], grace: float = _GRACE_S) -> None:
    """End a session leader's process group: SIGTERM, SIGKILL after ``grace`` s; wait until it is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        try:
            os.killpg(proc.pid, sig)
            while time.monotonic() < deadline:
                proc.poll()  # reaps the leader; init reaps the others once it is gone
                os.killpg(proc.pid, 0)
                time.sleep(0.02)
        except ProcessLookupError:  # nothing left in the group
            proc.wait()
            return


def _run_cmd(plan: _Plan, rev: str, metrics: Path, log: Path) -> str | None:
    """Run CMD at ``rev`` (its output into ``log``); why it failed, or None."""
    values = {"{dump}": plan.dump, "{metrics}": str(metrics), "{rev}": rev}
    argv = [re.sub(r"\{(?:dump|metrics|rev)\}", lambda m: values[m.group()], arg) for arg in plan.argv]
    env = {**os.environ, "ROLLOUT_MOCK_MODE": "mock", "ROLLOUT_MOCK_DUMP_DIR": plan.dump,
           "ROLLOUT_MOCK_METRICS": str(metrics), "ROLLOUT_MOCK_BISECT_REV": rev}
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(argv, cwd=plan.worktree, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        try:
            code = proc.wait(timeout=plan.timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {plan.timeout:g}s (--timeout)"
        finally:
            _kill(proc)  # on a timeout, Ctrl-C or SIGTERM too; after an exit, whatever CMD left running
    if code == 0:
        return None
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        last = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return f"CMD exited with code {code}" + (f": {last[-1][:200]}" if last else "")


def _fresh_metrics(tree: Path, rel: str) -> str | None:
    """Make way for CMD's ``--metrics-file`` in the worktree: why the commit cannot be tested
    (skipped), or None. The commit decides what is at that path: a symlinked folder leading out of
    the worktree is refused (nothing is removed or created through it), a committed file or link
    is unlinked (the link itself, never its target), a committed directory is left alone."""
    root = os.path.realpath(tree)
    path = tree / rel
    folder = os.path.realpath(path.parent)
    if folder != root and not folder.startswith(root + os.sep):
        return f"--metrics-file {rel}: its folder leads out of the worktree in this commit (a symlink to {folder})"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"--metrics-file {rel}: {exc.strerror}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"--metrics-file {rel} is a directory in this commit"
    try:
        if mode is not None:
            os.unlink(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a folder should be, in this commit
        return f"--metrics-file {rel}: {exc.strerror or exc}"
    return None


def _test(plan: _Plan, reference: MetricsTable | None) -> tuple[_Tested, MetricsTable | None]:
    """Run CMD at the worktree's HEAD and judge its metrics (``reference=None``: it is the reference
    run), then reset the worktree to a clean checkout."""
    tree, start = Path(plan.worktree), time.monotonic()
    rev, _, subject = _git(["log", "-1", "--format=%H %s"], tree, plan.git_timeout).stdout.strip().partition(" ")
    metrics = tree / plan.metrics_file if plan.metrics_file else Path(plan.work) / "metrics" / f"{rev}.jsonl"
    tested, table = _Tested(rev, subject, "skip", "", 0.0, str(Path(plan.log_dir) / f"{rev[:12]}.log")), None
    try:  # a committed metrics file must not count: only what this run writes
        failure = _fresh_metrics(tree, plan.metrics_file) if plan.metrics_file else None
        if failure is None:
            metrics.parent.mkdir(parents=True, exist_ok=True)
            failure = _run_cmd(plan, rev, metrics, Path(tested.log))
        try:
            table = None if failure else read_metrics(metrics)
        except MetricsError as exc:  # none written (MetricsNotFoundError), empty, malformed
            failure = f"no readable metrics: {exc}"
    finally:
        _git(["reset", "--hard", "-q"], tree, plan.git_timeout)
        _git(["clean", "-ffdxq"], tree, plan.git_timeout)
    report = None if table is None or reference is None else verify_with_options(
        reference, table, rtol=plan.rtol, atol=plan.atol, metrics=plan.names)
    bad = None if report is None else first_failure(report, ("reference", "this commit"))
    tested.verdict = "skip" if table is None else "bad" if bad else "good"
    tested.reason = failure or (bad.reason if bad else "matches the reference" if report else "the reference")
    tested.seconds = round(time.monotonic() - start, 2)
    if bad is not None:
        tested.step, tested.metric, tested.reference_value, tested.value = (
            bad.step, bad.metric, bad.baseline_value, bad.candidate_value)
    return tested, table


class _Progress:
    """One line per tested commit on stderr: ``[3/~6] 1a2b3c4d5e6f subject: bad (why) 2.1s``."""

    def __init__(self, quiet: bool, total: int) -> None:
        self.quiet, self.total = quiet, total
        self.tested: list[_Tested] = []

    def add(self, tested: _Tested) -> None:
        self.tested.append(tested)
        self.total = max(self.total, len(self.tested))
        if not self.quiet:
            print(f"[{len(self.tested)}/~{self.total}] {tested.rev[:12]} {tested.subject[:60]}: {tested.verdict} "
                  f"({tested.reason}) {tested.seconds:.1f}s", file=sys.stderr, flush=True)

    def estimate(self, candidates: int) -> None:
        """``candidates`` commits left: about log2 of them still to test."""
        self.total = len(self.tested) + (math.ceil(math.log2(candidates)) if candidates > 1 else 0)


def _candidates(plan: _Plan, bad: str, goods: list[str]) -> list[str]:
    """The commits that may be the first bad one: reachable from ``bad``, not from any good one,
    best split point first (``git rev-list --bisect-all``: read-only, no ref moves)."""
    out = _git(["rev-list", "--bisect-all", bad, "--not", *goods], plan.worktree, plan.git_timeout).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _bisect_loop(plan: _Plan, reference: MetricsTable, good: str, bad: str,
                 progress: _Progress) -> tuple[str | None, list[str], str | None]:
    """Bisect ``good..bad`` by checking out each commit to test in the worktree (``git checkout
    --detach``, hooks off): ``(first bad commit, candidates hidden by skipped commits, why it gave
    up)``. Not ``git bisect``: on git 2.39 its helper updates refs with the repository's
    ``reference-transaction`` hook whatever ``core.hooksPath`` says, and it writes bisect state."""
    goods, skipped, tests = [good], set(), 0
    while True:
        candidates = _candidates(plan, bad, goods)
        progress.estimate(len(candidates))
        left = [rev for rev in candidates if rev != bad and rev not in skipped]
        if not left:
            return (bad, [], None) if len(candidates) <= 1 else (None, candidates, None)
        if tests >= plan.max_tests:
            return None, [], f"--max-tests {plan.max_tests} reached"
        tests += 1
        _git(["checkout", "-q", "--detach", left[0]], plan.worktree, plan.git_timeout)
        tested, _ = _test(plan, reference)
        progress.add(tested)
        if tested.verdict == "good":
            goods.append(tested.rev)
        elif tested.verdict == "bad":
            bad = tested.rev
        else:
            skipped.add(tested.rev)


def run(args: argparse.Namespace) -> int:
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise BisectError("no command to run: give it after --, e.g. rollout-mock bisect --good v1.2 --bad HEAD "
                          "--dump dumps/run1 -- python train.py")
    for option, value in (("--timeout", args.timeout), ("--git-timeout", args.git_timeout),
                          ("--max-tests", args.max_tests)):
        if not 0 < value < math.inf:
            raise BisectError(f"{option} {value}: must be a number > 0")
    if args.metrics_file and (Path(args.metrics_file).is_absolute() or ".." in Path(args.metrics_file).parts):
        raise BisectError(f"--metrics-file {args.metrics_file}: must be a path inside the repository, relative to "
                          "its root (or leave it out: CMD then writes to {metrics}, $ROLLOUT_MOCK_METRICS)")
    rtol, atol = parse_tolerances(args.rtol, "--rtol"), parse_tolerances(args.atol, "--atol")
    names, timeout = parse_metric_names(args.metrics), args.git_timeout
    if not Path(args.repo).is_dir():
        raise BisectError(f"--repo {args.repo}: no such folder")
    repo = Path(_git(["rev-parse", "--show-toplevel"], args.repo, timeout).stdout.strip())
    good, bad = (_git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], repo, timeout,
                      False).stdout.strip() for rev in (args.good, args.bad))
    for rev, sha in ((args.good, good), (args.bad, bad)):
        if not sha:
            raise BisectError(f"unknown revision {rev!r} in {repo} (not a commit there)")
    if good == bad:
        raise BisectError(f"--good {args.good} and --bad {args.bad} are the same commit {good[:12]}")
    if _git(["merge-base", "--is-ancestor", good, bad], repo, timeout, False).returncode != 0:
        raise BisectError(f"--good {args.good} is not an ancestor of --bad {args.bad}: bisect needs the good "
                          "revision older than the bad one")
    dump = resolve_dump(args.dump, "bisect")
    dump = dump if isinstance(dump, str) else str(Path(dump).resolve())
    reference = None if args.reference == "good" else read_metrics(dump if args.reference == "dump" else args.reference)
    if reference is not None:  # the names and tolerances, checked before any run
        verify_with_options(reference, reference, rtol=rtol, atol=atol, metrics=names)
    count = int(_git(["rev-list", "--count", f"{good}..{bad}"], repo, timeout).stdout)
    progress, start = _Progress(args.quiet, 2 + math.ceil(math.log2(count))), time.monotonic()
    if not args.quiet:
        print(f"rollout-mock bisect: {count} commits after {good[:12]}; testing both ends, then ~{progress.total - 2}",
              file=sys.stderr)
    # SIGTERM (a cancelled CI job) cleans up like Ctrl-C; a handler can be set in the main thread only
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    try:
        with _worktree(repo, good, timeout) as (tree, work):
            log_dir = Path(args.log_dir).resolve() if args.log_dir else work / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            plan = _Plan(list(argv), str(tree), str(work), dump, args.metrics_file, args.timeout, timeout,
                         args.max_tests, str(log_dir), names, rtol, atol)
            code, message, culprit, candidates = _bisect(plan, reference, args.reference, good, bad, progress)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return _report(args, good, bad, progress.tested, time.monotonic() - start, code, message, culprit, candidates)


def _bisect(plan: _Plan, reference: MetricsTable | None, kind: str, good: str, bad: str,
            progress: _Progress) -> tuple[int, str, _Tested | None, list[tuple[str, str]]]:
    """Test both ends, then bisect: (exit code, message, the first bad commit, the candidates)."""
    tested, table = _test(plan, reference)
    progress.add(tested)
    if tested.verdict != "good":
        why = "does not run" if tested.verdict == "skip" else f"does not reproduce the reference {kind}"
        return EXIT_INCONCLUSIVE, f"the good revision {good[:12]} {why} ({tested.reason})", None, []
    reference = table if reference is None else reference  # --reference good: the good run's metrics
    assert reference is not None
    verify_with_options(reference, reference, rtol=plan.rtol, atol=plan.atol, metrics=plan.names)  # names, tols
    _git(["checkout", "-q", "--detach", bad], plan.worktree, plan.git_timeout)
    tested, _ = _test(plan, reference)
    progress.add(tested)
    if tested.verdict == "skip":
        return EXIT_INCONCLUSIVE, f"the bad revision {bad[:12]} does not run ({tested.reason})", None, []
    if tested.verdict == "good":
        return EXIT_GOOD, f"no bad commit: the bad revision {bad[:12]} reproduces the reference", None, []
    culprit_rev, possible, gave_up = _bisect_loop(plan, reference, good, bad, progress)
    if gave_up:
        return EXIT_INCONCLUSIVE, f"gave up: {gave_up}", None, []
    if culprit_rev is not None:
        culprit = next(t for t in reversed(progress.tested) if t.rev == culprit_rev)
        return EXIT_BAD, f"first bad commit {culprit.rev[:12]} {culprit.subject}", culprit, []
    listed = _git(["log", "--no-walk=unsorted", "--format=%H %s", *possible], plan.worktree, plan.git_timeout).stdout
    candidates = [(rev, subject) for rev, _, subject in (line.partition(" ") for line in listed.splitlines())]
    return EXIT_INCONCLUSIVE, f"the first bad commit is one of {len(candidates)}: skipped commits hide which", \
        None, candidates


def _report(args: argparse.Namespace, good: str, bad: str, tested: list[_Tested], seconds: float, code: int,
            message: str, culprit: _Tested | None, candidates: list[tuple[str, str]]) -> int:
    verdict = {EXIT_GOOD: "good", EXIT_BAD: "bad"}.get(code, "inconclusive")
    if args.json:
        print(json.dumps({
            "verdict": verdict, "exit_code": code, "message": message, "good": good, "bad": bad,
            "reference": args.reference,
            "first_bad_commit": None if culprit is None else {"rev": culprit.rev, "subject": culprit.subject},
            "first_divergence": None if culprit is None else {
                "step": culprit.step, "metric": culprit.metric, "reason": culprit.reason,
                "reference_value": json_float(culprit.reference_value), "bad_value": json_float(culprit.value)},
            "candidates": [{"rev": rev, "subject": subject} for rev, subject in candidates],
            "tested": [{**asdict(t), "reference_value": json_float(t.reference_value), "value": json_float(t.value),
                        "log": t.log if args.log_dir else None} for t in tested], "seconds": round(seconds, 2),
        }, indent=2, allow_nan=False))
        return code
    print(f"rollout-mock bisect: {verdict}: {message}")
    if culprit is not None:  # "step 3, loss: reference 0.5, this commit 0.5000001" (repr: every bit shows)
        print(f"  first divergence: {culprit.reason}")
    for rev, subject in candidates:
        print(f"  candidate: {rev[:12]} {subject}")
    counts = ", ".join(f"{sum(t.verdict == v for t in tested)} {word}"
                       for v, word in zip(_VERDICTS, ("good", "bad", "skipped")))
    print(f"  {len(tested)} commits tested in {seconds:.1f}s ({counts})" +
          (f"; CMD output in {args.log_dir}" if args.log_dir else ""))
    return code
