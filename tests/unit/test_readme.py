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


def test_the_second_tier_runs_on_two_workers_that_the_test_extra_installs() -> None:
    """``-n 2 --dist loadgroup`` needs pytest-xdist: the install step of the same command brings it
    (the ``test`` extra), so the command works as written on a fresh machine."""
    tests = _bash_blocks()[1]
    assert '-m pytest -m "not fast" -n 2 --dist loadgroup' in tests and '".[test,all]"' in tests
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*?)^\]", pyproject, flags=re.S | re.M)
    assert test_extra is not None and '"pytest-xdist"' in test_extra.group(1)


def test_ray_and_s3_tests_share_one_serial_worker_and_other_files_stay_whole() -> None:
    from conftest import SERIAL, xdist_group

    class Item:  # what xdist_group reads of a pytest.Item
        def __init__(self, path: str, *markers: str) -> None:
            self.fspath, self.markers = ROOT / "tests" / path, markers

        def get_closest_marker(self, name: str) -> object:
            return name if name in self.markers else None

    assert xdist_group(Item("integration/test_replayed_batches.py", "ray")) == SERIAL
    assert xdist_group(Item("integration/test_s3_store.py")) == SERIAL
    assert xdist_group(Item("integration/test_replayed_batches.py")) == "integration/test_replayed_batches.py"
    assert xdist_group(Item("unit/test_diff.py")) != xdist_group(Item("integration/test_diff.py"))
