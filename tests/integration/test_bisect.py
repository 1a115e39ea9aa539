"""``rollout-mock bisect`` end to end, with the real ``git`` and real processes.

The scenario of the issue: a throw-away git repository of 16 commits holding a tiny training loop
that replays a real dump (recorded once, with the first commit's script) in mock mode; one commit
changes the loss kernel's reduction order (float32 summed front to back instead of torch's blocked
sum: the loss differs in its last bits), and bisect must name it. Those tests run torch at every
commit (marked slow); the others use a CMD that only writes a metrics file, to check the driver
fast: skips, timeouts, limits, placeholders, errors and clean-up. The user's checkout is compared
before and after every run (HEAD, branch, index, status, refs, worktrees, files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import HANG_S, wait_until

from rollout_mock import cli

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (apt-get install git)")

TRAIN = '''\
"""A tiny training loop: batches from a MockScheduler (recorded once, then replayed), one loss kernel, SGD."""
import os
import pathlib
import sys

import torch

from kernels import mean_loss
from rollout_mock import MetricsWriter, MockScheduler

torch.set_num_threads(1)
if pathlib.Path("SLOW").exists():  # a marker some tests commit: report the pid, then wait to be killed
    pathlib.Path(os.environ["SLOW_MARKER"]).write_text(str(os.getpid()))
    import time; time.sleep(24 * 3600)


class Rollout:  # what an inference engine and a reward model would do
    def get_batch(self, global_step):
        g = torch.Generator().manual_seed(global_step)
        return {"obs": torch.randn(256, 8, generator=g), "reward": torch.randn(256, generator=g)}


mode = os.environ["ROLLOUT_MOCK_MODE"]
config = {"enable": True, "mode": mode, "dump_dir": os.environ["ROLLOUT_MOCK_DUMP_DIR"]}
weights = torch.zeros(8, requires_grad=True)
metrics = sys.argv[1] if len(sys.argv) > 1 else os.environ["ROLLOUT_MOCK_METRICS"]
with MockScheduler(Rollout() if mode == "dump" else None, config) as rollout, \\
        MetricsWriter(metrics, expected=rollout) as log:  # the dump keeps the dump run's metrics
    for step in range(4):
        batch = rollout.get_batch(global_step=step)
        loss = mean_loss((batch["obs"] @ weights - batch["reward"]) ** 2)
        loss.backward()
        with torch.no_grad():
            weights -= 0.1 * weights.grad
            weights.grad = None
        log.log(step, {"loss": loss.item(), "weight_norm": weights.norm().item()})
'''

KERNEL_GOOD = '''\
def mean_loss(values):
    """Mean of a float32 vector (torch's blocked sum)."""
    return values.sum() / values.numel()
'''

KERNEL_BAD = '''\
import functools

import torch


def mean_loss(values):
    """Mean of a float32 vector, summed front to back one value at a time."""
    return functools.reduce(torch.add, values) / values.numel()
'''

BROKEN = 'raise ImportError("kernels: half-finished refactor")\n'


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args], cwd=repo,
                          env=env, check=True, capture_output=True, text=True, timeout=HANG_S).stdout


def make_repo(root: Path, *, bad: int | None, broken: tuple[int, ...] = (), slow: tuple[int, ...] = (),
              commits: int = 16) -> tuple[Path, list[str]]:
    """A repository of ``commits`` commits (numbered from 1); from commit ``bad`` on the loss kernel
    sums in another order; the ``broken`` ones fail at import; the ``slow`` ones hold a SLOW file."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text(TRAIN)
    shas = []
    for i in range(1, commits + 1):
        kernel = KERNEL_BAD if bad is not None and i >= bad else KERNEL_GOOD
        (repo / "kernels.py").write_text((BROKEN if i in broken else "") + kernel)
        (repo / "NOTES.md").write_text("".join(f"- change {j}\n" for j in range(1, i + 1)))
        (repo / "SLOW").write_text("") if i in slow else (repo / "SLOW").unlink(missing_ok=True)
        git(repo, "add", "-A")
        subject = "kernels: sum the loss front to back" if i == bad else f"change {i}"
        git(repo, "commit", "-q", "-m", subject)
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def make_dump(repo: Path, rev: str, dump: Path) -> Path:
    """Record the dump with the script as it is at ``rev``, in dump mode; the dump run's metrics file."""
    tree, metrics = repo.parent / "dump-tree", repo.parent / "dump-metrics.jsonl"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), rev)
    env = {**os.environ, "ROLLOUT_MOCK_MODE": "dump", "ROLLOUT_MOCK_DUMP_DIR": str(dump),
           "ROLLOUT_MOCK_METRICS": str(metrics), "PYTHONPATH": _pythonpath()}
    subprocess.run([sys.executable, "train.py"], cwd=tree, env=env, check=True, capture_output=True, timeout=HANG_S)
    git(repo, "worktree", "remove", "--force", str(tree))
    return metrics


def _pythonpath() -> str:
    root = str(Path(cli.__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


def snapshot(repo: Path) -> dict[str, str]:
    """Everything of the user's checkout bisect must leave as it was."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "branch", "--show-current"),
        "status": git(repo, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "--ignored"),
        "refs": git(repo, "for-each-ref"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "stash": git(repo, "stash", "list"),
        "files": "\n".join(sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts)),
        "index": (repo / ".git" / "index").read_bytes().hex(),
        # no BISECT_* file, no worktrees/ left; `git bisect start` (in the worktree) may create an empty
        # .git/packed-refs, a storage detail of git's: the refs themselves are compared above
        "git dir": "\n".join(sorted(p.name for p in (repo / ".git").iterdir() if p.name != "packed-refs")),
    }


def bisect(repo: Path, dump: Path, good: str, bad: str, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch, *options: str, cmd: tuple[str, ...] = ("train.py",)) -> tuple[int, dict, str]:
    """Run the command in this process (``--json``): exit code, the JSON result, stderr."""
    monkeypatch.setenv("PYTHONPATH", _pythonpath())  # CMD imports this checkout's rollout_mock
    before = snapshot(repo)
    code = cli.main(["bisect", "--repo", str(repo), "--good", good, "--bad", bad, "--dump", str(dump), "--json",
                     *options, "--", sys.executable, *cmd])
    out, err = capsys.readouterr()
    assert snapshot(repo) == before, err
    return code, json.loads(out) if out else {}, err


# ------------------------------------------------------------------ the scenario (torch at every commit)

@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], Path]:
    """The 16-commit repository (commit 11 changes the reduction order) and the dump, recorded once."""
    root = tmp_path_factory.mktemp("bisect")
    repo, shas = make_repo(root, bad=11)
    make_dump(repo, shas[0], root / "dump")
    return repo, shas, root / "dump"


@pytest.mark.slow
def test_names_the_commit_that_changed_the_reduction_order(
        regression: tuple[Path, list[str], Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas, dump = regression
    git(repo, "checkout", "-q", "-b", "feature", shas[5])  # the user is elsewhere, mid-work
    (repo / "NOTES.md").write_text("uncommitted edit\n")
    (repo / "scratch.txt").write_text("untracked\n")

    code, result, err = bisect(repo, dump, shas[0], shas[-1], capsys, monkeypatch)  # checks the checkout too

    assert code == 1, err
    assert result["verdict"] == "bad"
    assert result["first_bad_commit"] == {"rev": shas[10], "subject": "kernels: sum the loss front to back"}
    divergence = result["first_divergence"]
    assert divergence["step"] == 0 and divergence["metric"] == "loss"
    assert divergence["reference_value"] != divergence["bad_value"]
    assert abs(divergence["reference_value"] - divergence["bad_value"]) < 1e-5  # in the last bits only
    verdicts = {t["rev"]: t["verdict"] for t in result["tested"]}
    assert verdicts[shas[0]] == "good" and verdicts[shas[-1]] == "bad" and verdicts[shas[10]] == "bad"
    assert verdicts[shas[9]] == "good"  # its parent: git names a commit only once its parent is known good
    assert len(verdicts) == len(result["tested"]) <= 2 + 5  # both ends, then a binary search
    progress = [line for line in err.splitlines() if line.startswith("[")]
    assert len(progress) == len(result["tested"])  # one line per tested commit
    assert progress[-1].startswith(f"[{len(progress)}/~")


@pytest.mark.slow
def test_prints_the_first_bad_commit_and_both_values(
        regression: tuple[Path, list[str], Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas, dump = regression
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    code = cli.main(["bisect", "--repo", str(repo), "--good", shas[9], "--bad", shas[10], "--dump", str(dump),
                     "--", sys.executable, "train.py"])  # --bad's parent is --good: git names it at once
    out, err = capsys.readouterr()
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0] == f"rollout-mock bisect: bad: first bad commit {shas[10][:12]} kernels: sum the loss front to back"
    assert re.fullmatch(r"  first divergence: step 0, loss: reference 0\.\d+, this commit 0\.\d+", lines[1])
    assert lines[2].startswith("  2 commits tested in ") and lines[2].endswith("s (1 good, 1 bad, 0 skipped)")
    assert f"[1/~2] {shas[9][:12]} change 10: good (the reference) " in err


@pytest.mark.slow
def test_the_dump_runs_metrics_as_reference_and_a_metrics_file_in_the_repository(
        regression: tuple[Path, list[str], Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas, dump = regression
    code, result, err = bisect(repo, dump, shas[9], shas[11], capsys, monkeypatch, "--reference", "dump",
                               "--metrics-file", "runs/metrics.jsonl", cmd=("train.py", "runs/metrics.jsonl"))
    assert code == 1, err
    assert result["first_bad_commit"]["rev"] == shas[10]
    assert result["tested"][0]["reason"] == "matches the reference"  # --good reproduces the dump run


@pytest.mark.slow
def test_a_commit_that_fails_to_run_is_skipped_not_blamed(
        regression: tuple[Path, list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_repo(tmp_path, bad=6, broken=(4,), commits=8)
    code, result, err = bisect(repo, regression[2], shas[0], shas[-1], capsys, monkeypatch)
    assert code == 1, err
    assert result["first_bad_commit"]["rev"] == shas[5]
    skipped = [t for t in result["tested"] if t["verdict"] == "skip"]
    # whether the broken commit is picked at all depends on git's order among equally good split
    # points (rev-list --bisect-all); when it is, it is skipped with the reason, never blamed
    assert [t["rev"] for t in skipped] in ([], [shas[3]])
    assert all(t["reason"] == "CMD exited with code 1: ImportError: kernels: half-finished refactor"
               for t in skipped)
    assert shas[3] not in [t["rev"] for t in result["tested"] if t["verdict"] == "bad"]


@pytest.mark.slow
def test_an_all_good_range_has_no_bad_commit(
        regression: tuple[Path, list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_repo(tmp_path, bad=None)
    code, result, err = bisect(repo, regression[2], shas[0], shas[-1], capsys, monkeypatch)
    assert code == 0, err
    assert result["verdict"] == "good" and result["first_bad_commit"] is None
    assert result["message"] == f"no bad commit: the bad revision {shas[-1][:12]} reproduces the reference"
    assert [t["rev"] for t in result["tested"]] == [shas[0], shas[-1]]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_removes_the_worktree_and_ends_the_command(
        sig: signal.Signals, regression: tuple[Path, list[str], Path], tmp_path: Path) -> None:
    repo, shas = make_repo(tmp_path, bad=4, slow=(2, 3), commits=4)
    before = snapshot(repo)
    marker = tmp_path / "slow.pid"
    # a short TMPDIR of its own (the bisect's Unix socket lives there: pytest-xdist's tmp_path is too long)
    scratch = Path(tempfile.mkdtemp(prefix="rmb-", dir="/tmp" if os.path.isdir("/tmp") else None))
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "SLOW_MARKER": str(marker), "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-m", "rollout_mock", "bisect", "--repo", str(repo), "--good", shas[0],
                             "--bad", shas[-1], "--dump", str(regression[2]), "--", sys.executable, "train.py"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Events, not wall-clock limits (the machine may be busy): the commit under test writes its pid,
    # then sleeps for a day; the command must end after the signal, which it can only do by killing
    # that process (HANG_S bounds the waits only so that a hang fails the test).
    try:
        wait_until(lambda: marker.exists() and marker.read_text() or proc.poll() is not None,
                   "the slow commit's training process never started")
        assert marker.exists(), proc.communicate(timeout=HANG_S)
        slow_pid = int(marker.read_text())
        proc.send_signal(sig)  # while `git bisect run` waits for the commit it asked about
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    with pytest.raises(ProcessLookupError):  # the training process of the commit under test is gone
        os.kill(slow_pid, 0)
    assert snapshot(repo) == before  # no worktree left, nothing else changed
    left = list(scratch.iterdir())
    shutil.rmtree(scratch)
    assert left == []  # nor its temporary folder


# ------------------------------------------------------------------ the driver, with a CMD that only writes metrics

FAKE = """\
import json, os, sys, time
value = open("value.txt").read().strip()
with open(os.path.join(os.environ["FAKE_RECORD"], os.environ["ROLLOUT_MOCK_BISECT_REV"] + ".json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith(("ROLLOUT_MOCK_", "GIT_"))},
               "cwd": os.getcwd()}, f)
if value == "crash":
    sys.exit("crashed on purpose")
if value == "sleep":
    time.sleep(24 * 3600)
if value != "none":
    with open(os.environ["ROLLOUT_MOCK_METRICS"], "w") as f:
        f.write("not json\\n" if value == "garbage" else "".join(
            json.dumps({"step": s, "loss": float(value) if s == 2 else 1.0}) + "\\n" for s in range(3)))
"""


def make_fake_repo(root: Path, values: list[str], files: dict[str, str] | None = None) -> tuple[Path, list[str]]:
    """One commit per value: ``value.txt`` holds it (a number: the loss at step 2; ``crash``,
    ``sleep``, ``none``: no metrics; ``garbage``: an unreadable metrics file)."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "fake.py").write_text(FAKE)
    for name, text in (files or {}).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    shas = []
    for i, value in enumerate(values, 1):
        (repo / "value.txt").write_text(value + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"value {value} ({i})")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


@pytest.fixture(scope="module")
def small_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollout_mock import MockScheduler

    class Rollout:
        def get_batch(self, global_step: int) -> dict[str, list[int]]:
            return {"tokens": [global_step]}

    dump = tmp_path_factory.mktemp("small") / "dump"
    with MockScheduler(Rollout(), {"enable": True, "mode": "dump", "dump_dir": str(dump)}) as rollout:
        rollout.get_batch(global_step=0)
    return dump


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "record"
    folder.mkdir()
    monkeypatch.setenv("FAKE_RECORD", str(folder))
    return folder


def test_cmd_gets_the_dump_metrics_and_revision_as_arguments_and_environment_never_a_shell(
        tmp_path: Path, small_dump: Path, record: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_fake_repo(tmp_path, ["1.0", "1.0", "1.0", "2.5", "2.5", "2.5"])
    code, result, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch,
                               cmd=("fake.py", "{dump}", "--out={metrics}", "{rev}", "$HOME; touch pwned", "{x}"))
    assert code == 1, err
    assert result["first_bad_commit"]["rev"] == shas[3]
    assert result["first_divergence"] == {"step": 2, "metric": "loss", "reason": "step 2, loss: reference 1.0, "
                                          "this commit 2.5", "reference_value": 1.0, "bad_value": 2.5}
    seen = json.loads((record / f"{shas[3]}.json").read_text())
    metrics = seen["env"]["ROLLOUT_MOCK_METRICS"]
    assert seen["argv"] == [str(small_dump.resolve()), f"--out={metrics}", shas[3], "$HOME; touch pwned", "{x}"]
    git_vars = {k: v for k, v in os.environ.items() if k.startswith("GIT_")}  # not git bisect run's GIT_DIR...
    assert seen["env"] == {"ROLLOUT_MOCK_MODE": "mock", "ROLLOUT_MOCK_DUMP_DIR": str(small_dump.resolve()),
                           "ROLLOUT_MOCK_METRICS": metrics, "ROLLOUT_MOCK_BISECT_REV": shas[3], **git_vars}
    assert shas[3] in [t["rev"] for t in result["tested"]][2:]  # tested by the bisection, after both ends
    assert not Path(metrics).is_relative_to(seen["cwd"])  # a fresh file outside the worktree
    assert Path(seen["cwd"]) != repo and not Path(seen["cwd"]).exists()  # the worktree, removed since
    assert not list(tmp_path.rglob("pwned")) and not Path(seen["cwd"]).parent.exists()


def test_commits_that_fail_time_out_or_write_no_metrics_are_skipped(
        tmp_path: Path, small_dump: Path, record: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = ["1.0", "crash", "none", "garbage", "sleep", "2.0"]
    repo, shas = make_fake_repo(tmp_path, values)
    # --timeout scales with what starting this CMD costs on this machine now (a busy machine must
    # not time out the commits that finish); the "sleep" commit sleeps for a day
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import json, os, sys, time"], check=True, timeout=HANG_S)
    limit = round(max(3.0, 20 * (time.monotonic() - started)))
    code, result, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch, "--timeout", str(limit),
                               "--log-dir", str(tmp_path / "logs"), cmd=("fake.py",))
    assert code == 3, err
    assert result["verdict"] == "inconclusive" and result["first_bad_commit"] is None
    assert result["message"] == "the first bad commit is one of 5: skipped commits hide which"
    assert {c["rev"] for c in result["candidates"]} == set(shas[1:])
    reasons = {t["rev"]: t["reason"] for t in result["tested"] if t["verdict"] == "skip"}
    assert reasons[shas[1]] == "CMD exited with code 1: crashed on purpose"
    assert reasons[shas[2]].startswith("no readable metrics: ") and "no such metrics file" in reasons[shas[2]]
    assert reasons[shas[3]].startswith("no readable metrics: ")
    assert reasons[shas[4]] == f"timed out after {limit}s (--timeout)"
    assert (tmp_path / "logs" / f"{shas[1][:12]}.log").read_text().strip() == "crashed on purpose"


def test_a_committed_metrics_file_does_not_count(
        tmp_path: Path, small_dump: Path, record: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    stale = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(3))
    repo, shas = make_fake_repo(tmp_path, ["1.0", "none", "2.0"], files={"out/metrics.jsonl": stale})
    code, result, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch,
                               "--metrics-file", "out/metrics.jsonl", cmd=("fake.py",))
    assert code == 3, err
    assert [t["verdict"] for t in result["tested"]] == ["good", "bad", "skip"]


def test_max_tests_bounds_the_bisection(
        tmp_path: Path, small_dump: Path, record: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_fake_repo(tmp_path, ["1.0"] * 8 + ["2.0"] * 8)
    code, result, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch, "--max-tests", "2",
                               cmd=("fake.py",))
    assert code == 3, err
    assert result["message"] == "gave up: --max-tests 2 reached"
    assert len(result["tested"]) == 2 + 2


@pytest.mark.parametrize(("values", "reference", "message"), [
    (["crash", "2.0"], None, "the good revision {good} does not run (CMD exited with code 1: crashed on purpose)"),
    (["1.0", "crash"], None, "the bad revision {bad} does not run (CMD exited with code 1: crashed on purpose)"),
    (["1.0", "2.0"], [1.0, 1.0, 7.0], "the good revision {good} does not reproduce the reference {file} "
                                       "(step 2, loss: reference 7.0, this commit 1.0)"),
])
def test_ends_that_do_not_run_or_match_are_inconclusive(
        values: list[str], reference: list[float] | None, message: str, tmp_path: Path, small_dump: Path,
        record: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_fake_repo(tmp_path, values)
    options: list[str] = []
    if reference is not None:
        (tmp_path / "ref.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                                    for s, v in enumerate(reference)))
        options = ["--reference", str(tmp_path / "ref.jsonl")]
    code, result, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch, *options, cmd=("fake.py",))
    assert code == 3, err
    assert result["message"] == message.format(good=shas[0][:12], bad=shas[-1][:12], file=tmp_path / "ref.jsonl")


@pytest.mark.parametrize(("args", "message"), [
    (["--good", "HEAD~1", "--bad", "HEAD"], "no command to run: give it after --"),
    (["--good", "nope", "--bad", "HEAD", "--", "x"], "unknown revision 'nope' in "),
    (["--good=--output=x", "--bad", "HEAD", "--", "x"], "unknown revision '--output=x' in "),
    (["--good", "HEAD", "--bad", "main", "--", "x"], "--good HEAD and --bad main are the same commit "),
    (["--good", "HEAD", "--bad", "HEAD~1", "--", "x"], "--good HEAD is not an ancestor of --bad HEAD~1"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--metrics-file", "/tmp/m.jsonl", "--", "x"],
     "--metrics-file /tmp/m.jsonl: must be a path inside the repository"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--metrics-file", "../m.jsonl", "--", "x"],
     "--metrics-file ../m.jsonl: must be a path inside the repository"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--timeout", "0", "--", "x"], "--timeout 0.0: must be a number > 0"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--rtol", "x", "--", "x"], "--rtol 'x': expected FLOAT or METRIC=FLOAT"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--reference", "dump", "--", "x"], "without the dump run's metrics"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--repo", "/nonexistent", "--", "x"], "--repo /nonexistent: no such"),
])
def test_bad_input_exits_2_before_running_anything(
        args: list[str], message: str, tmp_path: Path, small_dump: Path, record: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = make_fake_repo(tmp_path, ["1.0", "2.0"])
    before = snapshot(repo)
    code = cli.main(["bisect", "--repo", str(repo), "--dump", str(small_dump), *args])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("rollout-mock bisect: error: ") and message in err, err
    assert not list(record.iterdir())  # CMD never ran
    assert snapshot(repo) == before


def test_not_a_repository_or_no_dump(tmp_path: Path, small_dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bisect", "--repo", str(tmp_path), "--good", "a", "--bad", "b", "--dump", str(small_dump),
                     "--", "x"]) == 2
    assert "`git rev-parse --show-toplevel` failed in " in capsys.readouterr().err
    repo, _ = make_fake_repo(tmp_path, ["1.0", "2.0"])
    assert cli.main(["bisect", "--repo", str(repo), "--good", "HEAD~1", "--bad", "HEAD", "--dump",
                     str(tmp_path / "nodump"), "--", "x"]) == 2
    assert "dump directory not found" in capsys.readouterr().err


def test_an_error_after_the_worktree_exists_still_removes_it(
        tmp_path: Path, small_dump: Path, record: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, shas = make_fake_repo(tmp_path, ["1.0", "2.0"])
    code, _, err = bisect(repo, small_dump, shas[0], shas[-1], capsys, monkeypatch, "--metrics", "kl",
                          cmd=("fake.py",))  # known only once --good has run: raised inside the worktree
    assert code == 2
    assert "metric(s) 'kl' not logged by either run" in err
    assert len(list(record.iterdir())) == 1  # --good ran


def test_help_lists_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "bisect" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["bisect", "--help"])
    out = capsys.readouterr().out
    assert "Exit codes: 0 good" in out and "ROLLOUT_MOCK_METRICS" in out and "--max-tests" in out
