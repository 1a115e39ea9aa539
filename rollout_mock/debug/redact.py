"""Replacing prompt and response text in a batch with placeholders of the same type.

Only fields named as text are touched (token ids are not: they encode the text too, so a dump
with ``--redact`` is safe to share only with people who do not hold the tokenizer, or after
``--keys`` drops the token columns). Names: :data:`TEXT_KEYS`. A string becomes
``"<redacted>"``; chat messages keep their ``role`` and lose their ``content``; lists, tuples,
dicts and object arrays keep their shape. Id-like fields (``uid``, ``index``...) are kept, since
training groups samples by them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from rollout_mock.batch import batch_parts, batch_type_of, rebuild

__all__ = ["PLACEHOLDER", "TEXT_KEYS", "redact", "redact_batch", "redact_call"]

PLACEHOLDER = "<redacted>"
#: Field names holding prompt/response text: verl/ROLL non-tensor keys, slime Sample fields.
TEXT_KEYS: frozenset[str] = frozenset({
    "raw_prompt", "raw_prompt_ids_text", "messages", "prompt", "prompts_text", "prompt_text", "response",
    "responses_text", "response_text", "raw_response", "completion", "text", "label", "ground_truth",
    "multi_modal_data", "tools_kwargs", "extra_info",
})
_KEEP_IN_MESSAGES = frozenset({"role", "name", "type", "tool_call_id"})


def _scrub(value: Any) -> Any:
    """``value`` with every string replaced, containers rebuilt with the same type."""
    if isinstance(value, str):
        return PLACEHOLDER
    if isinstance(value, bytes):
        return PLACEHOLDER.encode()
    if isinstance(value, Mapping):
        return _rebuild(value, {k: v if k in _KEEP_IN_MESSAGES else _scrub(v) for k, v in value.items()})
    if isinstance(value, np.ndarray) and value.dtype == object:
        out = np.empty(value.shape, dtype=object)
        for idx, item in np.ndenumerate(value):
            out[idx] = _scrub(item)
        return out
    if isinstance(value, np.ndarray) and value.dtype.kind in "US":
        return np.full(value.shape, PLACEHOLDER, dtype=value.dtype.kind + str(max(len(PLACEHOLDER), value.itemsize)))
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_scrub(v) for v in value)
    return value


#: Containers nested deeper than this are left as they are (a decoded batch is bounded anyway).
_MAX_DEPTH = 64


def _rebuild(value: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if type(value) is dict:
        return items
    try:
        return cast(Any, type(value))(items)
    except (TypeError, ValueError):  # a mapping type not built from a dict: a plain dict keeps the data
        return items


def _walk(value: Any, names: frozenset[str], hits: set[str], depth: int) -> Any:
    """``value`` with every value under a text key scrubbed, at any depth of dicts, lists,
    tuples, object arrays and the parts of a batch type that can be rebuilt (a DataProto's
    ``non_tensor_batch`` and ``meta_info``: :func:`rollout_mock.batch.batch_parts`); slime
    records nest samples in groups. What holds no text key is returned as it is (not copied)."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        items = {}
        for key, item in value.items():
            if isinstance(key, str) and key in names:
                hits.add(key)
                items[key] = _scrub(item)
            else:
                items[key] = _walk(item, names, hits, depth + 1)
        return _rebuild(value, items) if _changed(value.values(), items.values(), value, names) else value
    if isinstance(value, list):
        out = [_walk(v, names, hits, depth + 1) for v in value]
        return out if _changed(value, out) else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        items_ = tuple(_walk(v, names, hits, depth + 1) for v in value)
        return items_ if _changed(value, items_) else value
    if isinstance(value, np.ndarray) and value.dtype == object:
        array = np.empty(value.shape, dtype=object)
        for idx, item in np.ndenumerate(value):
            array[idx] = _walk(item, names, hits, depth + 1)
        return array if _changed(value.reshape(-1), array.reshape(-1)) else value
    kind = batch_type_of(value)
    if kind is not None and kind.rebuild is not None:
        parts = batch_parts(value) or {}
        new_parts = {name: _walk(part, names, hits, depth + 1) for name, part in parts.items()}
        changed = {name: part for name, part in new_parts.items() if part is not parts[name]}
        return rebuild(value, changed) if changed else value
    return value


def _changed(before: Iterable[Any], after: Iterable[Any], mapping: Any = None,
             names: frozenset[str] = frozenset()) -> bool:
    """Whether any item was replaced (a scrubbed text key always counts)."""
    if mapping is not None and any(isinstance(k, str) and k in names for k in mapping.keys()):
        return True
    return any(a is not b for a, b in zip(before, after))


def redact(batch: Any, *, keys: Iterable[str] = TEXT_KEYS) -> tuple[Any, list[str]]:
    """``(redacted batch, names of the fields redacted)``; the input batch is not changed (what holds
    no text is shared, not copied).

    Fields named in ``keys`` are scrubbed wherever they are: at the top of a dict batch, in the
    non-tensor columns and ``meta_info`` of a DataProto, in the items of an AReaL list, inside
    slime records (samples grouped in lists, evaluation data per dataset), at any depth."""
    hits: set[str] = set()
    return _walk(batch, frozenset(keys), hits, 0), sorted(hits)


def redact_call(call: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A recorded call summary (``{"args": [...], "kwargs": {...}}``, stored in manifest.json and
    the index) with **every** string replaced: positional arguments have no name to tell a
    prompt from a mode, and a call summary only serves a warning in mock mode."""
    if call is None:
        return None
    return {name: _strings(value, 0) for name, value in call.items()}


def _strings(value: Any, depth: int) -> Any:
    """JSON-like ``value`` with every string (mapping keys below the top level included) replaced."""
    if isinstance(value, str):
        return PLACEHOLDER
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        # top-level keys are parameter names (kept); deeper string keys may be text themselves
        return {k if depth == 0 or not isinstance(k, str) else f"{PLACEHOLDER}{i}": _strings(v, depth + 1)
                for i, (k, v) in enumerate(value.items())}
    if isinstance(value, list | tuple):
        return [_strings(v, depth + 1) for v in value]
    return value


#: The package-level name (``rollout_mock.debug.redact`` is this module).
redact_batch = redact
