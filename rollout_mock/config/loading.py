"""Loading the block from YAML files, mappings, OmegaConf objects or dataclasses: bounded YAML,
``${...}`` interpolation with OmegaConf, one error listing every problem.

Bounded YAML (:func:`load_yaml_file`): ``yaml.safe_load`` builds shared objects for aliases, so a
"billion laughs" document (nested anchors, each alias repeated) loads in milliseconds from a few
hundred bytes; the cost comes later, from whatever walks the result as a tree (validation,
``repr`` in an error message, OmegaConf's copy). :func:`load_yaml_file` therefore composes the
node graph first and, before any Python object is built, refuses:

* files over ``max_bytes``;
* documents whose node count, with every alias expanded, exceeds ``max_nodes``;
* recursive aliases (a node that contains itself) and nesting too deep for the parser.

Every refusal is a :class:`~rollout_mock.errors.ConfigError` with a one-line message; YAML syntax
errors are reported cut to a few hundred characters.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rollout_mock.config.model import _MAX_MESSAGE, BLOCK_KEY, RolloutMockConfig, build_config
from rollout_mock.errors import ConfigError
from rollout_mock.text import short_repr

__all__ = [
    "MAX_CONFIG_BYTES", "MAX_INTERPOLATION_DEPTH", "MAX_INTERPOLATION_SIZE", "MAX_YAML_NODES", "expanded_size",
    "load_config", "load_yaml_file",
]

#: Largest YAML config file read (a training config is a few kB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Most nodes a YAML document may have once its aliases are expanded.
MAX_YAML_NODES = 200_000
#: Longest chain of ``${...}`` references (``a: ${b}``, ``b: ${c}``...) plus the nesting of the
#: values they reach, and most characters (a container or a scalar counts :data:`_NODE_COST`)
#: that resolving them may produce: interpolations are bounded as YAML aliases are.
MAX_INTERPOLATION_DEPTH = 64
MAX_INTERPOLATION_SIZE = 4 * 1024 * 1024
_NODE_COST = 16
#: A ``${...}`` body's names: ``a.b``, ``.sibling``, ``..up.x``, ``list[0]`` (resolver names and
#: arguments match too: what is not a key of the config is ignored, so the count can only be high).
_REFERENCE = re.compile(r"(\.*)([\w\-]+(?:\.[\w\-]+|\[[\w\-]+\])*)")


def _to_plain(source: Any) -> Any:
    """OmegaConf containers and dataclasses to plain Python containers (interpolations checked by
    :func:`check_interpolations` before OmegaConf resolves them)."""
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        return dataclasses.asdict(source)
    omegaconf = sys.modules.get("omegaconf")  # a DictConfig exists only once omegaconf is imported
    if omegaconf is not None and isinstance(source, omegaconf.DictConfig):
        check_interpolations(omegaconf.OmegaConf.to_container(source, resolve=False), [()])
        return omegaconf.OmegaConf.to_container(source, resolve=True)
    return source


def check_interpolations(root: Any, starts: list[tuple[Any, ...]]) -> None:
    """Refuse, before OmegaConf resolves anything, ``${...}`` interpolations whose resolution
    from the values at ``starts`` (paths of keys and indices in ``root``) would be too large or
    too deep: a few hundred bytes of ``b: ${a}${a}``, ``c: ${b}${b}``... expand exponentially.

    Every ``${...}`` is followed to the values it names (absolute ``a.b``, relative ``.x`` and
    ``..x``, indices; names inside resolver calls too, so the estimate is never low) and the size
    of each value, references expanded, is computed once. :class:`ConfigError` names the key, the
    chain and the fix when the size passes :data:`MAX_INTERPOLATION_SIZE`, the chain (plus the
    nesting it reaches) passes :data:`MAX_INTERPOLATION_DEPTH`, or a value refers to itself."""
    sizes: dict[tuple[Any, ...], int] = {}
    on_path: list[tuple[Any, ...]] = []

    def name(path: tuple[Any, ...]) -> str:
        return ".".join(str(p)[:40] for p in path) or "<the config>"

    def chain() -> str:
        shown = [name(p) for p in on_path if isinstance(_lookup(root, p), str)]
        return " -> ".join(shown[:4] + (["..."] if len(shown) > 6 else []) + shown[max(4, len(shown) - 2):])

    def size(path: tuple[Any, ...]) -> int:
        known = sizes.get(path)
        if known is not None:
            return known
        if path in on_path:
            raise ConfigError(f"{name(on_path[0])}: a ${{...}} interpolation refers to itself ({chain()} -> "
                              f"{name(path)}); write the value out")
        if len(on_path) >= MAX_INTERPOLATION_DEPTH:
            raise ConfigError(f"{name(on_path[0])}: ${{...}} interpolations nest deeper than "
                              f"{MAX_INTERPOLATION_DEPTH} levels ({chain()}); write the value out or "
                              f"reference it directly")
        on_path.append(path)
        value = _lookup(root, path)
        total = _NODE_COST
        if isinstance(value, str):
            total += len(value)
            for target in _references(root, value, path):
                total += size(target)
                if total > MAX_INTERPOLATION_SIZE:
                    break
        elif isinstance(value, Mapping):
            for key in value:
                total += size((*path, key))
                if total > MAX_INTERPOLATION_SIZE:
                    break
        elif isinstance(value, list):
            for index in range(len(value)):
                total += size((*path, index))
                if total > MAX_INTERPOLATION_SIZE:
                    break
        if total > MAX_INTERPOLATION_SIZE:
            raise ConfigError(f"{name(on_path[0])}: its ${{...}} interpolations expand to more than "
                              f"{MAX_INTERPOLATION_SIZE:,} characters ({chain()}); an interpolation bomb? "
                              f"Write the value out, or reference each value once")
        on_path.pop()
        sizes[path] = total
        return total

    for start in starts:
        size(start)


_MISSING = object()


def _lookup(root: Any, path: tuple[Any, ...]) -> Any:
    node = root
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return _MISSING
    return node


def _references(root: Any, text: str, path: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The paths of the values of ``root`` that the ``${...}`` of ``text`` (the value at
    ``path``) may name, as OmegaConf resolves them: absolute from the root, relative (``.x``)
    from the mapping holding the value, one level up per further dot."""
    found: list[tuple[Any, ...]] = []
    start = text.find("${")
    while start >= 0:
        body, end = _body(text, start)
        names = _REFERENCE.findall(body)
        naming = _naming_part(body)
        if "${" in naming:  # ${a.${b}}: the name is made by the inner value; follow that too
            static = _static_body(root, naming, path)
            if static is None:
                shown = body if len(body) <= 400 else f"{body[:400]}...<{len(body)} chars>"
                raise ConfigError(f"{'.'.join(map(str, path))}: the nested interpolation ${{{shown}}} names "
                                  f"a value made by another resolver, which cannot be checked for its size; "
                                  f"write the value out")
            names += _REFERENCE.findall(static)
        for dots, dotted in names:
            target = _resolve(root, _base(path, dots), dotted)
            if target is not None:
                found.append(target)
        start = text.find("${", end)
    return found


def _base(path: tuple[Any, ...], dots: str) -> tuple[Any, ...]:
    """Where a reference with ``dots`` leading dots starts: the root, or the mapping holding the
    value at ``path`` and one level up per further dot."""
    return () if not dots else path[: max(len(path) - len(dots), 0)]


_INNERMOST = re.compile(r"\$\{([^${}]*)\}")
#: A resolver call's name: ``oc.select:`` in ``${oc.select:a,${oc.select:b,null}}``.
_RESOLVER = re.compile(r"\s*[A-Za-z_][\w.\-]*\s*:")


def _naming_part(body: str) -> str:
    """The part of a ``${...}`` body that names a value: all of it for a reference
    (``a.${b}``), the first argument of a resolver call (``oc.select:KEY,default``). The other
    arguments of a resolver are values: a nested ``${...}`` there (verl's
    ``${oc.select:a,${oc.select:b,null}}`` defaults) is followed like any reference, by its
    names, and needs no static value."""
    match = _RESOLVER.match(body)
    if match is None or body.startswith("${"):
        return body
    args, level = body[match.end():], 0
    for index, char in enumerate(args):
        if args.startswith("${", index):
            level += 1
        elif char == "}":
            level -= 1
        elif char == "," and level == 0:
            return args[:index]
    return args


def _static_body(root: Any, body: str, path: tuple[Any, ...]) -> str | None:
    """``body`` with each nested ``${name}`` replaced by the plain value it names, innermost
    first; ``None`` when one names no plain value of the config (a resolver's output)."""
    for _ in range(MAX_INTERPOLATION_DEPTH):
        match = _INNERMOST.search(body)
        if match is None:
            return body
        reference = _REFERENCE.fullmatch(match.group(1).strip())
        target = None if reference is None else _resolve(root, _base(path, reference.group(1)), reference.group(2))
        value = None if target is None else _lookup(root, target)
        if not isinstance(value, (str, int, float)) or len(str(value)) > 200 or "${" in str(value):
            return None
        body = body[: match.start()] + str(value) + body[match.end():]
    return None


def _body(text: str, start: int) -> tuple[str, int]:
    """The text of the ``${...}`` at ``start``, nested ``${...}`` included, and the index after
    its closing brace (the end of ``text`` when it has none)."""
    level, index = 0, start
    while index < len(text):
        if text.startswith("${", index):
            level += 1
            index += 2
            continue
        if text[index] == "}":
            level -= 1
            if level == 0:
                return text[start + 2:index], index + 1
        index += 1
    return text[start + 2:], len(text)


def _resolve(root: Any, base: tuple[Any, ...], dotted: str) -> tuple[Any, ...] | None:
    """The path of ``dotted`` (``a.b[0].c``) under ``base`` in ``root``, if it names a value."""
    path = base
    node = _lookup(root, base)
    for part in re.findall(r"[^.\[\]]+", dotted):
        if isinstance(node, Mapping):
            key: Any = part if part in node else int(part) if part.isdigit() and int(part) in node else None
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            key = int(part)
        else:
            return None
        if key is None:
            return None
        path, node = (*path, key), node[key]
    return path if path != base else None


def _has_interpolation(value: Any, seen: set[int] | None = None) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, (Mapping, list, tuple)):
        seen = set() if seen is None else seen
        if id(value) in seen:
            return False
        seen.add(id(value))
        items = value.values() if isinstance(value, Mapping) else value
        return any(_has_interpolation(item, seen) for item in items)
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return short_repr(text[0] if text else "", _MAX_MESSAGE).strip("'\"")


def _resolve_interpolations(root: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``root`` with the ``${...}`` values of its ``rollout_mock`` block (or of ``root`` itself,
    if it is the block) resolved by OmegaConf against the whole of ``root``. Without omegaconf,
    or when a value cannot be resolved: :class:`ConfigError` naming the key."""
    whole = BLOCK_KEY in root
    block = root[BLOCK_KEY] if whole else root
    if not isinstance(block, Mapping):
        return root
    keys = [key for key, value in block.items() if _has_interpolation(value)]
    if not keys:
        return root
    first = f"{BLOCK_KEY}.{keys[0]}"
    try:
        from omegaconf import OmegaConf
    except ImportError:
        raise ConfigError(
            f"{first}: {short_repr(block[keys[0]])} is a ${{...}} interpolation, and omegaconf is not "
            f"installed to resolve it; `pip install omegaconf` (or the verl extra), or write the "
            f"value out"
        ) from None
    check_interpolations(root, [(BLOCK_KEY, key) if whole else (key,) for key in keys])
    try:
        config = OmegaConf.create(dict(root))
    except Exception:  # e.g. a value type OmegaConf does not support elsewhere in the file
        try:
            config = OmegaConf.create({BLOCK_KEY: dict(block)} if whole else dict(block))
        except Exception as exc:
            raise ConfigError(f"{first}: cannot resolve ${{...}} interpolations: {_first_line(exc)}") from None
    node = config[BLOCK_KEY] if whole else config
    resolved = dict(block)
    for key in keys:
        try:
            value = node[key]
            resolved[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception as exc:
            raise ConfigError(
                f"{BLOCK_KEY}.{key}: cannot resolve {short_repr(block[key])}: "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from None
    return {**root, BLOCK_KEY: resolved} if whole else resolved


def load_config(source: Any) -> RolloutMockConfig:
    """Build a :class:`RolloutMockConfig` from any of the forms users have at hand.

    ``source`` may be:

    * a :class:`RolloutMockConfig` (returned as is);
    * a path (``str`` or ``PathLike``) to a YAML file: either a whole training config holding a
      ``rollout_mock:`` key, or just the block. It is read with the bounded safe loader of
      :func:`load_yaml_file` (size, alias-expansion and nesting limits);
    * a mapping holding a ``rollout_mock`` key, or the block itself;
    * an OmegaConf ``DictConfig`` of either shape, or a dataclass (ROLL's ``RolloutMockConfig``
      or a pipeline config with a ``rollout_mock`` attribute).

    ``${...}`` interpolations in the block of a YAML file or plain mapping are resolved with
    OmegaConf (against the whole file) when omegaconf is installed, and are otherwise a
    :class:`ConfigError` naming the key; a ``DictConfig`` is resolved by OmegaConf itself.

    When a whole config is given and the block has no ``max_steps``, the top-level
    ``max_steps`` (ROLL's) is used for the mock-mode pre-flight check: it must be an integer then
    (zero or less: no check). The other keys beside the block are the framework's and are not
    checked, except rollout_mock options written there instead of in the block (``mode: mock``
    beside ``rollout_mock:``): a :class:`ConfigError` says to move them under the block.
    Inside the block every unknown or ill-typed key is named in one error.
    """
    if isinstance(source, RolloutMockConfig):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        loaded = load_yaml_file(path, max_bytes=MAX_CONFIG_BYTES, max_nodes=MAX_YAML_NODES)
        if loaded is None:
            raise ConfigError(f"{path}: the file is empty; expected a '{BLOCK_KEY}:' block")
        _check_has_block(loaded, str(path), whole_file=True)
        try:
            return _from_object(loaded, interpolate=True)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if isinstance(source, Mapping):
        _check_has_block(source, "the config")
    return _from_object(source, interpolate=True)


def _check_has_block(source: Any, where: str, *, whole_file: bool = False) -> None:
    """A whole training config without a ``rollout_mock:`` key (or with a misspelt one) is an
    error saying so, not a list of "unknown keys" of a block it never was. A mapping counts as
    the block itself unless one of its keys looks like a misspelt ``rollout_mock`` or most of its
    (two or more) keys are neither block options nor close to one (half of them in a file: a YAML
    file is usually a whole training config)."""
    if not isinstance(source, Mapping) or BLOCK_KEY in source:
        return
    keys = [str(k) for k in source]
    typo = difflib.get_close_matches(BLOCK_KEY, [k[:80] for k in keys], n=1, cutoff=0.8)
    fields = list(RolloutMockConfig.model_fields)
    foreign = [k for k in keys if k not in fields and not difflib.get_close_matches(k[:80], fields, n=1, cutoff=0.75)]
    mostly_foreign = len(foreign) * 2 >= len(keys) if whole_file else len(foreign) * 2 > len(keys)
    if not typo and not (len(keys) >= 2 and mostly_foreign):
        return
    hint = f" (did you mean `{typo[0]}`?)" if typo else ""
    known = [k for k in keys if k in fields]
    if known and len(known) >= len(foreign):  # as much the block itself as not: name what is not an option
        hint += (f" (read as the block itself, {', '.join(k[:80] for k in foreign)} would be "
                 f"{'an unknown key' if len(foreign) == 1 else 'unknown keys'})")
    raise ConfigError(
        f"{where} has no `{BLOCK_KEY}:` block{hint}; add one, e.g. `{BLOCK_KEY}: {{enable: true, mode: dump, "
        f"dump_dir: ./rollout_mock_dumps}}`, or pass the block itself"
    )


def _from_object(source: Any, *, interpolate: bool) -> RolloutMockConfig:
    if isinstance(source, RolloutMockConfig):
        return source
    if _is_dictconfig(source):
        interpolate = False  # OmegaConf resolves its own interpolations in _to_plain
    source = _to_plain(source)
    if not isinstance(source, Mapping):
        block_attr = getattr(source, BLOCK_KEY, None)
        if block_attr is not None:
            return _from_object(block_attr, interpolate=interpolate)
        raise ConfigError(
            f"cannot read a {BLOCK_KEY} config from {type(source).__name__}; pass a YAML path, "
            f"a mapping, an OmegaConf DictConfig or a RolloutMockConfig"
        )
    if BLOCK_KEY in source:
        block = _to_plain(source[BLOCK_KEY])
        if block is None:
            block = {}
        if not isinstance(block, Mapping):
            raise ConfigError(f"{BLOCK_KEY}: expected a mapping of options, got {short_repr(block)}")
        block = dict(block)
        # ROLL's run length, for the mock-mode pre-flight check when the block has none (its
        # ${...} interpolation is resolved like the block's)
        inherited = "max_steps" not in block and source.get("max_steps") is not None
        if inherited:
            block["max_steps"] = source["max_steps"]
        source = {**source, BLOCK_KEY: block}
        if interpolate:
            source = _resolve_interpolations(source)
        block = dict(source[BLOCK_KEY])
        _check_beside(source, block, inherited=inherited)
        return build_config(block)
    return build_config(_resolve_interpolations(source) if interpolate else source)


def _check_beside(root: Mapping[str, Any], block: dict[str, Any], *, inherited: bool) -> None:
    """The keys beside the block in a whole training config. The framework's own keys are not
    ours to judge (a ROLL or verl config has dozens), except two kinds, named with the fix:

    * the top-level ``max_steps`` (ROLL's), read when the block has none (``inherited``; it is in
      ``block`` then): an integer, or the error says so; zero or less means no pre-flight check;
    * a rollout_mock option written beside the block instead of in it (and not set in the block):
      it would be silently ignored.
    """
    problems = []
    if inherited:
        top = block.pop("max_steps")
        if isinstance(top, bool) or not isinstance(top, int):
            problems.append(
                f"max_steps: {short_repr(top, 60)} at the top level is not an integer (rollout_mock reads "
                f"the run's max_steps for its mock-mode pre-flight check when {BLOCK_KEY}.max_steps is "
                f"not set); write the number of steps, e.g. `max_steps: 10`")
        elif top > 0:
            block["max_steps"] = top
    misplaced = [str(k) for k in root if k in RolloutMockConfig.model_fields and k != "max_steps" and k not in block]
    if misplaced:
        names = ", ".join(misplaced)
        problems.append(
            f"{names} {'is a' if len(misplaced) == 1 else 'are'} {BLOCK_KEY} option{'s' * (len(misplaced) > 1)} "
            f"written beside the `{BLOCK_KEY}:` block, where {'it is' if len(misplaced) == 1 else 'they are'} "
            f"not read: move {names} under {BLOCK_KEY}:")
    if problems:
        raise ConfigError("; ".join(problems))


def _is_dictconfig(source: Any) -> bool:
    return type(source).__module__.startswith("omegaconf") and type(source).__name__ == "DictConfig"


# ----------------------------------------------------------------------------- bounded YAML
#: Longest YAML error (or OS error) text quoted in a ConfigError.
_YAML_MESSAGE = 400


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes under ``root`` (itself included) with every alias expanded, counted without
    expanding anything: each distinct node is visited once and its size memoised. Stops counting
    past ``limit`` (returns a value above it). Raises :class:`ValueError` on a recursive alias."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _yaml_children(node))
            sizes[key] = min(total, limit + 1)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ValueError("a recursive alias: a node contains itself")
        on_path.add(key)
        stack.append((node, True))
        for child in _yaml_children(node):
            if id(child) in on_path:
                raise ValueError("a recursive alias: a node contains itself")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _yaml_short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _YAML_MESSAGE else text[: _YAML_MESSAGE - 3] + "..."


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` bytes of the regular file ``path``: opened with ``O_NONBLOCK`` and
    checked with ``fstat`` (a FIFO, ``/dev/zero`` or another device is refused before any read),
    then read up to ``max_bytes + 1`` bytes whatever its size claims (a file growing meanwhile,
    or a special file, never makes the read unbounded). ConfigError when larger."""
    import stat

    from rollout_mock.storage.paths import read_fd

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file (a FIFO, device or directory); a config must be a YAML file")
    data = read_fd(fd, limit=max_bytes)  # (closes fd)
    if len(data) > max_bytes:
        raise ConfigError(f"{path}: more than {max_bytes} bytes is too large for a config file (limit "
                          f"{max_bytes} bytes)")
    return data


def load_yaml_file(path: Path, *, max_bytes: int, max_nodes: int) -> Any:
    """The YAML document in ``path`` as Python objects, within the bounds of the module docstring."""
    try:
        text = _read_bounded(path, max_bytes).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file: {_yaml_short(str(exc))}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            nodes = expanded_size(node, max_nodes)
        except ValueError as exc:
            raise ConfigError(f"{path}: refused: {exc}") from None
        if nodes > max_nodes:
            raise ConfigError(
                f"{path}: refused: its aliases expand to more than {max_nodes} YAML nodes "
                f"(an alias bomb?); write the values out or use fewer nested aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_short(str(exc))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: refused: the YAML is nested too deeply") from None
    finally:
        loader.dispose()
