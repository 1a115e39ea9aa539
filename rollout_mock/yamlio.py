"""Bounded, safe YAML loading for configuration files.

``yaml.safe_load`` builds shared objects for aliases, so a "billion laughs" document (nested
anchors, each alias repeated) loads in milliseconds from a few hundred bytes; the cost comes later,
from whatever walks the result as a tree (validation, ``repr`` in an error message, OmegaConf's
copy). :func:`load_yaml_file` therefore composes the node graph first and, before any Python
object is built, refuses:

* files over ``max_bytes``;
* documents whose node count, with every alias expanded, exceeds ``max_nodes``;
* recursive aliases (a node that contains itself) and nesting too deep for the parser.

Every refusal is a :class:`~rollout_mock.errors.ConfigError` with a one-line message; YAML syntax
errors are reported cut to a few hundred characters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from rollout_mock.errors import ConfigError

__all__ = ["expanded_size", "load_yaml_file"]

_MAX_MESSAGE = 400


def _children(node: yaml.Node) -> list[yaml.Node]:
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
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, limit + 1)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ValueError("a recursive alias: a node contains itself")
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise ValueError("a recursive alias: a node contains itself")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` bytes of the regular file ``path``: opened with ``O_NONBLOCK`` and
    checked with ``fstat`` (a FIFO, ``/dev/zero`` or another device is refused before any read),
    then read up to ``max_bytes + 1`` bytes whatever its size claims (a file growing meanwhile,
    or a special file, never makes the read unbounded). ConfigError when larger."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file (a FIFO, device or directory); a config must be a "
                              f"YAML file")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > max_bytes:
        raise ConfigError(f"{path}: more than {max_bytes} bytes is too large for a config file (limit "
                          f"{max_bytes} bytes)")
    return b"".join(chunks)


def load_yaml_file(path: Path, *, max_bytes: int, max_nodes: int) -> Any:
    """The YAML document in ``path`` as Python objects, within the bounds of the module docstring."""
    try:
        text = _read_bounded(path, max_bytes).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file: {_short(str(exc))}") from None
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
        raise ConfigError(f"{path}: not valid YAML: {_short(str(exc))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: refused: the YAML is nested too deeply") from None
    finally:
        loader.dispose()
