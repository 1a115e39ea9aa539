"""Reading one row of a batch for a trace: token columns to role-labelled messages
(``prompts``/``responses``, ``input_ids`` with loss-mask roles), chat messages, rewards and text
fields, and the conversions every trace builder shares (:class:`Renderer`: what a framework's own
trace reader is handed)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from rollout_mock.batch import leading_dim, type_name
from rollout_mock.text import fmt_number, jsonable, short_repr, to_float
from rollout_mock.text import json_default as _json_default

__all__ = ["MAX_FIELD_CHARS", "MAX_IDS_SHOWN", "Renderer", "Tokenizer"]

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


class Tokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...  # pragma: no cover


def _ndim(value: Any) -> int:
    return int(value.ndim) if isinstance(value, torch.Tensor | np.ndarray) else 1


def _rows_of(value: Any, n: int) -> list[Any]:
    """The first ``n`` rows of a column as Python values, in one device->host transfer.

    A 0-d tensor/array (one value for the whole batch) is repeated ``n`` times; a column shorter
    than the batch (a damaged step) is padded with ``None``.
    """
    rows = _first_rows(value, n)
    return rows + [None] * (n - len(rows)) if len(rows) < n else rows


def _first_rows(value: Any, n: int) -> list[Any]:
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
            return leading_dim(value) or 0  # the batch model's rule (nested tensors included)
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
    """Columns -> (numeric array columns, other columns such as strings and object arrays)."""
    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in batch.items():
        is_array = isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype != object)
        (tensors if is_array else others)[str(key)] = value
    return tensors, others


# --------------------------------------------------------------------------- rewards and text fields
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
    try:  # jsonable: ints past str()'s limit (keys too) as their digit count
        text = json.dumps(jsonable(value), default=_json_default, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = short_repr(value, MAX_FIELD_CHARS + 1)
        return text if len(text) <= MAX_FIELD_CHARS else f"<{type_name(value)}>"
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


# --------------------------------------------------------------------------- chat messages and roles
#: Token ids at or past this are never handed to a tokenizer (its native code overflows on them).
_MAX_TOKEN_ID = 1 << 31


class Renderer:
    """How a trace shows a batch's values: token ids as message content (decoded text with a
    tokenizer, a compact id list without), chat messages, metadata fields. What a layout's trace
    reader (:class:`rollout_mock.batch.Layout`) is handed."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer

    def chat(self, value: Any) -> list[dict[str, Any]] | None:
        """A text prompt (a string, or a list/array of chat messages) as messages; else None."""
        return _chat_messages(value, self)

    @staticmethod
    def field(value: Any) -> Any:
        """A value for a trace's metadata: scalars as-is, long strings cut, big objects summarised."""
        return _short(value)

    def content(self, ids: Sequence[int]) -> str:
        if self.tokenizer is not None and all(type(i) is int and 0 <= i < _MAX_TOKEN_ID for i in ids):
            try:
                return str(self.tokenizer.decode(list(ids)))
            except Exception:  # noqa: BLE001 - tokenizers raise assorted errors on ids outside their vocabulary
                pass  # shown as ids, as without a tokenizer
        shown = " ".join(fmt_number(i) for i in ids[:MAX_IDS_SHOWN])  # never str() of a huge int
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


def _structured_message(message: Any, renderer: Renderer) -> dict[str, Any]:
    """One chat message (``{"role", "content", ...}``) -> trace message.

    ``content`` given as token ids is rendered; ``tokens`` is the message's ``tokens``/``num_tokens``
    int, else the length of its ``token_ids``/``input_ids`` (or of its content ids), else None.
    A message that is not a mapping is shown as a user message with its ``str()``.
    """
    if not isinstance(message, Mapping):
        return {"role": "user", "content": _text_of(message), "tokens": None}
    content: Any = message.get("content")
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


def _chat_messages(value: Any, renderer: Renderer) -> list[dict[str, Any]] | None:
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


# --------------------------------------------------------------------------- token rows
@dataclass
class _Columns:
    """The token columns of a batch for the rows that will be shown, as Python lists."""

    rows: dict[str, list[Any]]

    @classmethod
    def of(cls, tensors: Mapping[str, Any], n: int) -> _Columns:
        return cls({k: _rows_of(tensors[k], n) for k in _TOKEN_KEYS if tensors.get(k) is not None})

    def get(self, key: str, row: int) -> list[Any] | None:
        """Row ``row`` of a token column: a flat list of real numbers, else ``None`` (a column of
        another shape — 1-D, 3-D, complex — in a damaged step is not read as tokens)."""
        column = self.rows.get(key)
        value = None if column is None else column[row]
        if not isinstance(value, list) or not all(type(v) in (int, float, bool) for v in value):
            return None
        return value


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


def _token_messages(cols: _Columns, row: int, renderer: Renderer) -> tuple[list[dict[str, Any]], dict[str, Any]]:
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
