"""Rewards and text fields of a batch row."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rollout_mock.batch import type_name
from rollout_mock.compare.traces.model import (
    _REWARD_KEYS,
    _SCORE_KEYS,
    _TEXT_PROMPT_KEYS,
    MAX_FIELD_CHARS,
    _rows_of,
)
from rollout_mock.text import json_default as _json_default
from rollout_mock.text import jsonable, to_float

__all__ = []


def _to_float(value: Any) -> float | None:
    """A reward cell -> float: a number, a 1-element list, or a list summed (token-level); an int
    beyond float64 is ``±inf`` and anything else ``None`` (:func:`~rollout_mock.text.to_float`)."""
    if isinstance(value, list | tuple | np.ndarray):
        try:
            flat = np.asarray(value, dtype=float).reshape(-1)
        except (TypeError, ValueError, OverflowError):  # ragged, huge ints, text: cell by cell
            flat = np.asarray([to_float(v) for v in np.asarray(value, dtype=object).reshape(-1)], dtype=float)
        return float(flat.sum()) if flat.size else None
    return to_float(value)


def _reward_column(tensors: Mapping[str, Any], others: Mapping[str, Any], n: int) -> list[float | None]:
    """Per-row rewards: token-level scores summed over the response, else a per-row reward key."""
    for key in _SCORE_KEYS + _REWARD_KEYS:
        for source in (tensors, others):
            value = source.get(key)
            if value is not None and not isinstance(value, str | Mapping):
                return [_to_float(v) for v in _rows_of(value, n)]
    return [None] * n


def _short(value: Any) -> Any:
    """A ``non_tensor_batch`` cell for metadata: scalars as-is, long strings cut, big objects summarised."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):  # an int past JSON's and str()'s limits: its digit count
        return jsonable(value)
    if isinstance(value, str):
        extra = len(value) - MAX_FIELD_CHARS
        return value if extra <= 0 else f"{value[:MAX_FIELD_CHARS]}... (+{extra} chars)"
    if isinstance(value, np.ndarray):
        value = value.tolist()
    try:
        text = json.dumps(value, default=_json_default, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= MAX_FIELD_CHARS:
        return json.loads(text) if text[:1] in "[{" else value
    size = f" with {len(value)} items" if hasattr(value, "__len__") else ""
    return f"<{type_name(value)}{size}>"


def _text_columns(others: Mapping[str, Any], n: int) -> tuple[list[Any] | None, dict[str, list[Any]]]:
    """(the prompt text column, the other per-row fields) of the first ``n`` rows."""
    prompt: list[Any] | None = None
    fields: dict[str, list[Any]] = {}
    for key, value in others.items():
        if not isinstance(value, np.ndarray | list | tuple) or len(value) < n:
            continue
        if prompt is None and key in _TEXT_PROMPT_KEYS:
            prompt = _rows_of(value, n)
        elif key not in _REWARD_KEYS:
            fields[key] = _rows_of(value, n)
    return prompt, fields


# --------------------------------------------------------------------------------------------
