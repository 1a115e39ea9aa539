"""Chat messages and roles: structured messages, and role runs from loss masks (AReaL's rules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rollout_mock.compare.traces.model import (
    _ROLE_ALIASES,
    _ROLES,
    MAX_IDS_SHOWN,
    Tokenizer,
    _rows_of,
)
from rollout_mock.text import fmt_number

__all__ = []


class _Renderer:
    """Token ids -> message content: decoded text with a tokenizer, a compact id list without."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer

    def content(self, ids: Sequence[int]) -> str:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(list(ids)))
        shown = " ".join(fmt_number(int(i)) for i in ids[:MAX_IDS_SHOWN])  # never str() of a huge int
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
