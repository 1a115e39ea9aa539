"""Building traces from any batch shape: DataProto-like, columns, lists of trajectories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rollout_mock.batch import batch_type_of, dataproto_parts, is_dataproto, is_tensordict, type_name
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
from rollout_mock.text import to_float

__all__ = ["batch_columns", "batch_traces", "count_traces"]


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


_SLIME_FIELDS = frozenset({"tokens", "response_length"})


def _is_slime_sample(item: Any) -> bool:
    """slime's ``Sample`` as a dict: token ids plus a prompt or response text (one trace each)."""
    return isinstance(item, Mapping) and _SLIME_FIELDS <= set(item.keys()) and (
        "prompt" in item.keys() or "response" in item.keys())


def _slime_reward(value: Any) -> float | None:
    if isinstance(value, Mapping):  # a reward model's dict: its score
        value = next((value[k] for k in ("score", "reward", "acc") if k in value), None)
    if isinstance(value, bool | int | float | np.generic):
        return to_float(value)  # 10**400: inf, never OverflowError
    return None


def _slime_trace(sample: Mapping[str, Any], index: int, group: int | None, renderer: _Renderer) -> Trace:
    """One slime sample: its prompt (text or chat messages) and its response as messages."""
    messages = _chat_messages(sample.get("prompt"), renderer) or []
    response = sample.get("response")
    if isinstance(response, str):
        messages.append({"role": "assistant", "content": response, "tokens": None})
    elif sample.get("tokens") is not None and isinstance(sample.get("response_length"), int):
        tokens = list(sample["tokens"])
        n = sample["response_length"]
        messages.append({"role": "assistant", "content": renderer.content(tokens[len(tokens) - n:]),
                         "tokens": tokens[len(tokens) - n:]})
    metadata: dict[str, Any] = {key: _short(sample[key]) for key in ("index", "status", "response_length", "label")
                                if key in sample.keys()}
    if group is not None:
        metadata["uid"] = group  # GRPO group: samples of one prompt
    if sample.get("status") == "aborted":
        return Trace(index, "rejected", None, messages, metadata)
    return Trace(index, "ok", _slime_reward(sample.get("reward")), messages, metadata)


def _slime_traces(samples: Sequence[Any], *, limit: int, renderer: _Renderer) -> list[Trace]:
    """slime's samples: a flat list, or groups (lists) of the samples of one prompt."""
    traces: list[Trace] = []
    for g, item in enumerate(samples):
        members, group = (item, g) if isinstance(item, list | tuple) else ([item], None)
        for sample in members:
            if len(traces) >= limit:
                return traces
            if isinstance(sample, Mapping):
                traces.append(_slime_trace(sample, len(traces), group, renderer))
            else:
                traces.append(Trace(len(traces), "rejected", None, [], {"group": g}))
    return traces


def _slime_samples(batch: Any) -> Sequence[Any] | None:
    """The samples of a slime batch (a recorded rollout, or a list of sample dicts), else None."""
    kind = batch_type_of(batch)
    if kind is not None and kind.name == "slime":
        return list(batch["samples"])
    if isinstance(batch, list | tuple) and batch:
        first = batch[0][0] if isinstance(batch[0], list | tuple) and batch[0] else batch[0]
        if _is_slime_sample(first):
            return batch
    return None


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


def batch_columns(batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numeric array columns, other columns) of a columnar batch (DataProto-like, dict,
    TensorDict), as the traces read them; two empty dicts for any other batch."""
    if is_dataproto(batch):
        tensors, others = _dataproto_parts(batch)
        return tensors, dict(others)
    if isinstance(batch, Mapping) or is_tensordict(batch):
        return _split_mapping(batch)
    return {}, {}


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
    slime = _slime_samples(batch)
    if slime is not None:
        traces = _slime_traces(slime, limit=max_traces, renderer=renderer)
    elif isinstance(batch, list | tuple):
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
    slime = _slime_samples(batch)
    if slime is not None:
        return sum(len(item) if isinstance(item, list | tuple) else 1 for item in slime)
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
