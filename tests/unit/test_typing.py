"""What a user's type checker sees (issue 30, items 1 and 2): the typed entry point
``wrap_scheduler`` is exported, it returns the wrapped type (a misspelt method is a mypy error),
a misspelt import from the package is an error too, and the package is typed (PEP 561)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
    from rollout_mock import MockScheduler, load_config, wrap_scheduler

    class Rollout:
        def get_batch(self, global_step: int) -> dict[str, float]:
            return {"reward": float(global_step)}

    cfg = load_config({"enable": True, "mode": "dump", "dump_dir": "dumps"})
    rollout = wrap_scheduler(Rollout(), cfg)
    batch: dict[str, float] = rollout.get_batch(global_step=0)
    replayed = wrap_scheduler(None, cfg, spec=Rollout)          # mock mode: typed from spec
    built = wrap_scheduler(None, cfg, factory=Rollout)          # ... or from the factory
    more: dict[str, float] = replayed.get_batch(1) | built.get_batch(2)
    with MockScheduler(Rollout(), cfg) as wrapped:
        wrapped.flush()
    """

BAD = """
    from rollout_mock import load_config, wrap_scheduler

    class Rollout:
        def get_batch(self, global_step: int) -> dict[str, float]:
            return {"reward": float(global_step)}

    rollout = wrap_scheduler(Rollout(), load_config({"enable": True, "mode": "dump", "dump_dir": "d"}))
    rollout.get_btach(global_step=0)
    rollout.get_batch(global_step="0")
    """

BAD_IMPORT = """
    from rollout_mock import wrap_schedular
    """


def _editable_install_of_this_checkout() -> bool:
    """rollout_mock is installed here with ``pip install -e <this checkout>`` (the README's way)."""
    site = Path(sysconfig.get_paths()["purelib"])
    for record in site.glob("rollout_mock-*.dist-info/direct_url.json"):
        url = json.loads(record.read_text())
        if url.get("dir_info", {}).get("editable") and url.get("url") == ROOT.as_uri():
            return True
    return False


def _mypy(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[lint]')")
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = dict(os.environ)
    if not _editable_install_of_this_checkout():  # else mypy must find the package as a user's would
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--show-error-codes", "--cache-dir",
         str(tmp_path / ".mypy_cache"), "--python-version", "3.10", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
    )


@pytest.mark.slow
def test_wrap_scheduler_is_typed_as_what_it_wraps(tmp_path: Path) -> None:
    result = _mypy(tmp_path, {"good.py": GOOD, "bad.py": BAD, "bad_import.py": BAD_IMPORT})
    lines = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert result.returncode == 1, result.stdout + result.stderr
    assert not [line for line in lines if line.startswith("good.py")], result.stdout
    assert any(re.search(r'bad\.py:9: error: "Rollout" has no attribute "get_btach"', line) for line in lines), lines
    assert any(line.startswith("bad.py:10: error:") and "arg-type" in line for line in lines), lines
    assert any(line.startswith("bad_import.py:2: error:") and "wrap_schedular" in line for line in lines), lines


def test_wrap_scheduler_is_exported_and_is_a_mock_scheduler(tmp_path: Path) -> None:
    import rollout_mock
    from rollout_mock import MockScheduler, wrap_scheduler

    class Rollout:
        def get_batch(self, global_step: int) -> dict[str, int]:
            return {"step": global_step}

    assert "wrap_scheduler" in rollout_mock.__all__ and "wrap_scheduler" in dir(rollout_mock)
    with wrap_scheduler(Rollout(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path)}) as rollout:
        assert isinstance(rollout, MockScheduler)
        assert rollout.get_batch(global_step=3) == {"step": 3}
    with pytest.raises(AttributeError, match="wrap_schedular"):
        rollout_mock.wrap_schedular  # noqa: B018


def test_the_package_is_typed() -> None:
    assert (ROOT / "rollout_mock" / "py.typed").is_file()


def test_the_editable_install_is_a_path_entry_that_type_checkers_follow() -> None:
    """``pip install -e .`` must put the checkout on ``sys.path`` with a plain ``.pth`` line, not
    an import hook (setuptools' finder): mypy and other static tools do not run import hooks and
    then say "Cannot find implementation or library stub for module named rollout_mock"."""
    if not _editable_install_of_this_checkout():
        pytest.skip(f"rollout_mock is not installed with pip install -e {ROOT} in this environment")
    site = Path(sysconfig.get_paths()["purelib"])
    entries = {line.strip() for pth in site.glob("*.pth") for line in pth.read_text().splitlines()}
    assert str(ROOT) in entries, sorted(entries)


def _requirement_names(requirements: list[str]) -> set[str]:
    import_names = {"pyyaml": "yaml"}
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower().replace("-", "_") for r in requirements}
    return {import_names.get(n, n) for n in names}


def test_the_lint_extra_alone_is_enough_for_mypy() -> None:
    """``pip install -e ".[lint]"`` then ``mypy``: every third-party module the package imports is
    a core dependency, in the lint extra, or listed in the mypy override for optional packages
    without types (a module missing from all three is "Cannot find implementation or library
    stub" in an environment with the lint extra only). Verified by hand in a fresh venv too."""
    import ast

    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    provided = _requirement_names(project["dependencies"]) | _requirement_names(project["optional-dependencies"]["lint"])
    ignored = {m.split(".")[0] for o in pyproject["tool"]["mypy"]["overrides"] if o.get("ignore_missing_imports")
               for m in o["module"]}
    missing = {}
    for path in sorted((ROOT / "rollout_mock").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                # ``_typeshed`` (buffer types, imported under TYPE_CHECKING) ships with mypy's typeshed
                if (top in sys.stdlib_module_names or top in ("_typeshed", "rollout_mock") or top in provided
                        or top in ignored or "type: ignore[import" in lines[node.lineno - 1]):
                    continue
                missing.setdefault(top, f"{path.relative_to(ROOT)}:{node.lineno}")
    assert missing == {}, "add to the lint extra, or to [[tool.mypy.overrides]] if it has no types"
