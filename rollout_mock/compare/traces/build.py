"""Building traces from any batch shape: DataProto-like, columns, lists of trajectories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rollout_mock.batch import dataproto_parts, is_dataproto, is_tensordict, type_name
from rollout_mock.compare.traces.fields import _reward_column, _short, _text_columns
from rollout_mock.compare.traces.messages import (
    _chat_messages,
    _Renderer,
    _structured_message,
)
from rollout_mock.compare.traces.model import (
    DEFAULT_MAX_TRACES,
    Tokenizer,
    Trace,
    _n_rows,
    _promote_single_sequence,
    _split_mapping,
)
from rollout_mock.compare.traces.rows import _Columns, _token_messages
from rollout_mock.errors import TraceError

__all__ = ["batch_traces", "count_traces"]


def _columnar_traces(
    tensors: Mapping[str, Any],
    others: Mapping[str, Any],
    *,
    limit: int,
    start: int,
    renderer: _Renderer,
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
    item: Mapping[str, Any], *, limit: int, start: int, renderer: _Renderer, base: Mapping[str, Any]
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
        Trace(start + row, "ok", rewards[row], [_structured_message(m, renderer) for m in conversations[row]],
              {**base, "row": row})
        for row in range(n)
    ]


def _list_traces(batch: Sequence[Any], *, limit: int, renderer: _Renderer) -> list[Trace]:
    """AReaL's list of trajectories; ``None`` items are rejected traces (they count toward ``limit``)."""
    traces: list[Trace] = []
    for i, item in enumerate(batch):
        left = limit - len(traces)
        if left <= 0:
            break
        base = {"trajectory": i}
        if item is None:
            traces.append(Trace(len(traces), "rejected", None, [], base))
        elif isinstance(item, Mapping) or is_tensordict(item):
            traces += _item_traces(item, limit=left, start=len(traces), renderer=renderer, base=base)
        else:
            raise TraceError(f"trajectory {i} is a {type_name(item)}: expected a dict of tensors or None")
    return traces


def _item_traces(item: Any, *, limit: int, start: int, renderer: _Renderer, base: Mapping[str, Any]) -> list[Trace]:
    if "messages" in item.keys():
        return _structured_traces(item, limit=limit, start=start, renderer=renderer, base=base)
    tensors, others = _split_mapping(_promote_single_sequence(dict(item.items())))
    return _columnar_traces(tensors, others, limit=limit, start=start, renderer=renderer, base=base)


def _dataproto_parts(batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    tensors, non_tensor, _ = dataproto_parts(batch)
    return ({} if tensors is None else {str(k): v for k, v in tensors.items()}), non_tensor


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
    renderer = _Renderer(tokenizer)
    if isinstance(batch, list | tuple):
        traces = _list_traces(batch, limit=max_traces, renderer=renderer)
    elif is_dataproto(batch):
        tensors, others = _dataproto_parts(batch)
        traces = _columnar_traces(tensors, others, limit=max_traces, start=0, renderer=renderer, base={})
    elif isinstance(batch, Mapping) or is_tensordict(batch):
        traces = _item_traces(batch, limit=max_traces, start=0, renderer=renderer, base={})
    else:
        raise TraceError(
            f"cannot build traces from a {type_name(batch)}: expected a list of trajectory dicts "
            f"(AReaL), a DataProto or a dict of tensors with input_ids or prompts/responses"
        )
    for trace in traces:
        trace.step = step
    return traces


def count_traces(batch: Any) -> int | None:
    """How many traces the whole batch holds (rows of every trajectory, rejected ones as one each),
    without copying anything; ``None`` for a batch of unknown shape."""
    if isinstance(batch, list | tuple):
        total = 0
        for item in batch:
            if item is None or not (isinstance(item, Mapping) or is_tensordict(item)):
                total += 1
            elif "messages" in item.keys():
                messages = item["messages"]
                total += len(messages) if len(messages) and not isinstance(messages[0], Mapping) else 1
            else:
                tensors, others = _split_mapping(_promote_single_sequence(dict(item.items())))
                total += _n_rows(tensors, others)
        return total
    if is_dataproto(batch):
        return _n_rows(*_dataproto_parts(batch))
    if isinstance(batch, Mapping) or is_tensordict(batch):
        return count_traces([batch])
    return None


# --------------------------------------------------------------------------------------------
