"""The documentation site builds with ``mkdocs build --strict`` (broken links and anchors fail),
and its generated configuration reference lists every option of RolloutMockConfig."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return out


def _generated(html: str, name: str) -> str:
    match = re.search(rf"<!-- generated:{name} start -->(.*?)<!-- generated:{name} end -->", html, flags=re.S)
    assert match, f"the generated {name} section is missing"
    return match.group(1)


def test_config_reference_lists_every_option(site: Path) -> None:
    from rollout_mock import RolloutMockConfig

    section = _generated((site / "configuration" / "index.html").read_text(encoding="utf-8"), "config-reference")
    missing = [name for name in RolloutMockConfig.model_fields if f"<code>{name}</code>" not in section]
    assert not missing, f"options missing from the generated configuration reference: {missing}"


def test_cli_reference_lists_every_command(site: Path) -> None:
    import argparse

    from rollout_mock.cli import build_parser

    section = _generated((site / "cli" / "index.html").read_text(encoding="utf-8"), "cli-reference")
    commands = [
        name
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]
    assert commands
    missing = [name for name in commands if f"<code>rollout-mock {name}</code>" not in section]
    assert not missing, f"commands missing from the generated CLI reference: {missing}"


def test_external_files_are_included(site: Path) -> None:
    """configs/github-actions-precision.yml is included verbatim (it used to be a broken link)."""
    html = (site / "precision-ci" / "index.html").read_text(encoding="utf-8")
    assert "rollout-mock verify" in html and "actions/cache" in html
