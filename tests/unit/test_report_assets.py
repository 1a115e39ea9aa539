"""The report's vendored uPlot and page assets: the version and checksums the README states, shipped
as package data, safe to inline (nothing that ends a <script>, evaluates text or fetches)."""

from __future__ import annotations

import fnmatch
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
    pyproject = (ASSETS.parents[2] / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]", 1)[1]
    patterns = re.findall(r'"([^"]+)"', re.search(r"^rollout_mock = \[(.*)\]$", section, re.M).group(1))
    for path in ASSETS.iterdir():
        rel = str(path.relative_to(ASSETS.parents[1]))
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel


@pytest.mark.parametrize("name", ["uPlot.iife.min.js", "report.js", "uPlot.min.css", "report.css"])
def test_assets_are_safe_to_inline(name: str) -> None:
    text = asset(name)
    assert not re.search(r"</script|</style|<!--", text, re.I)
    assert not re.search(r"\beval\(|new Function\(|fetch\(|XMLHttpRequest|import\(|@import|url\(", text)
