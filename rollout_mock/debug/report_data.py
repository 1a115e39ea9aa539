"""What the HTML report shows of one recorded step, read with bounded work.

A step is read through :meth:`Dump.load` with ``rows=range(STATS_ROWS)``: at most
:data:`STATS_ROWS` rows are decoded and looked at, whatever the step's header declares, so the
report's memory and time follow the bytes actually read, never a declared row count. From those
rows: distributions (reward, response length, token log-probs) as quantiles, per-key tensor
statistics (mean, std, min, max, NaN/inf counts), GRPO groups, a compact index of every sample
read (reward, length, group, status and the start of its text: what the page's search covers)
and a few full previews (the first rows, the lowest and the highest rewards), long texts cut.

Every framework's batch gives all of it (:mod:`~rollout_mock.debug.report_columns`): verl's and
ROLL's columns, AReaL's trajectories (a group each), slime's ``Sample`` groups, TRL's generation
records (groups: runs of one prompt; the completion texts shown without a tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rollout_mock.batch import count_samples
from rollout_mock.debug.report_columns import STATS_ROWS, _r, key_stats, numeric_columns, report_view
from rollout_mock.text import to_float

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.storage import Dump, StreamId

__all__ = ["DEFAULT_MAX_SAMPLES", "SNIPPET_CHARS", "STATS_ROWS", "StepSummary", "summarize_step"]

#: Sample previews per step in the page (the first ones, the lowest and the highest rewards).
DEFAULT_MAX_SAMPLES = 12
#: Characters of one message kept in a preview (the rest is cut, with a note).
PREVIEW_CHARS = 1200
#: Messages of one sample kept in a preview (first and last ones).
PREVIEW_MESSAGES = 16
#: Most characters of a sample's text in the search index (fewer when a step has many samples:
#: see ``text_chars`` of :func:`summarize_step`).
SNIPPET_CHARS = 160
#: GRPO groups listed per step in the page.
MAX_GROUPS = 24
_UID_KEYS = ("uid", "group_id", "group_ids", "prompt_id", "prompt_ids")
_QUANTILES = (("min", 0), ("p10", 10), ("p25", 25), ("median", 50), ("p75", 75), ("p90", 90), ("max", 100))


def _finite(values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    return arr[np.isfinite(arr)]


def quantiles(values: Any) -> dict[str, float] | None:
    """``min``/``p10``/``p25``/``median``/``p75``/``p90``/``max``/``mean`` of the finite values."""
    arr = _finite(values)
    if arr.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # ±1e308: interpolations and the mean overflow (inf, nan)
        qs = np.percentile(arr, [q for _, q in _QUANTILES])
        mean = float(arr.mean())
    out = {name: _r(float(v)) for (name, _), v in zip(_QUANTILES, qs, strict=True)}
    out["mean"] = _r(mean)
    out["n"] = float(arr.size)
    return out


def histogram(values: Any, bins: int = 16) -> dict[str, Any] | None:
    """Counts of the finite values: one bar per distinct value when there are at most ``bins`` of
    them (``values``), else ``bins`` equal-width bins from ``lo`` to ``hi``."""
    arr = _finite(values)
    if arr.size == 0:
        return None
    distinct, counts = np.unique(arr, return_counts=True)
    if distinct.size <= bins:
        return {"values": [_r(float(v)) for v in distinct], "counts": counts.tolist()}
    lo, hi = float(arr.min()), float(arr.max())
    with np.errstate(over="ignore"):
        span_overflows = not math.isfinite(hi - lo)
    counts, _ = np.histogram(arr / 2 if span_overflows else arr, bins=bins)  # -1e308 .. 1e308: binned halved
    return {"lo": _r(lo), "hi": _r(hi), "counts": counts.tolist()}


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
    rows: dict[str, Any] | None = None
    """The search index of every sample read (see :func:`sample_index`)."""
    note: str | None = None
    """Why the step has no sample previews (a batch of a shape traces cannot be built from)."""
    error: str | None = None
    """Why the step could not be read at all (a truncated or corrupt file): nothing else is set."""

    def to_json(self) -> dict[str, Any]:
        """The page's data for this step (``traces``: the previews, in sample order; ``rows``:
        the search index)."""
        return {"total": self.total, "read": self.read, "capped": self.capped, "rejected": self.rejected,
                "hist": self.hist, "keys": self.keys, "groups": self.groups, "traces": self.previews,
                "rows": self.rows, "note": self.note, "error": self.error}


# ----------------------------------------------------------------- samples
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


def _snippet(trace: Any, chars: int) -> str:
    """The start of a sample's text for the search index: its response first, then the rest."""
    messages = trace.messages
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    parts = ([last] if last is not None else []) + [m for m in messages if m is not last]
    text = " | ".join(str(m.get("content"))[:chars] for m in parts)
    return text[:chars]


def sample_index(traces: list[Any], rewards: list[float | None], uids: list[Any] | None, chars: int) -> dict[str, Any]:
    """Every sample read, compactly, for the page's search and list: ``n``; per sample ``r``
    (reward), ``len`` (response tokens), ``u`` (index into ``uids``, the group names), ``st``
    (``o`` ok / ``r`` rejected, one character each) and ``t`` (the first ``chars`` characters of
    its text; ``None`` when ``chars`` is under 8: the search then covers numbers and groups)."""
    table: dict[str, int] = {}
    return {"n": len(traces),
            "r": [None if r is None or not math.isfinite(r) else _r(r) for r in rewards],
            "len": [_length(t) for t in traces],
            "u": None if uids is None else [table.setdefault(str(u)[:80], len(table)) for u in uids],
            "uids": list(table),
            "st": "".join("r" if t.status == "rejected" else "o" for t in traces),
            "t": [_snippet(t, chars) for t in traces] if chars >= 8 else None}


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
    with np.errstate(over="ignore", invalid="ignore"):
        table = [[uid, len(rs), _r(float(np.mean(rs))), _r(float(np.std(rs)))] for uid, rs in by_uid.items()]
    table.sort(key=lambda row: (row[3], row[0]))
    return {"groups": len(by_uid), "flat": flat, "flat_fraction": flat / len(by_uid),
            "mean_size": sum(sizes) / len(sizes), "table": table[:MAX_GROUPS]}


def _uids(view: Any, traces: list[Any]) -> list[Any] | None:
    """The GRPO group of each trace: a ``uid``-like column, else its trace's ``uid`` or ``trajectory``."""
    from rollout_mock.compare.traces import batch_columns

    arrays, others = batch_columns(view)
    for source in (others, arrays):
        for key in _UID_KEYS:
            col = source.get(key)
            if isinstance(col, torch.Tensor) and col.ndim == 1:
                col = col.tolist()
            if isinstance(col, np.ndarray | list) and len(col) == len(traces):
                return list(col)
    for key in ("uid", "trajectory"):  # a group a layout's reader names (samples of one prompt), a trajectory
        if traces and all(key in t.metadata for t in traces):
            return [t.metadata[key] for t in traces]
    return None


def summarize_step(dump: Dump, stream: StreamId, step: int, *, tokenizer: Any = None,
                   max_samples: int = DEFAULT_MAX_SAMPLES, trusted: bool = False, text_chars: int = 0) -> StepSummary:
    """Read at most :data:`STATS_ROWS` rows of ``step`` and summarize them for the report.

    ``max_samples``: full previews kept; ``text_chars``: characters of text per step for the
    search index (shared among its samples, at most :data:`SNIPPET_CHARS` each; 0: no index)."""
    from rollout_mock.compare.traces import batch_traces, count_traces
    from rollout_mock.errors import TraceError

    batch = dump.load(step, stream, rows=range(STATS_ROWS), trusted=trusted)
    view, texts = report_view(batch)
    note = None
    try:
        read = count_traces(view) or 0
        traces = batch_traces(view, max_traces=min(read, STATS_ROWS), tokenizer=tokenizer, step=step)
    except TraceError as exc:  # shown in the page: no previews, the tensor statistics still are
        read, traces, note = 0, [], f"no sample previews: {exc}"
    if texts is not None and tokenizer is None:  # texts kept apart from the ids (a generation record's)
        for trace, text in zip(traces, texts, strict=False):
            last = next((m for m in reversed(trace.messages) if m.get("role") == "assistant"), None)
            if last is not None and text is not None:
                last["content"] = text
    rows = count_samples(view)
    total = read or (rows or 0)
    capped = rows is not None and rows >= STATS_ROWS
    if capped:  # maybe more rows on disk than read: the index says how many
        entry = dump.entry(stream, step)
        if entry is not None and isinstance(entry.samples, int) and entry.samples > read:
            total = entry.samples
    ok = [t for t in traces if t.status != "rejected"]
    rewards: list[float | None] = [to_float(t.reward) if t.status == "ok" else None for t in traces]
    lengths = [x for t in ok if (x := _length(t)) is not None]
    uids = _uids(view, traces)
    summary = StepSummary(step, total, len(traces), rejected=len(traces) - len(ok), capped=capped, note=note)
    arrays, logprobs = numeric_columns(view)
    values: dict[str, Any] = {"reward": [r for r in rewards if r is not None], "length": lengths}
    if logprobs is not None:
        values["logprob"] = logprobs
    summary.dist = {name: quantiles(v) for name, v in values.items()}
    summary.hist = {name: histogram(v) for name, v in values.items()}
    summary.keys = key_stats(arrays)
    summary.groups = _groups(uids, rewards)
    if text_chars > 0 and traces:
        summary.rows = sample_index(traces, rewards, uids, min(SNIPPET_CHARS, text_chars // len(traces)))
    picked = _pick(rewards, len(traces), max_samples)
    summary.previews = [_preview(traces[i], step, why, None if uids is None else uids[i])
                        for i, why in sorted(picked.items())]
    return summary
