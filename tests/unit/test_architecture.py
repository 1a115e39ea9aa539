"""The package layout keeps its promises: small modules, no import cycles, one home per concept."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rollout_mock"
MAX_LINES = 420  # "about 400": a module is one concept, readable in one sitting

#: Which top-level packages may import which at module level (data flows wrap -> codec ->
#: storage -> disk; compare/cli/debug sit on top). Function-local imports are not edges.
LAYERS: dict[str, set[str]] = {
    "codec": {"errors", "_text", "batch", "_version", "_crc"},
    "storage": {"codec", "errors", "_text", "_progress", "batch", "config", "modes", "_version", "_crc"},
    "determinism": {"errors", "_text", "config", "_version"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _top_level_imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Modules of the package imported at module level (``TYPE_CHECKING`` blocks excluded)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_no_module_is_over_about_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules by concept: {long}"


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _top_level_imports(path, name, modules) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is not a cycle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_layers_only_import_downwards() -> None:
    modules = _modules()
    bad = []
    for name, path in modules.items():
        layer = name.split(".")[1] if "." in name else ""
        allowed = LAYERS.get(layer)
        if allowed is None:
            continue
        for target in _top_level_imports(path, name, modules):
            other = target.split(".")[1] if "." in target else ""
            if other and other != layer and other not in allowed:
                bad.append(f"{name} imports {target}")
    assert bad == []


def test_every_exception_lives_in_errors() -> None:
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Warning"))) for b in node.bases
            ):
                elsewhere.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert elsewhere == [], "declare exceptions in rollout_mock/errors.py"


def test_every_public_module_states_its_api() -> None:
    missing = []
    for name, path in _modules().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("_") or path.name == "__main__.py" or name.split(".")[1:2] == ["cli"]:
            continue
        if not any(
            (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets))
            or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "__all__")
            for n in ast.parse(path.read_text()).body
        ):
            missing.append(name)
    assert missing == []


def test_one_logger_and_one_json_float_encoder() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path.name != "_text.py" and ("getLogger(" in text or "def _json_float" in text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == [], "use rollout_mock._text.logger / json_float"
