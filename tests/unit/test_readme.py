"""The README's first two commands are what a new user and CI run: keep them honest."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_starts_with_demo_and_test_commands() -> None:
    demo, tests = _bash_blocks()[:2]
    assert "pip install -q torch==2.13.0" in demo and "rollout-mock demo" in demo
    assert "pip install -q torch==2.13.0" in tests and "-m pytest" in tests
    # the pinned CPU torch comes before anything that could pull a CUDA build
    assert tests.index("torch==2.13.0") < tests.index("-e ")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    tests = _bash_blocks()[1]
    assert tests in ci.splitlines()


def test_the_test_command_runs_the_fast_tier_first_then_the_rest() -> None:
    """The two tiers (tests/conftest.py marks the fast one) cover every test between them."""
    tests = _bash_blocks()[1]
    assert tests.index("-m pytest -m fast &&") < tests.index('-m pytest -m "not fast"')
