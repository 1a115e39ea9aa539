"""A readable trace of one sequence, and the conversions every trace builder shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from rollout_mock.batch import leading_dim
from rollout_mock.text import jsonable

__all__ = ["DEFAULT_MAX_TRACES", "MAX_FIELD_CHARS", "MAX_IDS_SHOWN", "Tokenizer", "Trace"]

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
        return jsonable({
            "step": self.step if step is None else step,
            "index": self.index,
            "status": self.status,
            "reward": self.reward,
            "messages": self.messages,
            "metadata": self.metadata,
        })


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
    """A dict or TensorDict -> (tensor columns, other columns such as strings and object arrays)."""
    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in batch.items():
        is_array = isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype != object)
        (tensors if is_array else others)[str(key)] = value
    return tensors, others
