"""Traces as text and JSONL."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rollout_mock.compare.traces.model import Trace
from rollout_mock.text import fmt_number
from rollout_mock.text import json_default as _json_default

__all__ = ["format_trace", "format_traces", "traces_to_jsonl"]


def _header(trace: Trace) -> str:
    parts = [f"step {trace.step}" if trace.step is not None else None, f"trace {trace.index}", trace.status]
    if trace.reward is not None:
        parts.append(f"reward {fmt_number(trace.reward)}")
    meta = trace.metadata
    if "trajectory" in meta:
        parts.append(f"trajectory {meta['trajectory']}" + (f" row {meta['row']}" if "row" in meta else ""))
    elif "row" in meta:
        parts.append(f"row {meta['row']}")
    if "versions" in meta:
        lo, hi = meta["versions"]
        parts.append(f"versions {lo}" if lo == hi else f"versions {lo}-{hi}")
    if "length" in meta:
        parts.append(f"{meta['length']} tokens")
    return "--- " + " | ".join(p for p in parts if p is not None)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines()) if text else prefix + "(empty)"


def format_trace(trace: Trace) -> str:
    """One trace as text: a header line, its ``fields`` if any, then each message labelled by role."""
    lines = [_header(trace)]
    for key, value in trace.metadata.get("fields", {}).items():
        lines.append(f"  {key}: {value}")
    for message in trace.messages:
        tokens = message.get("tokens")
        count = len(tokens) if isinstance(tokens, list | tuple) else tokens  # slime's messages hold the ids
        label = f"  [{message['role']}]" + (f" ({count} tokens)" if count is not None else "")
        lines += [label, _indent(str(message["content"]))]
    return "\n".join(lines)


def format_traces(traces: Iterable[Trace]) -> str:
    """Readable text blocks, one per trace, separated by blank lines (``""`` for no traces)."""
    return "\n\n".join(format_trace(trace) for trace in traces)


def traces_to_jsonl(traces: Iterable[Trace], step: int | None = None) -> str:
    """One JSON object per line (``step``, ``index``, ``status``, ``reward``, ``messages``,
    ``metadata``), newline-terminated; ``step`` overrides each trace's own. ``""`` for no traces."""
    lines = [
        json.dumps(trace.to_json(step), ensure_ascii=False, allow_nan=False, default=_json_default)
        for trace in traces
    ]
    return "".join(line + "\n" for line in lines)
