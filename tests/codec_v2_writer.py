"""The writer of step files as rollout_mock wrote them before header version 4 (issue 36: moved out
of the package, which no longer writes them): version-2 nodes only, object arrays of at least
``JSON_ITEMS_MIN`` plain items as JSON data chunks (header version 3). Tests use it to check that
old files keep loading."""

from __future__ import annotations

import importlib
import io
import json
import math
from typing import Any

from rollout_mock.codec.format import (
    CHUNK_BYTES,
    CLASS_VERSION,
    FORMAT_VERSION,
    JSON_ITEMS_MIN,
    needs_class_version,
    write_container,
)

_encode = importlib.import_module("rollout_mock.codec.encode")


def _plain_json(node: Any) -> bool:
    """A JSON scalar the header could hold as is: no tagged node, no container."""
    return node is None or type(node) in (str, bool, int) or (type(node) is float and math.isfinite(node))


def move_items(root: Any, chunks: list[tuple[Any, int]]) -> tuple[Any, int]:
    """``root`` with every object array of at least JSON_ITEMS_MIN plain items turned into a
    reference to a JSON data chunk (appended to ``chunks``), and the header version that needs.
    Nodes are copied, never changed in place."""
    moved = 0
    classes = False

    def walk(node: Any) -> Any:
        nonlocal moved, classes
        if type(node) is list:
            return [walk(x) for x in node]
        if type(node) is not dict:
            return node
        if node.get("$") == "objarray" and "items" in node:
            items = node["items"]
            if len(items) >= JSON_ITEMS_MIN and all(_plain_json(x) for x in items):
                # ASCII with \u escapes: json's C encoder is ~2.5x faster, and it escapes lone
                # surrogates, which UTF-8 cannot encode
                text, first = memoryview(json.dumps(items, separators=(",", ":")).encode("ascii")), len(chunks)
                chunks.extend((text[i: i + CHUNK_BYTES], 1) for i in range(0, len(text), CHUNK_BYTES))
                moved += 1
                return {"$": "objarray", "shape": node["shape"], "c": [first, len(chunks) - first]}
        if node.get("$") in ("tensor", "ndarray", "bytes", "bytearray", "pickle"):
            return node
        classes = classes or needs_class_version(node)
        return {k: walk(v) for k, v in node.items()}

    new_root = walk(root)
    return new_root, (CLASS_VERSION if classes else 3 if moved else FORMAT_VERSION)


def encode_v2(obj: Any) -> bytes:
    """``obj`` as a step file of header version 2 or 3 (4 when it uses the structural-class tags)."""
    encoder = _encode._Encoder(snapshot=False)
    root = encoder.plain_node(obj)  # nodes only, no body
    chunks = list(encoder.chunks)
    root, version = move_items(root, chunks)
    buffer = io.BytesIO()
    write_container(root, chunks, buffer, version=version)
    return buffer.getvalue()
