"""The repository root holds only the files a project needs (no strays from a shell command)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Tracked files allowed at the root, and tracked folders. Anything else is a stray: e.g. a file
#: named like a commit-message line, left by a mis-quoted shell command (a ':' in its name also
#: breaks Windows checkouts).
ROOT_FILES = {".gitignore", "CHANGELOG.md", "LICENSE", "README.md", "mkdocs.yml", "pyproject.toml"}
ROOT_DIRS = {".ci", "benchmarks", "configs", "docs", "rollout_mock", "tests"}
#: Characters that Windows refuses in a file name.
WINDOWS_FORBIDDEN = set('<>:"|?*\\')


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the root's content is checked against git's index)")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in done.stdout.decode("utf-8", "surrogateescape").split("\0") if name]


def test_root_holds_only_expected_files() -> None:
    tracked = _tracked()
    files = {name for name in tracked if "/" not in name}
    dirs = {name.split("/", 1)[0] for name in tracked if "/" in name}
    assert files - ROOT_FILES == set(), f"unexpected tracked files at the repository root: {sorted(files - ROOT_FILES)}"
    assert dirs - ROOT_DIRS == set(), f"unexpected tracked folders at the repository root: {sorted(dirs - ROOT_DIRS)}"


def test_no_tracked_path_is_invalid_on_windows() -> None:
    bad = [name for name in _tracked() if WINDOWS_FORBIDDEN & set(name.replace("/", ""))]
    assert bad == [], f"tracked paths with characters Windows refuses: {bad[:5]}"
