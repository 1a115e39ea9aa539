"""Human-readable traces of a recorded rollout batch: who said what, with which reward.

:func:`batch_traces` turns one batch into a list of :class:`Trace` (one per sequence), following
AReaL's trace logging: the valid tokens of a sequence are those of its ``attention_mask``, and
runs of its ``loss_mask`` give the roles (1 = assistant; the first 0 run = user, later 0 runs =
tool). Understood batch shapes:

* AReaL's list of per-trajectory dicts (``input_ids`` [B,L], ``loss_mask``, ``attention_mask``,
  ``rewards`` [B], optional ``versions``; B and L vary per item). Each row of each trajectory is
  one trace; a ``None`` item (rejected trajectory) is one trace with status ``"rejected"``. An item
  with a ``messages`` key (structured multi-turn) is shown from those messages.
* verl ``DataProto`` and look-alikes (``batch``, ``non_tensor_batch``, ``meta_info``):
  ``prompts`` + ``responses`` (+ ``attention_mask``, ``response_mask``) or ``input_ids`` +
  ``loss_mask``/``response_mask``; a chat prompt in ``non_tensor_batch`` (``raw_prompt``,
  ``messages`` or ``prompt``) replaces the token prompt, shown as-is; rewards from
  ``token_level_scores``/``token_level_rewards`` (summed over the response) or
  ``rewards``/``reward``/``acc``/``score``.
* a dict of tensors (or a ``TensorDict``) with the same keys.

Tensors are moved to Python lists once per trajectory (only the rows that will be shown), never
token by token. Without a tokenizer, contents are token ids (``[12 873 4 ... +120 more]``); with
one (anything with ``decode(list[int]) -> str``) they are decoded text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from rollout_mock.describe import _is_dataproto, _is_tensordict, type_name
from rollout_mock.errors import RolloutMockError

__all__ = [
    "DEFAULT_MAX_TRACES",
    "Trace",
    "TraceError",
    "batch_traces",
    "count_traces",
    "format_traces",
    "traces_to_jsonl",
]

#: AReaL's ``max_rollout_traces_per_step`` default.
DEFAULT_MAX_TRACES = 32
#: Token ids shown per message when there is no tokenizer.
MAX_IDS_SHOWN = 16
#: Longest string kept for a ``non_tensor_batch`` field in a trace's metadata.
MAX_FIELD_CHARS = 200

_ROLES: frozenset[str] = frozenset({"user", "assistant", "tool", "system"})
_ROLE_ALIASES: dict[str, str] = {
    "human": "user",
    "model": "assistant",
    "bot": "assistant",
    "gpt": "assistant",
    "developer": "system",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
    "environment": "tool",
}
#: ``non_tensor_batch`` keys holding the prompt as text or chat messages, in order of preference.
_TEXT_PROMPT_KEYS: tuple[str, ...] = ("raw_prompt", "messages", "prompt")
_SCORE_KEYS: tuple[str, ...] = ("token_level_scores", "token_level_rewards")
_REWARD_KEYS: tuple[str, ...] = ("rewards", "reward", "acc", "score", "scores")
_TOKEN_KEYS: tuple[str, ...] = (
    "input_ids", "prompts", "responses", "attention_mask", "loss_mask", "response_mask", "versions",
)


class TraceError(RolloutMockError, ValueError):
    """The batch has no shape that traces can be built from (or a bad argument was given)."""


class Tokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...  # pragma: no cover


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
        return _jsonable({
            "step": self.step if step is None else step,
            "index": self.index,
            "status": self.status,
            "reward": self.reward,
            "messages": self.messages,
            "metadata": self.metadata,
        })


# --------------------------------------------------------------------------------------------
# Small conversions
# --------------------------------------------------------------------------------------------


def _json_float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as strings (strict JSON has no NaN), recursively."""
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic | np.ndarray | torch.Tensor):
        return _jsonable(_json_default(value))
    return value


def _json_default(value: Any) -> Any:
    """``json.dumps`` fallback: numpy scalars and arrays as Python values, anything else as str."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | torch.Tensor):
        return value.tolist()
    return str(value)


def _ndim(value: Any) -> int:
    return int(value.ndim) if isinstance(value, torch.Tensor | np.ndarray) else 1


def _rows_of(value: Any, n: int) -> list[Any]:
    """The first ``n`` rows of a column as Python values, in one device->host transfer.

    A 0-d tensor/array (one value for the whole batch) is repeated ``n`` times.
    """
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.ndim == 0:
            return [value.item()] * n
        return value[:n].cpu().tolist()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return [value.item()] * n
        return list(value[:n]) if value.dtype == object else value[:n].tolist()
    if isinstance(value, list | tuple):
        return list(value[:n])
    return [value] * n


def _n_rows(tensors: Mapping[str, Any], non_tensor: Mapping[str, Any]) -> int:
    """Rows of a columnar batch: the first dimension of its token tensors, else of its text fields."""
    for key in ("input_ids", "prompts", "responses"):
        value = tensors.get(key)
        if isinstance(value, torch.Tensor | np.ndarray):
            return int(value.shape[0]) if value.ndim else 0
        if isinstance(value, list | tuple):
            return len(value)
    for value in non_tensor.values():
        if isinstance(value, np.ndarray | list | tuple):
            return len(value)
    return 0


def _promote_single_sequence(item: Mapping[str, Any]) -> dict[str, Any]:
    """A trajectory whose ``input_ids`` is 1-D [L] becomes one row [1, L] (1-D masks too)."""
    out = dict(item)
    ids = item.get("input_ids")
    if ids is None or _ndim(ids) != 1 or not isinstance(ids, torch.Tensor | np.ndarray):
        return out
    length = ids.shape[0]
    for key in _TOKEN_KEYS:
        value = item.get(key)
        if isinstance(value, torch.Tensor | np.ndarray) and value.ndim == 1 and value.shape[0] == length:
            out[key] = value[None]
    return out


def _split_mapping(batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dict or TensorDict -> (tensor columns, other columns such as strings and object arrays)."""
    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in batch.items():
        is_array = isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype != object)
        (tensors if is_array else others)[str(key)] = value
    return tensors, others


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


class _Renderer:
    """Token ids -> message content: decoded text with a tokenizer, a compact id list without."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer

    def content(self, ids: Sequence[int]) -> str:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(list(ids)))
        shown = " ".join(str(int(i)) for i in ids[:MAX_IDS_SHOWN])
        more = len(ids) - MAX_IDS_SHOWN
        return f"[{shown} ... +{more} more]" if more > 0 else f"[{shown}]"


def _role(value: Any) -> str:
    """A chat role normalised to user/assistant/tool/system (unknown roles read as user)."""
    role = str(value).lower()
    role = _ROLE_ALIASES.get(role, role)
    return role if role in _ROLES else "user"


def _text_of(content: Any) -> str:
    """Message content as text: strings as-is, OpenAI-style part lists joined, None as ``""``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple) and all(isinstance(p, Mapping) for p in content):
        return "".join(str(p.get("text", f"<{p.get('type', 'part')}>")) for p in content)
    return str(content)


def _is_token_list(value: Any) -> bool:
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.ndim == 1 and value.dtype not in (object, np.object_)
    return isinstance(value, list | tuple) and all(isinstance(v, int) for v in value) and len(value) > 0


def _structured_message(message: Any, renderer: _Renderer) -> dict[str, Any]:
    """One chat message (``{"role", "content", ...}``) -> trace message.

    ``content`` given as token ids is rendered; ``tokens`` is the message's ``tokens``/``num_tokens``
    int, else the length of its ``token_ids``/``input_ids`` (or of its content ids), else None.
    A message that is not a mapping is shown as a user message with its ``str()``.
    """
    if not isinstance(message, Mapping):
        return {"role": "user", "content": _text_of(message), "tokens": None}
    content = message.get("content")
    tokens: int | None = None
    if _is_token_list(content):
        ids = _rows_of(content, len(content))
        return {"role": _role(message.get("role", "user")), "content": renderer.content(ids), "tokens": len(ids)}
    for key in ("tokens", "num_tokens"):
        if isinstance(message.get(key), int | np.integer):
            tokens = int(message[key])
    for key in ("token_ids", "input_ids"):
        if tokens is None and _is_token_list(message.get(key)):
            tokens = len(message[key])
    return {"role": _role(message.get("role", "user")), "content": _text_of(content), "tokens": tokens}


def _chat_messages(value: Any, renderer: _Renderer) -> list[dict[str, Any]] | None:
    """A text prompt field (a string, or a list/array of chat messages) -> messages; else None."""
    if isinstance(value, str):
        return [{"role": "user", "content": value, "tokens": None}]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist() if value.dtype == object else None
    if isinstance(value, list | tuple) and value and all(isinstance(m, Mapping) for m in value):
        return [_structured_message(m, renderer) for m in value]
    return None


def _runs(flags: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal flags as ``(flag, start, end)`` (end exclusive); ``[]`` when empty."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            runs.append((flags[start], start, i))
            start = i
    return runs if flags else []


def _role_runs(ids: Sequence[int], flags: Sequence[int], *, prompt_done: bool) -> list[tuple[str, list[int]]]:
    """Label runs of the loss mask: 1 = assistant, the first 0 run = user, later 0 runs = tool.

    With ``prompt_done`` (the prompt was already emitted on its own), every 0 run is a tool run.
    """
    out: list[tuple[str, list[int]]] = []
    seen_user = prompt_done
    for flag, start, end in _runs(flags):
        if flag:
            role = "assistant"
        else:
            role = "tool" if seen_user else "user"
            seen_user = True
        out.append((role, list(ids[start:end])))
    return out


# --------------------------------------------------------------------------------------------
# Token rows -> messages
# --------------------------------------------------------------------------------------------


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
    by ``response_mask`` (1 assistant, 0 tool); ``attention_mask`` [P+R] drops padding. Without
    ``prompts``, the prompt is what ``input_ids`` (= prompts + responses) holds before the response."""
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
    mask = _aligned(cols.get("response_mask", row), len(response)) or response_attention
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


# --------------------------------------------------------------------------------------------
# Rewards and text fields
# --------------------------------------------------------------------------------------------


def _to_float(value: Any) -> float | None:
    """A reward cell -> float: a number, a 1-element list, or a list summed (token-level)."""
    if isinstance(value, list | tuple | np.ndarray):
        flat = np.asarray(value, dtype=float).reshape(-1) if len(value) else np.zeros(0)
        return float(flat.sum()) if flat.size else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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
    if value is None or isinstance(value, bool | int | float):
        return value
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
# Batches
# --------------------------------------------------------------------------------------------


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
        elif isinstance(item, Mapping) or _is_tensordict(item):
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
    tensors = {} if batch.batch is None else {str(k): v for k, v in batch.batch.items()}
    return tensors, dict(batch.non_tensor_batch or {})


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
    elif _is_dataproto(batch):
        tensors, others = _dataproto_parts(batch)
        traces = _columnar_traces(tensors, others, limit=max_traces, start=0, renderer=renderer, base={})
    elif isinstance(batch, Mapping) or _is_tensordict(batch):
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
            if item is None or not (isinstance(item, Mapping) or _is_tensordict(item)):
                total += 1
            elif "messages" in item.keys():
                messages = item["messages"]
                total += len(messages) if len(messages) and not isinstance(messages[0], Mapping) else 1
            else:
                tensors, others = _split_mapping(_promote_single_sequence(dict(item.items())))
                total += _n_rows(tensors, others)
        return total
    if _is_dataproto(batch):
        return _n_rows(*_dataproto_parts(batch))
    if isinstance(batch, Mapping) or _is_tensordict(batch):
        return count_traces([batch])
    return None


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _header(trace: Trace) -> str:
    parts = [f"step {trace.step}" if trace.step is not None else None, f"trace {trace.index}", trace.status]
    if trace.reward is not None:
        parts.append(f"reward {trace.reward:.4g}")
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
        label = f"  [{message['role']}]" + (f" ({tokens} tokens)" if tokens is not None else "")
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
