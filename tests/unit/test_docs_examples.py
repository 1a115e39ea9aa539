"""Every Python example in the docs that is marked runnable is run, and must succeed.

The marker: a fenced ```python block whose opening fence directly follows a line holding only
``<!-- runnable -->`` (blank lines in between are allowed), in ``docs/**/*.md`` or ``README.md``.
The comment is invisible on GitHub and on the documentation site. Each marked block runs on its
own in a fresh subprocess of this interpreter, in an empty temporary directory, with a 120 s
timeout (see docs/contributing.md for what a runnable block may do).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- runnable -->"
TIMEOUT_S = HANG_S

_BLOCK = re.compile(
    r"^[ \t]*" + re.escape(MARKER) + r"[ \t]*\n(?:[ \t]*\n)*"   # the marker, then blank lines
    r"(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*python\b[^\n]*\n"   # ```python (attributes allowed)
    r"(?P<body>.*?)"
    r"^(?P=indent)(?P=fence)[ \t]*$",
    flags=re.M | re.S,
)


def _sources() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def _examples() -> list[tuple[str, str]]:
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            indent = match.group("indent")
            body = "".join(line[len(indent):] if line.startswith(indent) else line
                           for line in match.group("body").splitlines(keepends=True))
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", body))
    return found


EXAMPLES = _examples()


def test_markers_are_attached_to_python_blocks() -> None:
    """A marker that does not precede a ```python block would silently run nothing."""
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        markers = len(re.findall(r"^[ \t]*" + re.escape(MARKER) + r"[ \t]*$", text, flags=re.M))
        blocks = len(list(_BLOCK.finditer(text)))
        assert markers == blocks, f"{path.relative_to(ROOT)}: {markers} {MARKER} markers, {blocks} python blocks after them"


def test_there_are_runnable_examples() -> None:
    assert len(EXAMPLES) >= 5, [where for where, _ in EXAMPLES]


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_runnable_example(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    # this checkout's package first, even when pytest runs without it installed
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": path}
    try:
        result = subprocess.run(
            [sys.executable, str(script)], cwd=work, env=env,
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: the example ran longer than {TIMEOUT_S} s")
    assert result.returncode == 0, (
        f"{where}: the example failed (exit {result.returncode})\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )


_ANY_PYTHON = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*python\b[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    flags=re.M | re.S,
)


def test_every_python_block_is_valid_python() -> None:
    """Blocks that are not runnable (framework code, fragments) are still pasted by users: each
    must at least parse (``...`` placeholders only where an expression may stand)."""
    import ast
    import textwrap

    bad = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for match in _ANY_PYTHON.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            try:
                compile(textwrap.dedent(match.group("body")), f"{path.relative_to(ROOT)}:{line}", "exec",
                        flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
            except SyntaxError as exc:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {exc.msg} (block line {exc.lineno})")
    assert bad == []
