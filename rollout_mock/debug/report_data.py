"""What the HTML report shows of one recorded step, read with bounded work.

A step is read through :meth:`Dump.load` with ``rows=range(STATS_ROWS)``: at most
:data:`STATS_ROWS` rows are decoded and looked at, whatever the step's header declares, so the
report's memory and time follow the bytes actually read, never a declared row count. From those
rows: distributions (reward, response length, token log-probs) as quantiles, per-key tensor
statistics (mean, std, min, max, NaN/inf counts), GRPO groups by ``uid`` and a few sample
previews (the first rows, the lowest and the highest rewards) with long texts cut.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import count_samples
from rollout_mock.debug.report_page import DEFAULT_MAX_SAMPLES

__all__ = ["DEFAULT_MAX_SAMPLES", "STATS_ROWS", "StepSummary", "summarize_step"]

#: Rows of a step read for the report (statistics and previews).
STATS_ROWS = 2048
#: Characters of one message kept in a preview (the rest is cut, with a note).
PREVIEW_CHARS = 1200
#: Messages of one sample kept in a preview (first and last ones).
PREVIEW_MESSAGES = 16
_LOGPROB_KEYS = ("rollout_log_probs", "old_log_probs", "log_probs", "logprobs", "old_logprob", "ref_log_prob")
#: GRPO groups listed per step in the page.
MAX_GROUPS = 24
_UID_KEYS = ("uid", "group_id", "prompt_id")
_QUANTILES = (("min", 0), ("p10", 10), ("p25", 25), ("median", 50), ("p75", 75), ("p90", 90), ("max", 100))


def _r(x: float) -> float:
    """``x`` to 6 significant digits: the page shows 4, and float32 noise would only cost bytes."""
    return float(f"{x:.6g}") if math.isfinite(x) else x


def quantiles(values: Any) -> dict[str, float] | None:
    """``min``/``p10``/``p25``/``median``/``p75``/``p90``/``max``/``mean`` of the finite values."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    qs = np.percentile(arr, [q for _, q in _QUANTILES])
    out = {name: _r(float(v)) for (name, _), v in zip(_QUANTILES, qs, strict=True)}
    out["mean"] = _r(float(arr.mean()))
    out["n"] = float(arr.size)
    return out


def histogram(values: Any, bins: int = 16) -> dict[str, Any] | None:
    """Counts of the finite values: one bar per distinct value when there are at most ``bins`` of
    them (``values``), else ``bins`` equal-width bins from ``lo`` to ``hi``."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    distinct, counts = np.unique(arr, return_counts=True)
    if distinct.size <= bins:
        return {"values": [_r(float(v)) for v in distinct], "counts": counts.tolist()}
    counts, edges = np.histogram(arr, bins=bins)
    return {"lo": _r(float(edges[0])), "hi": _r(float(edges[-1])), "counts": counts.tolist()}


@dataclass
class StepSummary:
    step: int
    total: int
    """Samples in the step (the manifest's count when more than :data:`STATS_ROWS` rows exist)."""
    read: int
    """Samples looked at (at most :data:`STATS_ROWS` rows' worth)."""
    rejected: int = 0
    capped: bool = False
    """The step has more rows than were read (statistics over the first :data:`STATS_ROWS`)."""
    dist: dict[str, dict[str, float] | None] = field(default_factory=dict)
    hist: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    keys: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, Any] | None = None
    previews: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    """Why the step has no sample previews (a batch of a shape traces cannot be built from)."""

    def to_json(self) -> dict[str, Any]:
        """The page's data for this step (``traces``: the previews, in sample order)."""
        return {"total": self.total, "read": self.read, "capped": self.capped, "rejected": self.rejected,
                "hist": self.hist, "keys": self.keys,
                "groups": self.groups, "traces": self.previews, "note": self.note}


def _as_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.is_sparse or value.is_complex():
            return None
        return value.detach().to("cpu", torch.float64).numpy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.astype(np.float64)
    return None


def key_stats(arrays: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per numeric column: dtype, shape, mean, std, min, max and NaN / inf counts."""
    out = []
    for key, value in sorted(arrays.items()):
        arr = _as_numpy(value)
        if arr is None:
            continue
        finite = arr[np.isfinite(arr)]
        row: dict[str, Any] = {"key": key, "dtype": str(value.dtype).replace("torch.", ""),
                               "shape": list(arr.shape), "nan": int(np.isnan(arr).sum()),
                               "inf": int(np.isinf(arr).sum())}
        for name, fn in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max)):
            row[name] = _r(float(fn(finite))) if finite.size else None
        out.append(row)
    return out


def _token_logprobs(arrays: Mapping[str, Any]) -> np.ndarray | None:
    """The recorded per-token log-probs of the response tokens (masked when a mask fits)."""
    for key in _LOGPROB_KEYS:
        values = _as_numpy(arrays.get(key))
        if values is None or values.ndim != 2:
            continue
        mask = _as_numpy(arrays.get("response_mask"))
        if mask is None or mask.shape != values.shape:
            attention = _as_numpy(arrays.get("attention_mask"))
            mask = None
            if attention is not None and attention.ndim == 2 and attention.shape[0] == values.shape[0] \
                    and attention.shape[1] >= values.shape[1]:
                mask = attention[:, -values.shape[1]:]
        return values[mask > 0] if mask is not None else values.reshape(-1)
    return None


def _length(trace: Any) -> int | None:
    meta = trace.metadata or {}
    if isinstance(meta.get("completion_tokens"), int):
        return int(meta["completion_tokens"])
    tokens = [m.get("tokens") for m in trace.messages if m.get("role") == "assistant"]
    return sum(t for t in tokens if isinstance(t, int)) if tokens else None


def _cut(text: Any) -> Any:
    if not isinstance(text, str) or len(text) <= PREVIEW_CHARS:
        return text
    return f"{text[:PREVIEW_CHARS]}… [cut: {len(text) - PREVIEW_CHARS} more characters]"


def _preview(trace: Any, step: int, why: list[str], uid: Any) -> dict[str, Any]:
    data = trace.to_json(step)
    if isinstance(data.get("reward"), float):
        data["reward"] = _r(data["reward"])
    messages = data["messages"]
    if len(messages) > PREVIEW_MESSAGES:
        keep = PREVIEW_MESSAGES // 2
        gap = {"role": "note", "content": f"[{len(messages) - 2 * keep} messages not shown]", "tokens": None}
        messages = [*messages[:keep], gap, *messages[-keep:]]
    data["messages"] = [{**m, "content": _cut(m.get("content"))} for m in messages]
    data["length"] = _length(trace)
    data["why"] = why
    if uid is not None:
        data["uid"] = str(uid)[:80]
    return data


def _pick(rewards: list[float | None], n_traces: int, max_samples: int) -> dict[int, list[str]]:
    """Which samples to preview: the first ones, then the lowest and the highest rewards."""
    if max_samples <= 0:
        return {}
    if n_traces <= max_samples:
        return {i: [] for i in range(n_traces)}
    chosen: dict[int, list[str]] = {i: ["first"] for i in range(max(1, max_samples // 2))}
    scored = sorted((r, i) for i, r in enumerate(rewards) if r is not None and math.isfinite(r))
    extremes = max(1, (max_samples - len(chosen)) // 2)
    for label, pool in (("lowest reward", scored[:extremes]), ("highest reward", scored[::-1][:extremes])):
        for _, i in pool:
            chosen.setdefault(i, []).append(label)
    for i in range(n_traces):  # slots left (extremes among the first rows): the next rows
        if len(chosen) >= max_samples:
            break
        chosen.setdefault(i, ["first"])
    return chosen


def _groups(uids: list[Any] | None, rewards: list[float | None]) -> dict[str, Any] | None:
    """GRPO groups by uid: how many, how many give one reward to every member (no learning
    signal), and ``table``: ``[uid, size, mean, std]`` of up to :data:`MAX_GROUPS` groups, those
    without signal first."""
    if uids is None:
        return None
    by_uid: dict[str, list[float]] = {}
    for uid, r in zip(uids, rewards, strict=False):
        if r is not None and math.isfinite(r):
            by_uid.setdefault(str(uid)[:80], []).append(r)
    if not by_uid:
        return None
    flat = sum(1 for rs in by_uid.values() if len(rs) > 1 and max(rs) == min(rs))
    sizes = [len(rs) for rs in by_uid.values()]
    table = [[uid, len(rs), _r(float(np.mean(rs))), _r(float(np.std(rs)))] for uid, rs in by_uid.items()]
    table.sort(key=lambda row: (row[3], row[0]))
    return {"groups": len(by_uid), "flat": flat, "flat_fraction": flat / len(by_uid),
            "mean_size": sum(sizes) / len(sizes), "table": table[:MAX_GROUPS]}


def summarize_step(dump: Any, stream: Any, step: int, *, tokenizer: Any = None, max_samples: int = DEFAULT_MAX_SAMPLES,
                   trusted: bool = False) -> StepSummary:
    """Read at most :data:`STATS_ROWS` rows of ``step`` and summarize them for the report."""
    from rollout_mock.compare.traces import batch_columns, batch_traces, count_traces
    from rollout_mock.errors import TraceError

    batch = dump.load(step, stream, rows=range(STATS_ROWS), trusted=trusted)
    note = None
    try:
        read = count_traces(batch) or 0
        traces = batch_traces(batch, max_traces=min(read, STATS_ROWS), tokenizer=tokenizer, step=step)
    except TraceError as exc:  # shown in the page: no previews, the tensor statistics still are
        read, traces, note = 0, [], f"no sample previews: {exc}"
    rows = count_samples(batch)
    total = read or (rows or 0)
    capped = rows is not None and rows >= STATS_ROWS
    if capped:  # maybe more rows on disk than read: the index says how many
        entry = dump.entry(stream, step)
        if entry is not None and isinstance(entry.samples, int) and entry.samples > read:
            total = entry.samples
    ok = [t for t in traces if t.status != "rejected"]
    rewards: list[float | None] = [float(t.reward) if isinstance(t.reward, int | float) and t.status == "ok"
                                   else None for t in traces]
    lengths = [x for t in ok if (x := _length(t)) is not None]
    arrays, others = batch_columns(batch)
    uid_col = next((others[k] for k in _UID_KEYS if isinstance(others.get(k), np.ndarray | list)), None)
    uids = None if uid_col is None or len(uid_col) != len(traces) else list(uid_col)
    if uids is None and traces and all("uid" in t.metadata for t in traces):  # e.g. slime's groups
        uids = [t.metadata["uid"] for t in traces]
    summary = StepSummary(step, total, len(traces), rejected=len(traces) - len(ok), capped=capped, note=note)
    values: dict[str, Any] = {"reward": [r for r in rewards if r is not None], "length": lengths}
    logprobs = _token_logprobs(arrays)
    if logprobs is not None:
        values["logprob"] = logprobs
    summary.dist = {name: quantiles(v) for name, v in values.items()}
    summary.hist = {name: histogram(v) for name, v in values.items()}
    summary.keys = key_stats(arrays)
    summary.groups = _groups(uids, rewards)
    picked = _pick(rewards, len(traces), max_samples)
    summary.previews = [_preview(traces[i], step, why, None if uids is None else uids[i])
                        for i, why in sorted(picked.items())]
    return summary
