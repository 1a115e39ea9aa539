"""The numbers of a recorded batch of any framework, for the report: its numeric columns, its
response tokens' log-probs, and the views that make every shape readable by the trace builders.

* columns (verl's and ROLL's ``DataProto``, dicts, TensorDicts): the batch's numeric columns;
  log-probs (``rollout_log_probs``, ROLL's ``infer_logprobs``, ``old_log_probs``...) under
  ``response_mask``/``loss_mask`` (ROLL's log-probs are token-aligned ``[:, 1:]`` against a
  ``[B, L]`` mask), else under the end of ``attention_mask``;
* lists (AReaL's trajectory dicts of ``[group, L]`` tensors, ``L`` varying; slime's ``Sample``
  dicts with per-token lists): one array per item and key, log-probs per item;
* a batch its framework holds its own way is read as its layout's view makes it
  (:func:`report_view`, :class:`rollout_mock.batch.Layout`: e.g. TRL's generation records as
  columns, slime's eval records as their flat list of samples).

At most :data:`STATS_ROWS` items of a list are looked at (the report reads that many rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import batch_columns as columns_of
from rollout_mock.batch import layout_of, logprob_keys
from rollout_mock.text import to_float

__all__ = ["STATS_ROWS", "items_of", "key_stats", "numeric_columns", "report_view"]

#: Rows of a step read for the report (statistics, the search index and previews).
STATS_ROWS = 2048


def _r(x: float) -> float:
    """``x`` to 6 significant digits: the page shows 4, and float32 noise would only cost bytes."""
    return float(f"{x:.6g}") if math.isfinite(x) else x


def _as_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.is_sparse or value.is_complex():
            return None
        return value.detach().to("cpu", torch.float64).numpy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        with np.errstate(over="ignore"):  # a longdouble beyond float64: inf (counted as such)
            return value.astype(np.float64)
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
        try:  # a list from slime's Sample (token ids, per-token log-probs)
            return np.asarray(value, dtype=np.float64)
        except OverflowError:  # an int beyond float64: ±inf, counted as such
            return np.asarray([to_float(v) for v in value], dtype=np.float64)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return np.asarray([to_float(value)], dtype=np.float64)
    return None


def _dtype(value: Any) -> str:
    if isinstance(value, torch.Tensor | np.ndarray):
        return str(value.dtype).replace("torch.", "")
    first = value[0] if isinstance(value, list | tuple) and value else value
    return type(first).__name__


def _shape(shapes: list[tuple[int, ...]]) -> Any:
    """One array's shape as a list; several (AReaL's trajectories, slime's samples) as text:
    ``"17 × [4, 6..9]"`` (items × the range of each dimension)."""
    if len(shapes) == 1:
        return list(shapes[0])
    dims = {len(s) for s in shapes}
    if len(dims) != 1:
        return f"{len(shapes)} items"
    parts = [str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in
             ((min(s[d] for s in shapes), max(s[d] for s in shapes)) for d in range(dims.pop()))]
    return f"{len(shapes)} × [{', '.join(parts)}]"


def key_stats(arrays: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per numeric key (one array, or a list of arrays: one per trajectory or sample): dtype,
    shape, mean, std, min, max and NaN / inf counts."""
    out = []
    for key in sorted(arrays):
        value = arrays[key]
        items = value if isinstance(value, list) and value and not isinstance(value[0], int | float) else [value]
        parts = [(arr, item) for item in items if (arr := _as_numpy(item)) is not None]
        if not parts:
            continue
        arr = np.concatenate([a.reshape(-1) for a, _ in parts])
        finite = arr[np.isfinite(arr)]
        row: dict[str, Any] = {"key": key, "dtype": _dtype(parts[0][1]), "shape": _shape([a.shape for a, _ in parts]),
                               "nan": int(np.isnan(arr).sum()), "inf": int(np.isinf(arr).sum())}
        with np.errstate(over="ignore", invalid="ignore"):  # std/mean of values near ±1e308: inf, shown as such
            for name, fn in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max)):
                row[name] = _r(float(fn(finite))) if finite.size else None
        out.append(row)
    return out


def _masked(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is not None and mask.shape == values.shape:
        return values[mask > 0]
    if mask is not None and mask.ndim == 2 and mask.shape[0] == values.shape[0] \
            and mask.shape[1] == values.shape[1] + 1:  # ROLL: log-probs token-aligned [:, 1:]
        return values[mask[:, 1:] > 0]
    return values.reshape(-1)


def _token_logprobs(arrays: Mapping[str, Any]) -> np.ndarray | None:
    """The recorded per-token log-probs of the response tokens (masked when a mask fits)."""
    for key in logprob_keys():
        values = _as_numpy(arrays.get(key))
        if values is None or values.ndim != 2:
            continue
        for mask_key in ("response_mask", "loss_mask"):
            mask = _as_numpy(arrays.get(mask_key))
            if mask is not None and mask.shape[:1] == values.shape[:1] and mask.shape[1] - values.shape[1] in (0, 1):
                return _masked(values, mask)
        attention = _as_numpy(arrays.get("attention_mask"))
        if attention is not None and attention.ndim == 2 and attention.shape[0] == values.shape[0] \
                and attention.shape[1] >= values.shape[1]:
            return values[attention[:, -values.shape[1]:] > 0]
        return values.reshape(-1)
    return None


# ----------------------------------------------------------------- framework shapes
def items_of(batch: Any) -> list[Mapping[str, Any]]:
    """The dict items of a list batch (trajectories, samples; flat or in groups)."""
    out: list[Mapping[str, Any]] = []
    for item in batch[:STATS_ROWS] if isinstance(batch, list | tuple) else ():
        for x in item if isinstance(item, list | tuple) else [item]:
            if isinstance(x, Mapping):
                out.append(x)
            elif (columns := columns_of(x)) is not None:  # a TensorDict trajectory: its columns
                out.append(columns)
    return out


def numeric_columns(batch: Any) -> tuple[dict[str, Any], np.ndarray | None]:
    """``({key: array, or one array per item}, the response tokens' log-probs)`` of any batch."""
    from rollout_mock.compare.traces import batch_columns

    arrays, _ = batch_columns(batch)
    if arrays:
        return arrays, _token_logprobs(arrays)
    per_key: dict[str, list[Any]] = {}
    logprobs: list[np.ndarray] = []
    for item in items_of(batch):
        cols = {str(k): (v, arr) for k, v in item.items() if (arr := _as_numpy(v)) is not None}
        for key, (value, _) in cols.items():
            per_key.setdefault(key, []).append(value)
        # a list (slime's per-token lists) as one row, so that its mask lines up with it
        lp = _token_logprobs({k: v if isinstance(v, torch.Tensor | np.ndarray) else arr[None]
                              for k, (v, arr) in cols.items()})
        if lp is not None:
            logprobs.append(lp)
    return per_key, (np.concatenate(logprobs) if logprobs else None)


def report_view(batch: Any) -> tuple[Any, list[str | None] | None]:
    """The batch as the trace builders and :func:`numeric_columns` read it, and each row's text
    when the batch keeps it apart from its tokens: what its framework's layout makes of it
    (:class:`rollout_mock.batch.Layout` ``view``: a generation record as columns, a record of
    samples as its samples), any other batch unchanged."""
    layout = layout_of(batch)
    if layout is None or layout.view is None:
        return batch, None
    return layout.view(batch)
