"""Token rows to messages: prompt/response columns and input_ids with masks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout_mock.compare.traces.messages import _Renderer, _role_runs
from rollout_mock.compare.traces.model import _TOKEN_KEYS, _rows_of

__all__ = []


@dataclass
class _Columns:
    """The token columns of a batch for the rows that will be shown, as Python lists."""

    rows: dict[str, list[Any]]

    @classmethod
    def of(cls, tensors: Mapping[str, Any], n: int) -> _Columns:
        return cls({k: _rows_of(tensors[k], n) for k in _TOKEN_KEYS if tensors.get(k) is not None})

    def get(self, key: str, row: int) -> list[Any] | None:
        column = self.rows.get(key)
        return None if column is None else column[row]


def _aligned(mask: list[Any] | None, length: int) -> list[int] | None:
    """A mask aligned to a sequence of ``length``: a shorter one (verl's ``response_mask`` against
    ``input_ids``) covers the end, the rest reads 0; a longer one is cut."""
    if mask is None:
        return None
    flags = [1 if m else 0 for m in mask[:length]]
    return [0] * (length - len(flags)) + flags


def _prompt_response_runs(cols: _Columns, row: int) -> tuple[list[tuple[str, list[int]]], list[int]]:
    """verl's ``prompts`` [P] + ``responses`` [R]: the prompt is one user run, the response splits
    by ``response_mask`` (1 assistant, 0 tool; [R], or [P+R] as ROLL records it); ``attention_mask``
    [P+R] drops padding. Without ``prompts``, the prompt is what ``input_ids`` (= prompts +
    responses) holds before the response."""
    response = cols.get("responses", row) or []
    prompt = cols.get("prompts", row)
    if prompt is None:
        ids = cols.get("input_ids", row) or []
        prompt = ids[: len(ids) - len(response)] if len(ids) > len(response) else []
    attention = _aligned(cols.get("attention_mask", row), len(prompt) + len(response))
    if attention is None:
        attention = [1] * (len(prompt) + len(response))
    prompt_ids = [t for t, a in zip(prompt, attention) if a]
    response_attention = attention[len(prompt):]
    response_mask = cols.get("response_mask", row)
    if response_mask is not None and prompt and len(response_mask) == len(prompt) + len(response):
        response_mask = response_mask[len(prompt):]  # ROLL: a response_mask over the whole sequence
    mask = _aligned(response_mask, len(response)) or response_attention
    kept = [(t, m) for t, a, m in zip(response, response_attention, mask) if a]
    runs: list[tuple[str, list[int]]] = [("user", prompt_ids)] if prompt_ids else []
    runs += _role_runs([t for t, _ in kept], [m for _, m in kept], prompt_done=True)
    return runs, []


def _input_ids_runs(cols: _Columns, row: int) -> tuple[list[tuple[str, list[int]]], list[int]]:
    """``input_ids`` [L] with ``loss_mask`` (or ``response_mask``, else ``versions >= 0``) for roles
    and ``attention_mask`` for the valid tokens. Without any of the role masks the whole sequence
    is one user run. Also returns the versions of the valid generated tokens."""
    ids = cols.get("input_ids", row) or []
    attention = _aligned(cols.get("attention_mask", row), len(ids)) or [1] * len(ids)
    versions = cols.get("versions", row)
    mask = _aligned(cols.get("loss_mask", row), len(ids)) or _aligned(cols.get("response_mask", row), len(ids))
    if mask is None and versions is not None:
        mask = [1 if v >= 0 else 0 for v in versions[: len(ids)]]
    if mask is None:
        mask = [0] * len(ids)
    valid = [i for i, a in enumerate(attention) if a]
    runs = _role_runs([ids[i] for i in valid], [mask[i] for i in valid], prompt_done=False)
    gen_versions = [] if versions is None else [versions[i] for i in valid if mask[i] and versions[i] >= 0]
    return runs, gen_versions


def _token_messages(cols: _Columns, row: int, renderer: _Renderer) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages and length metadata of one row (``[]``, ``{}`` when the batch has no token ids)."""
    if "prompts" in cols.rows or "responses" in cols.rows:
        runs, versions = _prompt_response_runs(cols, row)
    elif "input_ids" in cols.rows:
        runs, versions = _input_ids_runs(cols, row)
    else:
        return [], {}
    messages = [{"role": role, "content": renderer.content(ids), "tokens": len(ids)} for role, ids in runs]
    meta: dict[str, Any] = {
        "length": sum(len(ids) for _, ids in runs),
        "prompt_tokens": len(runs[0][1]) if runs and runs[0][0] == "user" else 0,
        "completion_tokens": sum(len(ids) for role, ids in runs if role == "assistant"),
    }
    if versions:
        meta["versions"] = [min(versions), max(versions)]
    return messages, meta
