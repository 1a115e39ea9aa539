"""``bisect`` against a hostile repository (issue 37, round 5 items 3 and 4).

Before: a commit holding ``out`` as a symlink to a folder outside the repository made
``--metrics-file out/metrics.jsonl`` delete ``metrics.jsonl`` there (``rmtree`` for a directory);
the repository's ``reference-transaction`` hook ran about 13 times per bisection (``git bisect``'s
helper on git 2.39 ignores ``core.hooksPath`` for its ref updates) though the docs say hooks do not
run. Now every git command gets ``core.hooksPath`` = an empty folder through ``GIT_CONFIG_*``, no
``git bisect`` runs (the bisection checks commits out itself), and a metrics folder leading out of
the worktree skips the commit, touching nothing there. Real hooks, real git.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

from rollout_mock import MockScheduler
from rollout_mock.cli import main

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

CMD = """\
import json, os
value = float(open("value.txt").read())
with open(os.environ["ROLLOUT_MOCK_METRICS"], "w") as f:
    f.write("".join(json.dumps({"step": s, "loss": value if s == 1 else 1.0}) + "\\n" for s in range(2)))
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args], cwd=repo, env=env,
                          check=True, capture_output=True, text=True, timeout=HANG_S).stdout


def make_repo(root: Path, values: list[str], outside: Path | None = None) -> tuple[Path, list[str]]:
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "cmd.py").write_text(CMD)
    if outside is not None:
        os.symlink(outside, repo / "out")  # committed: every commit's worktree holds it
    shas = []
    for value in values:
        (repo / "value.txt").write_text(value + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"value {value}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    class Rollout:
        def get_batch(self, global_step: int) -> dict[str, list[int]]:
            return {"tokens": [global_step]}

    path = tmp_path_factory.mktemp("small") / "dump"
    with MockScheduler(Rollout(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as rollout:
        rollout.get_batch(global_step=0)
    return path


def bisect(repo: Path, dump: Path, good: str, bad: str, capsys: pytest.CaptureFixture[str],
           *options: str) -> tuple[int, dict, str]:
    code = main(["bisect", "--repo", str(repo), "--good", good, "--bad", bad, "--dump", str(dump), "--json",
                 *options, "--", sys.executable, "cmd.py"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(out) if out else {}, err


@pytest.mark.parametrize("planted", ["file", "directory"])
def test_a_symlinked_metrics_folder_is_never_written_through(tmp_path: Path, dump: Path, planted: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "metrics.jsonl"
    if planted == "file":
        target.write_text("precious\n")
    else:
        target.mkdir()
        (target / "precious.txt").write_text("precious\n")
    repo, shas = make_repo(tmp_path, ["1.0", "1.0", "2.0"], outside=outside)
    code, result, err = bisect(repo, dump, shas[0], shas[-1], capsys, "--metrics-file", "out/metrics.jsonl")
    assert code == 3, err  # --good cannot be tested
    assert "leads out of the worktree" in result["message"]
    assert sorted(p.name for p in outside.rglob("*")) == (["metrics.jsonl"] if planted == "file"
                                                          else ["metrics.jsonl", "precious.txt"])
    assert (target.read_text() if planted == "file" else (target / "precious.txt").read_text()) == "precious\n"


HOOK = """#!/bin/sh
echo "$0" >> {marker}
"""


def test_repository_hooks_never_run(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, shas = make_repo(tmp_path, ["1.0"] * 4 + ["2.0"] * 4)
    marker = tmp_path / "hooks-ran.txt"
    for name in ("reference-transaction", "post-checkout", "post-commit", "pre-auto-gc", "post-rewrite"):
        hook = repo / ".git" / "hooks" / name
        hook.write_text(HOOK.format(marker=marker))
        hook.chmod(0o755)
    git(repo, "update-ref", "refs/heads/probe", "HEAD")  # the hooks are live: git runs them here
    assert marker.exists()
    marker.unlink()
    code, result, err = bisect(repo, dump, shas[0], shas[-1], capsys)
    assert code == 1, err
    assert result["first_bad_commit"]["rev"] == shas[4]
    assert not marker.exists(), marker.read_text()


def test_hooks_from_core_hookspath_never_run(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A repository configured with its own hooks folder (core.hooksPath in .git/config)."""
    repo, shas = make_repo(tmp_path, ["1.0"] * 3 + ["2.0"] * 3)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "hooks-ran.txt"
    for name in ("reference-transaction", "post-checkout"):
        (hooks / name).write_text(HOOK.format(marker=marker))
        (hooks / name).chmod(0o755)
    git(repo, "config", "core.hooksPath", str(hooks))
    code, result, err = bisect(repo, dump, shas[0], shas[-1], capsys)
    assert code == 1, err
    assert not marker.exists(), marker.read_text()


def test_a_file_where_the_metrics_folder_should_be_skips_the_commit(tmp_path: Path, dump: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A commit holding ``out`` as a file: --metrics-file out/metrics.jsonl cannot be written; the
    commit is skipped (one reason), never an OSError out of the command."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "cmd.py").write_text(CMD)
    shas = []
    for value, out_is_file in (("1.0", False), ("1.0", True), ("2.0", False)):
        (repo / "value.txt").write_text(value + "\n")
        if out_is_file:
            (repo / "out").write_text("a file\n")
        elif (repo / "out").exists():
            (repo / "out").unlink()
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"value {value}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    code, result, err = bisect(repo, dump, shas[0], shas[-1], capsys, "--metrics-file", "out/metrics.jsonl")
    assert code == 3, err  # the only commit between is skipped: it hides the first bad one
    reasons = {t["rev"]: t["reason"] for t in result["tested"]}
    assert "--metrics-file out/metrics.jsonl" in reasons[shas[1]]
