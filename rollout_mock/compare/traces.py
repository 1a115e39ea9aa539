"""Human-readable traces of a recorded rollout batch: who said what, with which reward.

:func:`batch_traces` reads any batch shape (DataProto-like, columns, lists of trajectory dicts)
into :class:`Trace` objects; a framework that holds its batches its own way (samples, generation
records) registers a reader (:class:`rollout_mock.batch.Layout`, by its adapter), and this module
names no framework. :func:`format_traces` and :func:`traces_to_jsonl` render the traces.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rollout_mock.batch import batch_columns as batch_columns_of
from rollout_mock.batch import batch_type_of, layout_of, type_name
from rollout_mock.compare.trace_rows import (
    Renderer,
    Tokenizer,
    _chat_messages,
    _Columns,
    _n_rows,
    _promote_single_sequence,
    _reward_column,
    _short,
    _split_mapping,
    _structured_message,
    _text_columns,
    _token_messages,
)
from rollout_mock.errors import TraceError
from rollout_mock.text import fmt_number, jsonable
from rollout_mock.text import json_default as _json_default

__all__ = [
    "DEFAULT_MAX_TRACES", "Trace", "batch_columns", "batch_traces", "count_traces", "format_trace",
    "format_traces", "traces_to_jsonl",
]

#: AReaL's ``max_rollout_traces_per_step`` default.
DEFAULT_MAX_TRACES = 32


@dataclass
class Trace:
    """One sequence of a batch, readable.

    ``index`` is the trace's position among the batch's traces (a rejected trajectory takes one
    position). ``messages`` are ``{"role", "content", "tokens"}`` dicts; ``tokens`` is ``None``
    when only text is known (chat messages from ``non_tensor_batch``, structured ``messages``
    without token ids). ``reward`` is ``None`` when the batch has none, and for rejected traces.
    """

    index: int
    status: Literal["ok", "rejected"]
    reward: float | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    step: int | None = None

    def to_json(self, step: int | None = None) -> dict[str, Any]:
        """A JSON-ready dict; a non-finite reward becomes the string ``"nan"``/``"inf"``/``"-inf"``."""
        return jsonable({
            "step": self.step if step is None else step,
            "index": self.index,
            "status": self.status,
            "reward": self.reward,
            "messages": self.messages,
            "metadata": self.metadata,
        })


# --------------------------------------------------------------------------- building
def _columnar_traces(
    tensors: Mapping[str, Any],
    others: Mapping[str, Any],
    *,
    limit: int,
    start: int,
    renderer: Renderer,
    base: Mapping[str, Any],
) -> list[Trace]:
    """Traces of a columnar batch (dict of tensors, DataProto, one AReaL trajectory), at most ``limit``."""
    n = min(_n_rows(tensors, others), limit)
    cols = _Columns.of(tensors, n)
    rewards = _reward_column(tensors, others, n)
    prompts, fields = _text_columns(others, n)
    traces = []
    for row in range(n):
        messages, meta = _token_messages(cols, row, renderer)
        chat = None if prompts is None else _chat_messages(prompts[row], renderer)
        if chat is not None:
            messages = chat + (messages[1:] if messages and messages[0]["role"] == "user" else messages)
        metadata = {**base, "row": row, **meta}
        if fields:
            metadata["fields"] = {k: _short(v[row]) for k, v in fields.items()}
        traces.append(Trace(start + row, "ok", rewards[row], messages, metadata))
    return traces


def _structured_traces(
    item: Mapping[str, Any], *, limit: int, start: int, renderer: Renderer, base: Mapping[str, Any]
) -> list[Trace]:
    """An AReaL item with ``messages``: one conversation (list of dicts) or one per row (list of lists)."""
    conversations = item["messages"]
    if isinstance(conversations, np.ndarray):
        conversations = conversations.tolist()
    if not isinstance(conversations, list | tuple):
        conversations = [[conversations]]
    elif not conversations or isinstance(conversations[0], Mapping):
        conversations = [conversations]
    n = min(len(conversations), limit)
    tensors, others = _split_mapping(item)
    rewards = _reward_column(tensors, others, n)
    return [
        Trace(start + row, "ok", rewards[row],
              [_structured_message(m, renderer) for m in _messages(conversations[row])], {**base, "row": row})
        for row in range(n)
    ]


def _messages(conversation: Any) -> list[Any]:
    """One row's messages: a list (an array), or one message (a damaged row: a string, a number)."""
    if isinstance(conversation, np.ndarray):
        return conversation.reshape(-1).tolist()
    return list(conversation) if isinstance(conversation, list | tuple) else [conversation]


def _list_traces(batch: Sequence[Any], *, limit: int, renderer: Renderer) -> list[Trace]:
    """AReaL's list of trajectories; ``None`` items are rejected traces (they count toward ``limit``)."""
    traces: list[Trace] = []
    for i, item in enumerate(batch):
        left = limit - len(traces)
        if left <= 0:
            break
        base = {"trajectory": i}
        if item is None:
            traces.append(Trace(len(traces), "rejected", None, [], base))
        elif (columns := batch_columns_of(item)) is not None:
            traces += _item_traces(columns, limit=left, start=len(traces), renderer=renderer, base=base)
        else:
            raise TraceError(f"trajectory {i} is a {type_name(item)}: expected a dict of tensors or None")
    return traces


def _item_traces(item: dict[str, Any], *, limit: int, start: int, renderer: Renderer,
                 base: Mapping[str, Any]) -> list[Trace]:
    """One trajectory (or a dict of columns): structured ``messages``, else token columns."""
    if "messages" in item:
        return _structured_traces(item, limit=limit, start=start, renderer=renderer, base=base)
    tensors, others = _split_mapping(_promote_single_sequence(item))
    return _columnar_traces(tensors, others, limit=limit, start=start, renderer=renderer, base=base)


def _has_parts(batch: Any) -> bool:
    """A batch whose columns come from named parts (a DataProto's tensors and non-tensor
    columns): its columns are its rows as they are, never one trajectory."""
    kind = batch_type_of(batch)
    return kind is not None and kind.parts is not None


def batch_columns(batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numeric array columns, other columns) of a columnar batch (DataProto-like, dict,
    TensorDict: :func:`rollout_mock.batch.batch_columns`), as the traces read them; two empty
    dicts for any other batch."""
    columns = batch_columns_of(batch)
    return ({}, {}) if columns is None else _split_mapping(columns)


def batch_traces(
    batch: Any,
    *,
    max_traces: int = DEFAULT_MAX_TRACES,
    tokenizer: Tokenizer | None = None,
    step: int | None = None,
) -> list[Trace]:
    """Up to ``max_traces`` readable traces of one recorded batch (see the module docstring).

    Edge cases: an empty batch gives ``[]``; rejected (``None``) trajectories are kept as
    ``status="rejected"`` traces and count toward the cap; rows beyond the cap are never copied
    off the device. A batch of no known shape (or a list item that is neither a dict nor None)
    raises :class:`TraceError`, as does a negative ``max_traces``.
    """
    if max_traces < 0:
        raise TraceError(f"max_traces must be >= 0, got {max_traces}")
    renderer = Renderer(tokenizer)
    layout = layout_of(batch)
    if layout is not None and layout.traces is not None:  # a framework's own shape (its adapter reads it)
        traces = list(layout.traces(batch, max_traces, renderer))
    elif isinstance(batch, list | tuple):
        traces = _list_traces(batch, limit=max_traces, renderer=renderer)
    elif (columns := batch_columns_of(batch)) is not None and _has_parts(batch):
        tensors, others = _split_mapping(columns)
        traces = _columnar_traces(tensors, others, limit=max_traces, start=0, renderer=renderer, base={})
    elif columns is not None:
        traces = _item_traces(columns, limit=max_traces, start=0, renderer=renderer, base={})
    else:
        raise TraceError(
            f"cannot build traces from a {type_name(batch)}: expected a list of trajectory dicts, a batch "
            f"with columns (rollout_mock.batch.batch_columns), a dict of "
            f"tensors with input_ids or prompts/responses, or a batch of a registered layout "
            f"(rollout_mock.batch.register_layout)"
        )
    for trace in traces:
        trace.step = step
    return traces


def count_traces(batch: Any) -> int | None:
    """How many traces the whole batch holds (rows of every trajectory, rejected ones as one each),
    without copying anything; ``None`` for a batch of unknown shape."""
    layout = layout_of(batch)
    if layout is not None and layout.count_traces is not None:
        return layout.count_traces(batch)
    if isinstance(batch, list | tuple):
        total = 0
        for item in batch:
            columns = None if item is None else batch_columns_of(item)
            if columns is None:
                total += 1
            elif "messages" in columns:
                messages = columns["messages"]
                total += len(messages) if len(messages) and not isinstance(messages[0], Mapping) else 1
            else:
                total += _n_rows(*_split_mapping(_promote_single_sequence(columns)))
        return total
    columns = batch_columns_of(batch)
    if columns is None:
        return None
    return _n_rows(*_split_mapping(columns)) if _has_parts(batch) else count_traces([batch])


# --------------------------------------------------------------------------- rendering
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
