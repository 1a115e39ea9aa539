"""The package layout keeps its promises: layers, no import cycles, one home per concept.

How long a module may be is a review rule, not a test (docs/contributing.md, "Modules"): a module
holds one concept whole, and a concept is not cut into files to stay under a line count.
"""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rollout_mock"
#: Not a design rule (modules are cut by concept, in review: see docs/contributing.md), only a
#: backstop against a module that has clearly become several.
MAX_LINES = 1200

#: Which top-level packages may import which at module level (data flows wrap -> codec ->
#: storage -> disk; compare/cli/debug sit on top). Function-local imports are not edges.
LAYERS: dict[str, set[str]] = {
    "codec": {"errors", "text", "batch", "version", "crc"},
    "storage": {"codec", "errors", "text", "progress", "batch", "config", "modes", "version", "crc", "jsonio"},
    "determinism": {"errors", "text", "config", "version"},
}

#: The foundation: modules every unit may import (they import nothing of the package but each
#: other, and ``batch`` only ``errors``).
FOUNDATION = {"errors", "text", "version", "crc", "progress", "jsonio", "modes", "batch"}

#: The allowed layer graph between the package's units (its subpackages and top-level modules),
#: counting EVERY run-time import: module level and inside functions (only ``if TYPE_CHECKING:``
#: blocks are left out). A unit may import the foundation and the units listed here, which
#: are all below it, so the graph has no cycle:
#:
#:   foundation <- codec <- storage <- config <- determinism <- wrap <- compare <- debug
#:   <- adapters <- demo <- cli
#:
#: wrap/, the interception core, depends on nothing above it: it imports none of compare/,
#: debug/ or adapters/ (its stall watchdog lives in wrap/, the dump's expected metrics are read
#: and written by compare/). It knows no framework either: adapters register scheduler hooks
#: (rollout_mock.wrap.hooks), step-argument names (rollout_mock.wrap.calls) and batch types
#: (rollout_mock.batch), and the root package imports them, whatever the user imports.
UNIT_LAYERS: dict[str, set[str]] = {
    "codec": set(),
    "storage": {"codec"},
    "config": {"storage"},
    "determinism": set(),
    "wrap": {"codec", "storage", "config", "determinism"},
    "compare": {"codec", "storage", "config", "determinism", "wrap"},
    "debug": {"codec", "storage", "config", "determinism", "wrap", "compare"},
    "adapters": {"codec", "storage", "config", "determinism", "wrap", "compare", "debug"},
    "demo": {"codec", "storage", "config", "determinism", "wrap", "compare", "debug"},
    "cli": {"codec", "storage", "config", "determinism", "wrap", "compare", "debug", "adapters", "demo"},
    "__main__": {"cli"},
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


def _unit(module: str) -> str:
    """The unit a module belongs to: ``rollout_mock.wrap.scheduler`` -> ``wrap``; the root
    package itself (the lazy public facade) -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _runtime_imports(path: Path, name: str, modules: dict[str, Path], *,
                     type_checking: bool = False) -> list[tuple[str, str | None, int]]:
    """Every run-time import of a package module, at module level or inside functions:
    ``(target module, imported name or None, line)``; ``if TYPE_CHECKING:`` blocks excluded
    unless ``type_checking``."""
    tree = ast.parse(path.read_text())
    checking_only: set[int] = set()
    for node in ast.walk(tree):
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            checking_only.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if id(node) in checking_only:
            continue
        if isinstance(node, ast.Import):
            pairs: list[tuple[str, str | None]] = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            pairs = [(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, a.name) for a in node.names]
        else:
            continue
        found.extend((target, alias, node.lineno) for target, alias in pairs if target in modules and target != name)
    return found


def _unit_edges(*, type_checking: bool = False) -> dict[tuple[str, str], list[str]]:
    """``(importing unit, imported unit) -> ["file:line", ...]`` over all run-time imports (and
    the ``TYPE_CHECKING`` ones with ``type_checking``)."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in modules.items():
        for target, _, line in _runtime_imports(path, name, modules, type_checking=type_checking):
            a, b = _unit(name), _unit(target)
            if a and b and a != b:
                edges.setdefault((a, b), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def test_no_import_cycle_between_units_counting_function_level_imports() -> None:
    """Counting every import: module level, inside functions, and even ``TYPE_CHECKING`` blocks."""
    edges = _unit_edges(type_checking=True)
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    cycles = []
    for (a, b), where in sorted(edges.items()):
        seen, todo = set(), [b]  # is `a` reachable from `b`?
        while todo:
            node = todo.pop()
            if node == a:
                cycles.append(f"{a} -> {b} ({', '.join(where[:3])}) closes a cycle")
                break
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
    assert cycles == []


def _module_graph() -> dict[str, set[str]]:
    """``module -> modules it imports`` over every run-time import, module level and inside
    functions (``TYPE_CHECKING`` blocks excluded). A package's ``__init__`` importing its own
    submodules is not an edge (its children import it whatever they do)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {target for target, _, _ in _runtime_imports(path, name, modules)}
        graph[name] = {t for t in targets if not t.startswith(name + ".")}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_cycle_between_modules_counting_function_level_imports() -> None:
    """Module by module (not only unit by unit): an import inside a function is an edge too, so
    a cycle cannot hide behind "imported locally to avoid a cycle"."""
    cycle = _find_cycle(_module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_module_cycle_check_sees_function_level_imports() -> None:
    """The check above can fail: a cycle closed by a function-level import is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert _find_cycle(graph) is None
    graph["c"] = {"a"}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    modules = _modules()
    edges = {t for t, _, _ in _runtime_imports(modules["rollout_mock.cli.bundle"], "rollout_mock.cli.bundle", modules)}
    assert "rollout_mock.debug.cut" in edges  # imported inside a function there


def test_the_package_is_under_100_modules() -> None:
    """Modules by concept (issue 27): a concept split across small files is merged, and the
    package stays under 100 modules."""
    count = len(list(PACKAGE.rglob("*.py")))
    assert 50 < count < 100, f"{count} modules in rollout_mock/: merge the small ones of one concept"


def test_units_only_import_the_layers_below_them() -> None:
    bad = []
    for (a, b), where in sorted(_unit_edges().items()):
        if b in FOUNDATION and (a not in FOUNDATION or a in UNIT_LAYERS):
            continue
        allowed = UNIT_LAYERS.get(a)
        if a in FOUNDATION:
            allowed = {"errors"} if a in ("batch", "jsonio") else set()
        if allowed is None or b not in allowed:
            bad.append(f"{a} imports {b}: {', '.join(where)}")
    assert bad == [], "see UNIT_LAYERS for the allowed graph"


def test_wrap_imports_no_framework_adapter() -> None:
    """ROLL-, verl-, AReaL- and slime-specific code lives in adapters/, which registers hooks."""
    assert [w for (a, b), w in _unit_edges().items() if a == "wrap" and b == "adapters"] == []


def _code_words(path: Path) -> list[tuple[int, str]]:
    """``(line, word)`` for every name the code of a module uses: identifiers, attributes,
    imported names, definitions, keyword arguments and string constants. Docstrings and comments
    are prose, not code, and are left out."""
    tree = ast.parse(path.read_text())
    # docstrings, and every other string that stands alone as a statement (attribute docstrings,
    # e.g. a pydantic field's): prose too
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    words: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            words.append((line, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((line, node.attr))
        elif isinstance(node, ast.alias):
            words += [(line, node.name)] + ([(line, node.asname)] if node.asname else [])
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.append((line, node.module))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words.append((line, node.name))
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            words.append((line, node.arg))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append((line, node.value))
    return words


def _naming(pattern: str, *, units: set[str] | None = None, allowed: tuple[str, ...] = ()) -> list[str]:
    """``file:line: word`` for every code word matching ``pattern`` in the package's modules (only
    those of ``units`` when given), outside the ``allowed`` paths (relative to rollout_mock/)."""
    regex = re.compile(pattern, re.IGNORECASE)
    found = []
    for name, path in _modules().items():
        rel = path.relative_to(PACKAGE).as_posix()
        if (units is not None and _unit(name) not in units) or rel.startswith(allowed):
            continue
        found += [f"{rel}:{line}: {word!r}" for line, word in _code_words(path) if regex.search(word)]
    return sorted(set(found))


def test_only_the_batch_model_and_the_adapters_name_framework_batch_classes() -> None:
    """DataProto and TensorDict are known to ``rollout_mock/batch.py`` (the batch model) and to
    the adapters, which register them as batch types; every other module asks the batch model
    (diff, traces, debug rows, redact, sequences, partial loads, subsample). The codec, which
    rebuilds the frameworks' classes from its file format, is the other exception."""
    assert _naming(r"tensordict|dataproto", allowed=("batch.py", "adapters/", "codec/")) == []


def test_the_codec_knows_batch_classes_by_their_parts_not_tensordict_by_name() -> None:
    """The codec's writer, reader, format check and structural classes dispatch on a registered
    class made of parts (rollout_mock.batch.KeyedCodec, registered by adapters/frameworks.py for
    TensorDict, NonTensorData, NonTensorStack and LazyStackedTensorDict), never on those names
    nor on their tags; device placement asks the batch type's ``map_tensors``. (legacy.py and
    trusted.py read and write format 1, whose pickles name ``rollout_mock.codec._rebuild_tensordict``:
    they know the tag it builds, and build it through the registered class.)"""
    names = r"tensordict|nontensor|tdstack|lazystacked"
    modules = ("codec/encode.py:", "codec/decode.py:", "codec/format.py:", "codec/safe.py:", "codec/classes.py:",
               "codec/device.py:")
    assert [hit for hit in _naming(names, units={"codec"}) if hit.startswith(modules)] == []
    assert any(hit.startswith("codec/legacy.py:") for hit in _naming(names, units={"codec"}))  # the scan works
    described = "\n".join(_naming(names, units={"adapters"}))
    for name in ("TENSORDICT", "tensordict._td:TensorDict", "tensordict.tensorclass:NonTensorData",
                 "tensordict.tensorclass:NonTensorStack", "tensordict._lazy:LazyStackedTensorDict",
                 "'nontensor'", "'tdstack'"):
        assert name in described, name


def test_wrap_names_no_framework() -> None:
    """wrap/, the interception core, names no framework, batch class, or framework convention
    (ROLL's, verl's and slime's step arguments are registered by the adapters)."""
    pattern = r"tensordict|dataproto|global_steps|rollout_id|meta_info|\bverl\b|\bslime\b|\bareal\b|\btrl\b|\broll\b"
    assert _naming(pattern, units={"wrap"}) == []


#: A framework's name inside a word too (``_slime_samples``, ``trl_view``, ``"rollout_mock.slime"``),
#: but not inside another word (``overlay``, ``rollout``, ``control``).
FRAMEWORK_NAMES = r"(?<![a-z])(verl|slime|areal|trl|roll)(?![a-z])"


def test_compare_and_debug_name_no_framework() -> None:
    """Framework knowledge lives in adapters/ (issue 36): traces, the log-prob check and the report
    read each framework's log-prob columns, samples and records through the layouts its adapter
    registers (:class:`rollout_mock.batch.Layout`); their code (not their prose) names none."""
    assert _naming(FRAMEWORK_NAMES, units={"compare", "debug"}) == []


def test_framework_name_scan_sees_code() -> None:
    """The scans above can fail: they find the names where the adapters use them."""
    assert any("DataProto" in hit for hit in _naming(r"dataproto", units={"adapters"}))
    assert any("'rollout_id'" in hit for hit in _naming(r"rollout_id", units={"adapters"}))
    named = _naming(FRAMEWORK_NAMES, units={"adapters"})
    assert any("'_slime_samples'" in hit for hit in named) and any("'verl'" in hit for hit in named)
    assert [w for w in ("overlay_section", "rollout_mock", "controller", "_roll_scan", "TRL_FORMAT", "rollout_mock.slime")
            if re.search(FRAMEWORK_NAMES, w, re.IGNORECASE)] == ["_roll_scan", "TRL_FORMAT", "rollout_mock.slime"]


def test_no_private_name_is_imported_from_another_unit() -> None:
    """``from rollout_mock.x.y import _name`` (or a ``_module`` inside another subpackage) from
    outside ``x``: a private name is private to its subpackage. The shared top-level modules are
    public (``rollout_mock.text``, ``crc``, ``progress``, ``jsonio``, ``version``)."""
    modules = _modules()
    bad = []
    for name, path in modules.items():
        for target, alias, line in _runtime_imports(path, name, modules):
            if _unit(target) in ("", _unit(name)):
                continue
            private_module = any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:])
            private_name = (alias is not None and alias.startswith("_") and not alias.startswith("__")
                            and f"{target}" != f"rollout_mock.{alias}")
            if private_module or private_name:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {alias or target} from {target}")
    assert bad == []


def test_no_module_is_several_concepts_by_its_length() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules by concept: {long}"


def _closure(start: str, modules: dict[str, Path]) -> set[str]:
    """Every package module ``start`` reaches through run-time imports (function level too)."""
    seen, todo = {start}, [start]
    while todo:
        current = todo.pop()
        for target, _, _ in _runtime_imports(modules[current], current, modules):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _third_party(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports (anywhere in it)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_codec_is_a_handful_of_modules_by_concept() -> None:
    """format, encode, decode, safe loading, classes, legacy, trusted (issue 27); device memory:
    CUDA tensors staged through pinned buffers and replayed onto a device (issue 29); the
    structural comparison of two values, below wrap/ so that check mode uses it too; the request
    record beside it; the flight recorder's reads of a batch's values (issue 36)."""
    codec = sorted(p.stem for p in (PACKAGE / "codec").glob("*.py"))
    assert codec == ["__init__", "classes", "decode", "device", "encode", "format", "legacy", "request", "safe",
                     "scan", "structure", "trusted"]


def test_the_safe_loader_reaches_no_unpickler() -> None:
    """Trusted unpickling lives in codec/trusted.py, which nothing on the safe read path imports
    (counting function-level imports), and no module on that path imports pickle."""
    modules = _modules()
    reached = _closure("rollout_mock.codec.safe", modules)
    assert {"rollout_mock.codec.decode", "rollout_mock.codec.legacy"} <= reached
    assert "rollout_mock.codec.trusted" not in reached and "rollout_mock.codec.encode" not in reached
    pickling = {name: sorted(_third_party(modules[name]) & {"pickle", "_pickle", "cloudpickle", "dill"})
                for name in reached}
    assert {name: found for name, found in pickling.items() if found} == {}


def test_the_write_path_never_imports_the_decoder() -> None:
    """One write path: encoding a batch (or a capture) never decodes it again."""
    modules = _modules()
    reached = _closure("rollout_mock.codec.encode", modules)
    assert not reached & {"rollout_mock.codec.decode", "rollout_mock.codec.safe", "rollout_mock.codec.legacy",
                          "rollout_mock.codec.trusted"}, reached


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _top_level_imports(path, name, modules) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is not a cycle with them
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not t.startswith(name + ".")}
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
        if path.relative_to(PACKAGE) != Path("text.py") and ("getLogger(" in text or "def _json_float" in text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == [], "use rollout_mock.text.logger / json_float"


def _store_depths() -> dict[str, int]:
    """Inheritance depth of every class in rollout_mock/storage, counting only bases declared there
    (``typing.Protocol`` interfaces count as a level when a class names them as a base)."""
    bases: dict[str, list[str]] = {}
    for path in (PACKAGE / "storage").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                bases[node.name] = [n for n in names if n]

    def depth(cls: str, seen: frozenset[str] = frozenset()) -> int:
        inner = [b for b in bases.get(cls, []) if b in bases and b not in seen]
        return 1 + max((depth(b, seen | {cls}) for b in inner), default=0)

    return {cls: depth(cls) for cls in bases}


def test_store_depth_scan_sees_inheritance() -> None:
    """The scan below can fail: the current storage classes are found with their depths."""
    depths = _store_depths()
    assert depths.get("BatchInfo") == 1 and max(depths.values()) >= 2


def test_store_classes_are_at_most_two_levels_deep() -> None:
    deep = {cls: d for cls, d in _store_depths().items() if d > 2}
    assert deep == {}, "storage is composition: interface -> backend, no deeper"


_DECODING = ("rollout_mock/codec/safe.py", "rollout_mock/codec/decode.py", "rollout_mock/codec/legacy.py",
             "rollout_mock/codec/trusted.py")


#: What the writer thread must not run on a capture: the encoder again (it was captured once).
_ENCODING = ("rollout_mock/codec/encode.py:node", "rollout_mock/codec/encode.py:capture",
             "rollout_mock/codec/encode.py:_captured")


def _writer_thread_calls(dump: Path, calls: int = 1, **config: object) -> tuple[set[str], list[str], list[str]]:
    """Every function the writer thread runs while it writes captured steps (a profile hook on
    every thread but this one), and those of them that decode (the safe decoder, the format-1
    reader, the unpickler, ``pickle.load``) or encode again. The batch holds tensors, strings,
    Python samples and floats: every path of the scan is taken."""
    import sys
    import threading

    import torch

    from rollout_mock import MockScheduler

    batch = {"input_ids": torch.arange(4096).reshape(8, 512), "logprobs": torch.randn(8, 512),
             "texts": ["a", "b"] * 4, "samples": [{"tokens": list(range(64)), "reward": 0.5}] * 8,
             "meta": {"temperature": 0.7, "ts": [1.0, 2.0]}}

    class Source:
        def get_batch(self, data: object, global_step: int) -> object:
            return batch

    called: set[str] = set()
    main = threading.get_ident()

    def hook(frame: object, event: str, arg: object) -> None:
        if threading.get_ident() != main:
            code = frame.f_code if event == "call" else None  # type: ignore[attr-defined]
            if code is not None:
                called.add(f"{code.co_filename}:{code.co_name}")
            elif event == "c_call":
                called.add(f"{getattr(arg, '__module__', None)}.{getattr(arg, '__qualname__', arg)}")

    settings = {"enable": True, "mode": "dump", "dump_dir": str(dump), "background": True, "fingerprint": "off",
                **config}
    threading.setprofile(hook)
    try:
        with MockScheduler(Source(), settings) as mock:
            for step in range(3):
                for _ in range(calls):  # the calls beyond a step's first go to packs
                    mock.get_batch(None, step)
            mock.flush()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)
    assert any("rollout_mock/codec/format.py:write_container" in name for name in called), "the hook saw no write"
    decoding = sorted(name for name in called if any(part in name for part in _DECODING)
                      or name.startswith(("_pickle.load", "_pickle.Unpickler", "pickle.load")))
    encoding = sorted(name for name in called if any(name.endswith(part) for part in _ENCODING))
    return called, decoding, encoding


@pytest.mark.parametrize(("calls", "config"), [(1, {}), (1, {"keep": {"last": 2}}), (3, {})],
                         ids=["plain", "keep", "packs"])
def test_the_writer_thread_calls_no_decoder_for_a_capture(tmp_path: Path, calls: int,
                                                          config: dict[str, object]) -> None:
    """Follows the calls, not the imports (issue 36): the writer thread writes captured steps
    without decoding or encoding them again, and with ``keep:`` it scans each for NaN/inf in
    place (:meth:`rollout_mock.codec.Capture.tensors`), not through a rebuild of the batch.
    ``packs``: several calls a step, the further ones captured into one list on the calling
    thread (:class:`rollout_mock.codec.CaptureList`) that the writer writes as it is."""
    called, decoding, encoding = _writer_thread_calls(tmp_path / "d", calls, **config)
    assert decoding == [] and encoding == []
    if calls > 1:
        assert any(name.endswith("rollout_mock/storage/store.py:save_pack") for name in called)
    if config:
        assert any(name.endswith("rollout_mock/codec/scan.py:_captured_nonfinite") for name in called)
        assert any(name.endswith("rollout_mock/codec/encode.py:tensors") for name in called)


def test_the_call_check_sees_a_scan_that_rebuilds_the_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a scan that rebuilds the capture through the decoder (what
    ``_scan`` did through ``view_capture``) or encodes the batch again is caught."""
    import rollout_mock.codec as codec
    import rollout_mock.wrap.recording as recording
    from rollout_mock.codec.trusted import loads

    def rebuilding_scan(batch: object) -> list[str]:
        assert isinstance(batch, codec.Capture)
        view = codec.view_capture(batch)
        codec.capture(view).release()
        loads(pickle.dumps(1))
        return []

    monkeypatch.setattr(recording, "nonfinite_values", rebuilding_scan)
    _, decoding, encoding = _writer_thread_calls(tmp_path / "d", 1, keep={"last": 2})
    assert any("codec/safe.py" in name for name in decoding) and any("codec/decode.py" in name for name in decoding)
    assert any("_pickle.load" in name or "trusted.py" in name for name in decoding)
    assert any(name.endswith("encode.py:node") for name in encoding)


#: The dump's side folders, named in storage/ only (rollout_mock.storage.store lays them out).
_SIDE_FOLDERS = ("checks", "expected")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (module, classes, functions)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _store_layout_offences(source: str, unit: str, modules: frozenset[str] = frozenset()) -> list[str]:
    """What code of ``unit`` (a top-level package, e.g. ``wrap``) does that only storage/ may:
    reach a store's byte backend (``.backend``; codec/ has a device backend of its own: there,
    only ``store.backend``), downcast to ``Store``, or name a side folder of the dump."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "backend":
            owner = ast.unparse(node.value)
            if unit != "codec" or "store" in owner.lower():
                found.append(f"line {node.lineno}: {owner}.backend")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(isinstance(k, ast.Name) and k.id in ("Store", "StepStore") for k in kinds):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and node.value not in modules:
            if any(node.value == name or node.value.startswith(f"{name}/") for name in _SIDE_FOLDERS):
                found.append(f"line {node.lineno}: the side folder {node.value!r}")
    return found


def test_store_layout_scan_sees_backends_downcasts_and_side_folders() -> None:
    """The scan below can fail: each thing it refuses is found in a snippet."""
    snippet = ('"""A docstring may say expected/metrics.jsonl."""\n'
               'def f(store, name):\n'
               '    store.backend.replace("x", b"")\n'
               '    assert isinstance(store, Store)\n'
               '    return [f"expected/{name}", "checks"]\n')
    found = _store_layout_offences(snippet, "wrap")
    assert sorted(f.split(":")[0] for f in found) == ["line 3", "line 4", "line 5", "line 5"], found
    assert _store_layout_offences("self.backend.event()\n", "codec") == []
    assert _store_layout_offences('LAZY = {"read": "expected"}\n', "compare", frozenset({"expected"})) == []
    assert _store_layout_offences("pool.store.backend.event()\n", "codec") != []


def test_only_storage_touches_a_stores_backend_or_names_its_side_folders() -> None:
    """The Store owns every file of a dump (steps, index, expected metrics, check verdicts,
    bundles): code outside storage/ goes through its methods, never its byte backend, never a
    ``Store`` downcast, and never spells a side folder's name."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "storage":
            continue
        found = _store_layout_offences(path.read_text(), rel.parts[0] if len(rel.parts) > 1 else rel.stem,
                                       frozenset(p.stem for p in path.parent.glob("*.py")))
        if found:
            offenders[str(rel)] = found
    assert offenders == {}, "go through rollout_mock.storage.store.Store's methods"


def _file_movers(source: str) -> list[str]:
    """Calls that move a written file into place (``os.replace``, ``os.link``) or make a
    temporary one (``tempfile.mkstemp``/``NamedTemporaryFile``): what an atomic writer does."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = ast.unparse(node.func)
            if name in ("os.replace", "os.link", "tempfile.mkstemp", "tempfile.NamedTemporaryFile"):
                found.append(f"line {node.lineno}: {name}")
    return found


def _descriptor_writes(source: str) -> list[str]:
    """Calls that write, sync or cut an open file descriptor (``os.write``, ``os.fsync``, ...):
    what a writer of a file holds a handle for."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = ast.unparse(node.func)
            if name in ("os.write", "os.writev", "os.pwrite", "os.fsync", "os.fdatasync", "os.ftruncate"):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_descriptor_write_scan_sees_an_append() -> None:
    assert _descriptor_writes("import os\nos.write(fd, line)\nos.fsync(fd)\n") == ["line 2: os.write",
                                                                                   "line 3: os.fsync"]


def test_only_storage_writes_through_a_file_descriptor() -> None:
    """Appends (the metrics files, the dump run's expected metrics) go through storage's
    ``AppendFile``, which the Store hands out for a dump's file: no code outside storage/ holds a
    descriptor it writes, syncs or truncates."""
    offenders = {str(path.relative_to(PACKAGE)): found for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE).parts[0] != "storage" and (found := _descriptor_writes(path.read_text()))}
    assert offenders == {}, "append through rollout_mock.storage.directory.AppendFile (Store.open_expected for a dump)"


def test_atomic_writer_scan_sees_a_rename() -> None:
    assert _file_movers("import os\nos.replace(tmp, path)\n") == ["line 2: os.replace"]


def test_one_atomic_writer() -> None:
    """Every file is written whole through storage/directory.py's ``TempFile`` (``atomic_write``,
    ``write_inside``, the backends, bundles): no second temporary-file-and-rename anywhere."""
    offenders = {str(path.relative_to(PACKAGE)): found for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE) != Path("storage/directory.py")
                 and (found := _file_movers(path.read_text()))}
    assert offenders == {}, "write through rollout_mock.storage.directory.atomic_write / TempFile"


#: The type tests of the structural walks' one dispatch (rollout_mock.codec.structure.kind_of) and
#: the reads of a container's fields (node_fields): names only the engine's module uses.
DISPATCH_WORDS = r"^(?-i:is_dataclass|fields|batch_type_of|batch_parts|SimpleNamespace|Enum|generic|FunctionType|MethodType)$"


def test_the_request_digest_and_the_structure_engine_share_one_dispatch() -> None:
    """The request record (codec/request.py, beside the engine) and the flight recorder's scans
    (codec/scan.py) classify a value with the engine's dispatch (``kind_of``) and read a
    container's fields with its ``node_fields``; wrap/matching.py, the request's model, tests no
    dataclass, namespace, enum or batch type (issue 36: one walk's notion of structure). The scan
    can fail: it finds the words in the engine's module."""
    assert [hit for hit in _naming(DISPATCH_WORDS, units={"wrap"}) if hit.startswith("wrap/matching.py:")] == []
    assert [hit for hit in _naming(DISPATCH_WORDS, units={"codec"})
            if hit.startswith(("codec/request.py:", "codec/scan.py:"))] == []
    assert len({hit.split(": ")[1] for hit in _naming(DISPATCH_WORDS, units={"codec"})
                if hit.startswith("codec/structure.py:")}) >= 6


#: Type tests that say "this value is a container" (or a tensor or an array: what a walk opens).
_CONTAINER_TYPES = {"Mapping", "MutableMapping", "Sequence", "Iterable", "Collection", "list", "tuple", "dict",
                    "set", "frozenset", "Tensor", "ndarray"}
#: The structural dispatch and fields readers: only the walks of codec/ call them.
_STRUCTURE_READS = {"kind_of", "node_fields", "batch_parts", "is_dataclass", "fields", "asdict", "astuple"}


def _type_names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {name for elt in node.elts for name in _type_names(elt)}
    if isinstance(node, ast.BinOp):  # X | Y
        return _type_names(node.left) | _type_names(node.right)
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return {node.id} if isinstance(node, ast.Name) else set()


def _container_tests(fn: ast.AST) -> list[int]:
    """Lines where ``fn`` tests a value against a container type: ``isinstance``/``issubclass``
    with one, ``type(x) is dict``, ``cls is list``, ``type(x) in (list, tuple)``, or opens an
    object's attributes with ``vars(x)``."""
    lines = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 \
                    and _type_names(node.args[1]) & _CONTAINER_TYPES:
                lines.append(node.lineno)
            elif node.func.id == "vars" and node.args:
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and all(isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.In | ast.NotIn)
                                                   for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(not isinstance(side, ast.Constant) and _type_names(side) & _CONTAINER_TYPES
                   and not isinstance(side, ast.Attribute) for side in sides):
                lines.append(node.lineno)
    return sorted(lines)


def _nan_rules(fn: ast.AST) -> list[int]:
    """Lines where ``fn`` states an equality rule for NaN of its own (``isnan(a) and isnan(b)``,
    ``x != x``): the engine's :func:`~rollout_mock.codec.structure.same_value` is the one rule."""
    lines = []
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and sum(
                isinstance(v, ast.Call) and "isnan" in _type_names(v.func) for v in node.values) >= 2:
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.NotEq | ast.Eq) \
                and ast.dump(node.left) == ast.dump(node.comparators[0]):
            lines.append(node.lineno)
    return sorted(lines)


def _value_walks(source: str) -> list[str]:
    """``function:line what`` for every function or method of a module (nested functions too)
    that walks or compares values by rules of its own: it reads a value's structure with the
    codec's dispatch (``kind_of``, ``node_fields``, ``batch_parts``, a dataclass's ``fields``,
    ``asdict``); it reaches itself through the module's own calls (directly, or through other
    functions, nested functions and ``self.`` methods) and tests a value against a container type
    (:func:`_container_tests`); or it states a NaN rule of its own (:func:`_nan_rules`)."""
    tree = ast.parse(source)
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}

    def collect(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                funcs[prefix + node.name] = node
                collect(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                collect(node.body, f"{prefix}{node.name}.")

    collect(tree.body, "")
    by_name: dict[str, set[str]] = {}
    for qual in funcs:
        by_name.setdefault(qual.rsplit(".", 1)[-1], set()).add(qual)
    calls = {qual: [n for n in ast.walk(fn) if isinstance(n, ast.Call)] for qual, fn in funcs.items()}
    graph: dict[str, set[str]] = {}
    for qual in funcs:
        owner = qual.rsplit(".", 1)[0] if "." in qual else None
        graph[qual] = {q for c in calls[qual] if isinstance(f := c.func, ast.Name) for q in by_name.get(f.id, ())
                       if "." not in q or q.rsplit(".", 1)[0] in qual} | {
            f"{owner}.{f.attr}" for c in calls[qual] if isinstance(f := c.func, ast.Attribute)
            and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls") and f"{owner}.{f.attr}" in funcs}
    found = []
    for qual, fn in funcs.items():
        seen: set[str] = set()
        todo = list(graph[qual])
        while todo:
            if (current := todo.pop()) not in seen:
                seen.add(current)
                todo.extend(graph[current])
        reads = [c.lineno for c in calls[qual] if _type_names(c.func) & _STRUCTURE_READS]
        tests = _container_tests(fn)
        nan = _nan_rules(fn)
        if reads:
            found.append(f"{qual}:{reads[0]} reads a value's structure")
        elif qual in seen and tests:
            found.append(f"{qual}:{tests[0]} recurses over containers")
        elif nan:
            found.append(f"{qual}:{nan[0]} has a NaN rule of its own")
    return found


#: Value walks as they were in wrap/ before issue 36 moved them below it (round 3): the
#: request digest's (wrap/matching.py, d84ad52..5118bf4), the rollout settings' flattening and
#: comparison (wrap/mismatch.py's ``_flat``, ``_same``), the bounded copy of a recorded summary
#: (wrap/matching.py's ``_bounded``) and the flight recorder's scans (wrap/retention.py's
#: ``_Scan``, ``_Health``), cut to the lines that make them walks. The self-test below shows
#: that the scan finds each.
_OLD_WALKS = """
from rollout_mock.codec.structure import kind_of, node_fields

class _Digester:
    def value(self, obj, path, depth, keep=True):
        cls = type(obj)
        if cls is list or cls is tuple:
            digest, info = self._sequence(obj, path, depth, keep)
        elif isinstance(obj, Mapping):
            digest, info = self._mapping(b"D", obj, path, depth, keep)
        elif (kind := kind_of(obj)) == "dataclass":
            digest, info = self._mapping(b"C", node_fields(obj, kind), path, depth, keep)
        return digest

    def _mapping(self, tag, obj, path, depth, keep):
        for key in sorted(obj):
            self.value(obj[key], (*path, key), depth + 1, keep)

    def _sequence(self, obj, path, depth, node):
        return self._items(obj, path, depth + 1, 0)

    def _items(self, items, item_path, depth, crc):
        if isinstance(items[0], dict):
            return self._columns(items, item_path, depth, crc)
        for item in items:
            crc = self.value(item, item_path, depth, False)
        return crc

def _flat(prefix, value, out, depth=0):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping) and depth < 8:
        for key in sorted(value, key=str):
            _flat(f"{prefix}.{key}", value[key], out, depth + 1)

def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)

def _bounded(value, depth):
    if isinstance(value, list):
        return [_bounded(v, depth + 1) for v in value[:256]] if depth < 3 else []
    return value

class _Health:
    def walk(self, obj, path, depth):
        cls = type(obj)
        if cls is dict:
            self._mapping(obj, path, depth)
        elif cls is list:
            for item in obj:
                self.walk(item, path, depth + 1)

    def _mapping(self, obj, path, depth):
        for key, value in obj.items():
            self.walk(value, f"{path}.{key}", depth + 1)

def scan(batch):
    places = []
    def walk(obj, path):
        if type(obj) in (list, tuple):
            for i, item in enumerate(obj):
                walk(item, f"{path}[{i}]")
        elif obj != obj:
            places.append(path)
    walk(batch, "")
    return places
"""


def test_value_walk_scan_sees_the_old_walks() -> None:
    found = _value_walks(_OLD_WALKS)
    assert "_Digester.value:11 reads a value's structure" in found
    assert "_Digester._items:23 recurses over containers" in found
    assert "_flat:30 reads a value's structure" in found
    assert "_same:37 has a NaN rule of its own" in found
    assert "_bounded:42 recurses over containers" in found
    assert "_Health.walk:49 recurses over containers" in found  # by type identity, no isinstance
    assert "scan.walk:62 recurses over containers" in found  # a nested function
    assert _value_walks("def f(x):\n    return [f(v) for v in x] if isinstance(x, list) else x\n") == [
        "f:2 recurses over containers"]
    assert _value_walks("def f(x):\n    return isinstance(x, list)\n") == []  # a type test alone is no walk
    assert _value_walks("def f(x):\n    return vars(type(x))\n") == []  # nor a class's attributes
    assert _value_walks("def f(a):\n    return a[~np.isnan(a)]\n") == []  # nor dropping NaN from a score


def test_wrap_walks_no_value() -> None:
    """Every walk of a value is below wrap/ (issue 36): the request record in codec/request.py, the
    comparison engine, the settings' flattening and comparison in codec/structure.py, a recorded
    summary's bounded reading in codec/request.py, the flight recorder's scans in codec/scan.py.
    No module of wrap/ reads a value's structure with the codec's dispatch, recurses over a
    value's containers or states a NaN rule of its own."""
    found = [f"{path.name}:{hit}" for path in sorted((PACKAGE / "wrap").glob("*.py"))
             for hit in _value_walks(path.read_text())]
    assert found == []


