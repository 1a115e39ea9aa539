"""The training-side model that recomputes log-probs: a local Hugging Face directory or a callable.

``model`` may be:

* a local directory holding a Hugging Face causal LM (``config.json`` + weights): loaded with
  ``AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`` — never a download;
* ``"package.module:factory"``: a zero-argument factory returning a model or callable (the CLI's
  way to use a model that is not a Hugging Face directory);
* a ``torch.nn.Module`` or any callable ``fn(input_ids, attention_mask)`` where both are
  ``[B, L]`` tensors (right-padded; ``attention_mask`` 1 on real tokens) returning ``[B, L, V]``
  **logits** or **log-probs** (or an object with ``.logits``, or a tuple whose first item is
  that tensor). The output at position ``t`` must be the distribution of token ``t + 1``.
  Log-probs are recognised (every row's ``logsumexp`` is 0) and used as they are; anything else
  goes through ``log_softmax`` in float32.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import torch

from rollout_mock.errors import DebugInputError, MissingExtraError

__all__ = ["ModelFn", "load_model", "token_logprobs"]

ModelFn = Callable[[torch.Tensor, torch.Tensor], Any]


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _from_directory(path: Path, device: str, dtype: torch.dtype | None) -> torch.nn.Module:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise MissingExtraError(
            f"--model {path}: loading a Hugging Face model needs transformers (pip install rollout_mock[verl])"
        ) from exc
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad directory
        raise DebugInputError(f"--model {path}: not a loadable causal LM directory ({_one_line(exc)})") from None
    return model.to(device).eval()


def _from_factory(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise DebugInputError(
            f"--model {spec}: cannot import {attr!r} from {module_name!r} ({_one_line(exc)})"
        ) from None
    if not callable(factory):
        raise DebugInputError(f"--model {spec}: {attr} is not callable (expected a zero-argument factory)")
    return factory()


def load_model(model: str | os.PathLike[str] | ModelFn, *, device: str = "cpu",
               dtype: torch.dtype | None = None) -> ModelFn:
    """A callable ``fn(input_ids, attention_mask)`` for ``model`` (see the module docstring)."""
    if isinstance(model, str | os.PathLike):
        text = os.fspath(model)
        path = Path(text)
        if path.is_dir():
            return _from_directory(path, device, dtype)
        if ":" in text and not path.exists():
            model = _from_factory(text)
        else:
            raise DebugInputError(
                f"--model {text}: not a directory (expected a local Hugging Face model directory, "
                f"or package.module:factory)"
            )
    if isinstance(model, torch.nn.Module):
        model = model.to(device).eval()
    if not callable(model):
        raise DebugInputError(f"model must be a directory, 'module:factory' or a callable, got {type(model).__name__}")
    return model


def _is_hf(fn: Any) -> TypeGuard[torch.nn.Module]:
    """A Hugging Face model (called with keyword arguments), not a plain ``fn(ids, mask)``."""
    return isinstance(fn, torch.nn.Module) and hasattr(fn, "config") and hasattr(fn, "generation_config")


def _output_tensor(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, tuple | list) and output:
        logits = output[0]
    if logits is None:
        logits = output
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise DebugInputError(
            f"the model returned {type(output).__name__}"
            + (f" of shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else "")
            + "; expected [B, L, V] logits or log-probs (or an object with .logits)"
        )
    return logits


@torch.no_grad()
def token_logprobs(fn: ModelFn, sequences: list[torch.Tensor], *, device: str = "cpu") -> list[torch.Tensor]:
    """Per-token log-probs of each unpadded 1-D sequence (one forward, right-padded).

    Element ``t`` of a result is ``log p(tokens[t] | tokens[:t])`` for ``t >= 1`` (element 0 is 0).
    """
    if not sequences:
        return []
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attention = torch.zeros(len(sequences), longest, dtype=torch.long)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = tokens
        attention[row, : len(tokens)] = 1
    ids, attention = ids.to(device), attention.to(device)
    output = fn(input_ids=ids, attention_mask=attention) if _is_hf(fn) else fn(ids, attention)
    out = _output_tensor(output)
    if out.shape[:2] != ids.shape:
        raise DebugInputError(f"the model returned shape {tuple(out.shape)} for input {tuple(ids.shape)}")
    out = out.float()
    lse = torch.logsumexp(out, dim=-1)
    is_logprob = bool((lse[attention != 0].abs() < 1e-4).all())
    logp = out if is_logprob else torch.log_softmax(out, dim=-1)
    # token t is scored by the distribution at t - 1
    picked = logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    picked = torch.nn.functional.pad(picked, (1, 0)).double().cpu()
    return [picked[row, : len(tokens)] for row, tokens in enumerate(sequences)]
