"""The package type-checks and lints clean under the project's own configuration (pyproject.toml)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[lint]')")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_ruff_is_clean() -> None:
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists():
        pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[lint]')")
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# no test's verdict hangs on the wall clock (docs/contributing.md): a bound on a wait is HANG_S
# ---------------------------------------------------------------------------------------------

#: Calls whose first positional argument is a timeout in seconds.
_WAITS = ("wait", "join", "result", "exception", "acquire")


def _number(node: ast.expr, constants: dict[str, float]) -> float | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _number(node.left, constants), _number(node.right, constants)
        if left is not None and right is not None:
            return left + right if isinstance(node.op, ast.Add) else left * right
    return None


def short_bounds(source: str) -> list[tuple[int, str]]:
    """Waits in ``source`` bounded by a number of seconds below ``HANG_S``'s default (a literal,
    or a module constant set to one): on a busy machine such a bound becomes the verdict. A wait
    whose result is negated (``assert not done.wait(0.2)``: it did not happen meanwhile) cannot
    fail for slowness and is allowed."""
    from conftest import HANG_S

    tree = ast.parse(source)
    constants = {target.id: float(node.value.value) for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and type(node.value.value) in (int, float)
                 for target in node.targets if isinstance(target, ast.Name)}
    negated = {id(node.operand) for node in ast.walk(tree)
               if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)}
    found = []
    for node in ast.walk(tree):
        bounds: list[ast.expr] = []
        if isinstance(node, ast.Call):
            bounds += [k.value for k in node.keywords if k.arg == "timeout"]
            if isinstance(node.func, ast.Attribute) and node.func.attr in _WAITS and node.args:
                bounds.append(node.args[0])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Call) \
                and ast.unparse(node.left.func) in ("time.monotonic", "time.time", "time.perf_counter"):
            bounds.append(node.right)  # a deadline
        for bound in bounds:
            seconds = _number(bound, constants)
            if seconds is not None and seconds < HANG_S and id(node) not in negated:
                found.append((node.lineno, ast.unparse(node)[:100]))
    return found


def test_short_bounds_finds_what_it_must() -> None:
    """The check itself: each short bound is found, the allowed forms are not."""
    source = textwrap.dedent("""
        import subprocess, time
        LIMIT = 120.0
        subprocess.run(["x"], timeout=240)
        done.wait(10)
        thread.join(timeout=LIMIT)
        ray.get(ref, timeout=LIMIT + 10)
        deadline = time.monotonic() + 30
        assert not flushed.wait(0.2)
        subprocess.run(["x"], timeout=HANG_S)
        event.wait(HANG_S)
        prefetcher.get(3)
    """)
    assert [line for line, _ in short_bounds(source)] == [4, 5, 6, 7, 8]


def test_no_wait_in_the_tests_is_bounded_below_hang_s() -> None:
    """A bound on a wait is ``HANG_S`` (tests/conftest.py): it ends a hang, never decides a test
    (a 130 s bound on a Ray actor's first call failed with both CPUs busy)."""
    found = {str(path.relative_to(ROOT)): short for path in sorted((ROOT / "tests").rglob("*.py"))
             if (short := short_bounds(path.read_text(encoding="utf-8")))}
    assert not found, f"bound these waits by HANG_S (from conftest import HANG_S): {found}"
