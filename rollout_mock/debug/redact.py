"""Replacing prompt and response text in a batch with placeholders of the same type.

Only fields named as text are touched (token ids are not: they encode the text too, so a dump
with ``--redact`` is safe to share only with people who do not hold the tokenizer, or after
``--keys`` drops the token columns). Names: :data:`TEXT_KEYS`. A string becomes
``"<redacted>"``; chat messages keep their ``role`` and lose their ``content``; lists, tuples,
dicts and object arrays keep their shape. Id-like fields (``uid``, ``index``...) are kept, since
training groups samples by them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rollout_mock.batch import is_dataproto

__all__ = ["PLACEHOLDER", "TEXT_KEYS", "redact", "redact_batch"]

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
        return type(value)({k: v if k in _KEEP_IN_MESSAGES else _scrub(v) for k, v in value.items()}) \
            if type(value) is not dict else {k: v if k in _KEEP_IN_MESSAGES else _scrub(v) for k, v in value.items()}
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


def _mapping(mapping: Mapping[str, Any], keys: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    hit = [k for k in mapping if k in keys]
    return {k: _scrub(v) if k in keys else v for k, v in mapping.items()}, hit


def redact(batch: Any, *, keys: Iterable[str] = TEXT_KEYS) -> tuple[Any, list[str]]:
    """``(redacted copy, names of the fields redacted)``; the input batch is not changed."""
    names = frozenset(keys)
    hits: set[str] = set()
    if isinstance(batch, list):
        out = []
        for item in batch:
            if isinstance(item, Mapping):
                new, hit = _mapping(item, names)
                hits.update(hit)
                out.append(new)
            else:
                out.append(item)
        return out, sorted(hits)
    if isinstance(batch, Mapping) and isinstance(batch.get("samples"), list):
        samples, hit = redact(batch["samples"], keys=names)
        return {**batch, "samples": samples}, hit
    if is_dataproto(batch):
        state = getattr(batch, "__dict__", {})
        others = state["_non_tensor_batch"] if "_non_tensor_batch" in state else (batch.non_tensor_batch or {})
        new_others, hit = _mapping(others, names)
        out = copy.copy(batch)
        if "_non_tensor_batch" in state:
            out.__dict__["_non_tensor_batch"] = new_others
        else:
            out.non_tensor_batch = new_others
        return out, sorted(hit)
    if isinstance(batch, Mapping):
        new, hit = _mapping(batch, names)
        return new, sorted(hit)
    return batch, []


#: The package-level name (``rollout_mock.debug.redact`` is this module).
redact_batch = redact
