"""Finding the recorded log-probs, tokens and masks of a batch, whatever framework made it (this
module names none: the adapters register where theirs keep them).

Every sample becomes one :class:`RecordedSequence`: its unpadded token ids, and for each scored
response token its index in those ids and the log-prob the rollout engine recorded for it. The
log-prob of token ``t`` is the one the model gives it after seeing tokens ``0..t-1``, so it is
recomputed from the logits at position ``t - 1``.

Found without flags (``keys`` overrides any name):

* columns (a DataProto's, a TensorDict's, a dict's): the log-probs under the first of
  :func:`rollout_mock.batch.logprob_keys` present (the frameworks' adapters register their
  columns), the tokens under ``input_ids`` (or ``tokens``), the mask under ``response_mask``,
  ``loss_mask`` or ``attention_mask``; the layout is named after the framework that registered the
  log-prob column found (:func:`rollout_mock.batch.layout_of_key`), else ``columns``;
* a list of such column dicts (trajectories): each read alike, ``None`` (rejected) items skipped;
  ``trajectories`` unless the log-prob column names a framework;
* a batch a framework holds its own way (samples): read by the reader its adapter registered
  (:class:`rollout_mock.batch.Layout`, ``sequences``).

For column layouts the width ``X`` of the log-prob tensor against the token width ``L`` gives the
alignment: ``X == L`` token-aligned, ``X == L - 1`` shifted, ``X < L - 1`` the last ``X`` tokens.
A mask is read at the same columns (width ``X``) or at the tokens (width ``L``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import batch_columns, column_name, layout_of, layout_of_key, logprob_keys, type_name
from rollout_mock.errors import DebugInputError

__all__ = ["Extraction", "LogprobKeys", "RecordedSequence", "extract_sequences"]


TOKEN_KEYS: tuple[str, ...] = ("input_ids", "tokens")
MASK_KEYS: tuple[str, ...] = ("response_mask", "loss_mask", "attention_mask")


@dataclass(frozen=True)
class LogprobKeys:
    """Names of the log-prob, token and mask keys; ``None`` = found automatically."""

    logprobs: str | None = None
    tokens: str | None = None
    mask: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> LogprobKeys:
        """``"logprobs=rollout_log_probs,tokens=input_ids,mask=response_mask"`` (any subset)."""
        if not text:
            return cls()
        values: dict[str, str] = {}
        for part in text.split(","):
            name, sep, key = part.partition("=")
            name, key = name.strip(), key.strip()
            if not sep or name not in ("logprobs", "tokens", "mask") or not key:
                raise DebugInputError(
                    f"--keys {text!r}: expected NAME=KEY pairs with NAME one of logprobs, tokens, "
                    f"mask, e.g. --keys logprobs=infer_logprobs,mask=response_mask"
                )
            values[name] = key
        return cls(**values)


@dataclass
class RecordedSequence:
    """One sample: unpadded ``tokens``; ``positions`` (indices into ``tokens``, all >= 1) of the
    scored tokens and the log-prob the rollout recorded for each (``recorded``)."""

    sample: int
    tokens: torch.Tensor
    positions: torch.Tensor
    recorded: torch.Tensor


@dataclass
class Extraction:
    layout: str
    keys: dict[str, str]
    sequences: list[RecordedSequence] = field(default_factory=list)
    rejected: int = 0


def _columns(obj: Any) -> dict[str, Any]:
    """The tensor (and numeric array) columns of a columnar batch: a DataProto's (ROLL or verl),
    a TensorDict's or a dict's (:func:`rollout_mock.batch.batch_columns`)."""
    columns = batch_columns(obj)
    if columns is None:
        raise DebugInputError(f"cannot find log-probs in a {type_name(obj)}")
    return {k: v for k, v in columns.items() if _tensor(v) is not None}


def _tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


def _pick(columns: Mapping[str, Any], explicit: str | None, candidates: Sequence[str], what: str,
          batch: Any) -> str | None:
    if explicit is not None:
        if explicit not in columns and column_name(explicit, batch) in columns:  # as `ls --keys` prints it
            explicit = column_name(explicit, batch)
        if explicit not in columns:
            raise DebugInputError(
                f"--keys {what}={explicit}: no such key in the batch (keys: {', '.join(sorted(columns))})"
            )
        return explicit
    return next((k for k in candidates if _tensor(columns.get(k)) is not None), None)


def _columnar(batch: Any, keys: LogprobKeys, out: Extraction, start: int) -> int:
    """Append the sequences of one columnar batch; return how many rows it had."""
    columns = _columns(batch)
    candidates = logprob_keys()
    lp_key = _pick(columns, keys.logprobs, candidates, "logprobs", batch)
    tok_key = _pick(columns, keys.tokens, TOKEN_KEYS, "tokens", batch)
    if lp_key is None or tok_key is None:
        raise DebugInputError(
            f"no {'log-prob' if lp_key is None else 'token'} key found among {', '.join(sorted(columns))} "
            f"(looked for {', '.join(candidates if lp_key is None else TOKEN_KEYS)}); name it with "
            f"--keys logprobs=KEY,tokens=KEY,mask=KEY"
        )
    logprobs, ids = _tensor(columns[lp_key]), _tensor(columns[tok_key])
    assert logprobs is not None and ids is not None
    if ids.ndim == 1:
        ids, logprobs = ids[None], logprobs[None] if logprobs.ndim == 1 else logprobs
    attention = _tensor(columns.get("attention_mask"))
    if attention is None or tuple(attention.shape) != tuple(ids.shape):
        attention = torch.ones_like(ids, dtype=torch.bool)
    mask_key = _pick(columns, keys.mask, MASK_KEYS, "mask", batch)
    mask = None if mask_key is None else _tensor(columns[mask_key])
    if mask is not None and mask.ndim == 1:
        mask = mask[None]
    rows, length = ids.shape
    width = logprobs.shape[-1] if logprobs.ndim == 2 else -1
    if logprobs.ndim != 2 or logprobs.shape[0] != rows or width > length:
        raise DebugInputError(
            f"{lp_key} has shape {tuple(logprobs.shape)} but {tok_key} has {tuple(ids.shape)}: expected "
            f"[{rows}, {length}] (token-aligned), [{rows}, {length - 1}] (shifted) or [{rows}, R<{length - 1}] "
            f"(the last R tokens)"
        )
    offset = 0 if width == length else 1 if width == length - 1 else length - width
    token_index = torch.arange(width) + offset
    if mask is None:
        column_mask = torch.ones(rows, width, dtype=torch.bool)
    elif mask.shape[-1] == width and mask.shape[0] == rows:
        column_mask = mask != 0
    elif mask.shape[-1] == length and mask.shape[0] == rows:
        column_mask = mask[:, token_index] != 0
    else:
        raise DebugInputError(
            f"mask {mask_key} has shape {tuple(mask.shape)}; expected [{rows}, {width}] (like {lp_key}) or "
            f"[{rows}, {length}] (like {tok_key}); name another with --keys mask=KEY"
        )
    out.keys = {"logprobs": lp_key, "tokens": tok_key, **({"mask": mask_key} if mask_key else {})}
    attn = attention != 0
    for row in range(rows):
        keep = attn[row]
        compact = torch.cumsum(keep.long(), 0) - 1
        valid = column_mask[row] & keep[token_index] & (token_index >= 1)
        positions = compact[token_index[valid]]
        tokens = ids[row][keep].long()
        ok = positions >= 1
        out.sequences.append(RecordedSequence(
            start + row, tokens, positions[ok], logprobs[row][valid][ok].double(),
        ))
    return rows


def _flatten(items: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, list | tuple):
            flat += _flatten(item)
        else:
            flat.append(item)
    return flat


def extract_sequences(batch: Any, keys: LogprobKeys | None = None) -> Extraction:
    """All scored sequences of one recorded batch (see the module docstring)."""
    keys = keys or LogprobKeys()
    layout = layout_of(batch)
    if layout is not None and layout.sequences is not None:  # a framework's own shape (its adapter reads it)
        extraction: Extraction = layout.sequences(batch, keys)
        return extraction
    out = Extraction(layout="columns", keys={})
    if isinstance(batch, list | tuple):
        items = _flatten(batch)
        start = 0
        for i, item in enumerate(items):
            if item is None:
                out.rejected += 1
                continue
            if batch_columns(item) is None:
                raise DebugInputError(f"trajectory {i} is a {type_name(item)}: expected a dict of tensors or None")
            start += _columnar(item, keys, out, start)
        out.layout = "trajectories"
    else:
        _columnar(batch, keys, out, 0)
    named = layout_of_key(out.keys.get("logprobs", ""))
    if named is not None:
        out.layout = named.name
    return out
