"""The report's vendored uPlot and page assets: the version and checksums the README states, shipped
as package data, safe to inline (nothing that ends a <script>, evaluates text or fetches)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from rollout_mock.debug.report import asset

ASSETS = Path(__file__).resolve().parents[2] / "rollout_mock" / "debug" / "assets"
README = (ASSETS / "README.md").read_text()


def test_uplot_is_the_version_and_bytes_the_readme_states() -> None:
    version = re.search(r"uPlot\]\(https://github.com/leeoniya/uPlot\) \*\*([\d.]+)\*\*", README).group(1)
    assert f"(v{version})" in (ASSETS / "uPlot.iife.min.js").read_text()[:100]
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        digest = hashlib.sha256((ASSETS / name).read_bytes()).hexdigest()
        assert f"`package/dist/{name}`\n(sha256 `{digest}`)" in README or f"`package/dist/{name}` (sha256 `{digest}`)" \
            in README, name
    assert "MIT License" in (ASSETS / "uPlot.LICENSE").read_text()


def test_every_asset_is_package_data() -> None:
    """The wheel takes the whole package folder (hatchling: ``packages = ["rollout_mock"]``) less
    what git ignores: every asset must be inside it and not ignored."""
    import shutil
    import subprocess

    import tomllib

    root = ASSETS.parents[2]
    wheel = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["rollout_mock"] and not wheel.get("exclude")
    assets = [str(path.relative_to(root)) for path in ASSETS.iterdir()]
    assert all(rel.startswith("rollout_mock/") for rel in assets)
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout: .gitignore cannot be checked")
    ignored = subprocess.run(["git", "check-ignore", *assets], cwd=root, capture_output=True, text=True)
    assert ignored.stdout.split() == [], f"assets the wheel would leave out (.gitignore): {ignored.stdout.split()}"


@pytest.mark.parametrize("name", ["uPlot.iife.min.js", "report.js", "uPlot.min.css", "report.css"])
def test_assets_are_safe_to_inline(name: str) -> None:
    text = asset(name)
    assert not re.search(r"</script|</style|<!--", text, re.I)
    assert not re.search(r"\beval\(|new Function\(|fetch\(|XMLHttpRequest|import\(|@import|url\(", text)
