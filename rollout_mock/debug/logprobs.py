"""Log-prob consistency: recompute each recorded response with a training-side model.

For every scored response token (mask 1) the difference ``Δ = recomputed - recorded`` of
log-probs is taken. Reported, per step and overall:

* ``mean_abs_diff`` / ``max_abs_diff``: mean and max of ``|Δ|`` over the tokens;
* ``token_mult_prob_error``: NeMo-RL's metric, the token mean of ``exp(|Δ|)`` (1.0 = identical;
  NeMo-RL treats a value above 1.05 as a bug in the framework, not in the model);
* ``exp_mean_abs_diff``: ``exp(mean |Δ|)`` (a lower bound of the former, by Jensen);
* the worst samples (largest mean ``|Δ|``) and worst token positions.

The run fails its threshold (:attr:`LogprobReport.ok` false, CLI exit 1) when the overall or any
step's ``token_mult_prob_error`` exceeds ``threshold``, or ``max_abs_diff`` exceeds
``max_abs_threshold`` when one is given.

The training-side model (:func:`load_model`) may be:

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
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import torch

from rollout_mock.debug.sequences import LogprobKeys, RecordedSequence, extract_sequences
from rollout_mock.errors import DebugInputError, MissingExtraError
from rollout_mock.text import jsonable, table

__all__ = [
    "LogprobReport", "ModelFn", "SampleDiff", "StepStats", "TokenDiff", "format_logprob_report", "load_model",
    "logprob_consistency", "token_logprobs",
]

#: NeMo-RL's threshold for ``token_mult_prob_error``.
DEFAULT_THRESHOLD = 1.05


# --------------------------------------------------------------------------- the training-side model
ModelFn = Callable[[torch.Tensor, torch.Tensor], Any]


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _from_directory(path: Path, device: str, dtype: torch.dtype | None) -> torch.nn.Module:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise MissingExtraError(
            f"--model {path}: loading a Hugging Face model needs transformers (pip install transformers)"
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
    vocab = getattr(getattr(fn, "config", None), "vocab_size", None)
    _check_ids(ids, vocab if isinstance(vocab, int) else None)  # before the model's embedding sees them
    ids, attention = ids.to(device), attention.to(device)
    output = fn(input_ids=ids, attention_mask=attention) if _is_hf(fn) else fn(ids, attention)
    out = _output_tensor(output)
    if out.shape[:2] != ids.shape:
        raise DebugInputError(f"the model returned shape {tuple(out.shape)} for input {tuple(ids.shape)}")
    _check_ids(ids, int(out.shape[-1]))
    out = out.float()
    lse = torch.logsumexp(out, dim=-1)
    is_logprob = bool((lse[attention != 0].abs() < 1e-4).all())
    logp = out if is_logprob else torch.log_softmax(out, dim=-1)
    # token t is scored by the distribution at t - 1
    picked = logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    picked = torch.nn.functional.pad(picked, (1, 0)).double().cpu()
    return [picked[row, : len(tokens)] for row, tokens in enumerate(sequences)]


def _check_ids(ids: torch.Tensor, vocab: int | None) -> None:
    """Recorded token ids must be in the model's vocabulary ``[0, vocab)`` (a damaged step holds
    negative or huge ids, which would index past the logits)."""
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        raise DebugInputError(f"recorded token ids span [{low}, {high}], outside the model's vocabulary "
                              f"[0, {vocab if vocab is not None else '...'}): the step is damaged, or --keys "
                              f"tokens=... names the wrong column, or the model is not the rollout's")


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class TokenDiff:
    step: int
    sample: int
    position: int
    token: int
    recorded: float
    recomputed: float

    @property
    def abs_diff(self) -> float:
        return abs(self.recomputed - self.recorded)


@dataclass(frozen=True)
class SampleDiff:
    step: int
    sample: int
    tokens: int
    mean_abs_diff: float
    max_abs_diff: float
    worst_position: int


@dataclass(frozen=True)
class StepStats:
    step: int
    samples: int
    tokens: int
    rejected: int
    mean_abs_diff: float
    max_abs_diff: float
    token_mult_prob_error: float
    exp_mean_abs_diff: float


@dataclass
class LogprobReport:
    """The result of :func:`logprob_consistency`; :meth:`to_json` is strict JSON."""

    layout: str
    keys: dict[str, str]
    threshold: float
    max_abs_threshold: float | None
    steps: list[StepStats] = field(default_factory=list)
    worst_samples: list[SampleDiff] = field(default_factory=list)
    worst_tokens: list[TokenDiff] = field(default_factory=list)
    tokens: int = 0
    sum_abs_diff: float = 0.0
    sum_exp_abs_diff: float = 0.0
    max_abs_diff: float = 0.0

    @property
    def mean_abs_diff(self) -> float:
        return self.sum_abs_diff / self.tokens if self.tokens else math.nan

    @property
    def token_mult_prob_error(self) -> float:
        return self.sum_exp_abs_diff / self.tokens if self.tokens else math.nan

    @property
    def exp_mean_abs_diff(self) -> float:
        return math.exp(self.mean_abs_diff) if self.tokens else math.nan

    @property
    def failed_steps(self) -> list[int]:
        return [s.step for s in self.steps if self._over(s.token_mult_prob_error, s.max_abs_diff)]

    def _over(self, mult: float, max_abs: float) -> bool:
        if not mult <= self.threshold:  # NaN fails too
            return True
        return self.max_abs_threshold is not None and not max_abs <= self.max_abs_threshold

    @property
    def ok(self) -> bool:
        return not self._over(self.token_mult_prob_error, self.max_abs_diff) and not self.failed_steps

    def to_json(self) -> dict[str, Any]:
        return jsonable({
            "ok": self.ok,
            "layout": self.layout,
            "keys": self.keys,
            "threshold": self.threshold,
            "max_abs_threshold": self.max_abs_threshold,
            "tokens": self.tokens,
            "mean_abs_diff": self.mean_abs_diff,
            "max_abs_diff": self.max_abs_diff,
            "token_mult_prob_error": self.token_mult_prob_error,
            "exp_mean_abs_diff": self.exp_mean_abs_diff,
            "failed_steps": self.failed_steps,
            "steps": [vars(s) for s in self.steps],
            "worst_samples": [vars(s) for s in self.worst_samples],
            "worst_tokens": [{**vars(t), "abs_diff": t.abs_diff} for t in self.worst_tokens],
        })


def _g(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3g}" if x and abs(x) < 1e-3 else f"{x:.6f}".rstrip("0").rstrip(".") or "0"


def format_logprob_report(report: LogprobReport) -> str:
    """The report as text: the summary, the per-step table, the worst samples and tokens."""
    keys = ", ".join(f"{k}={v}" for k, v in report.keys.items())
    verdict = "OK" if report.ok else "OVER THRESHOLD"
    lines = [
        f"log-prob consistency ({report.layout} layout: {keys}): {verdict}",
        f"  tokens compared: {report.tokens}; mean |Δlogp| {_g(report.mean_abs_diff)}, max |Δlogp| "
        f"{_g(report.max_abs_diff)}; token_mult_prob_error {report.token_mult_prob_error:.6f} "
        f"(threshold {report.threshold:g}"
        + ("" if report.max_abs_threshold is None else f", max |Δ| threshold {report.max_abs_threshold:g}")
        + ")",
        "",
    ]
    rows = [["step", "samples", "tokens", "rejected", "mean |Δ|", "max |Δ|", "mult_prob_err", ""]]
    for s in report.steps:
        flag = "over" if report._over(s.token_mult_prob_error, s.max_abs_diff) else ""
        rows.append([str(s.step), str(s.samples), str(s.tokens), str(s.rejected), _g(s.mean_abs_diff),
                     _g(s.max_abs_diff), f"{s.token_mult_prob_error:.6f}", flag])
    lines.append(table(rows, indent="  "))
    if report.worst_samples:
        lines += ["", "  worst samples (by mean |Δ|):"]
        rows = [["step", "sample", "tokens", "mean |Δ|", "max |Δ|", "at position"]]
        rows += [[str(w.step), str(w.sample), str(w.tokens), _g(w.mean_abs_diff), _g(w.max_abs_diff),
                  str(w.worst_position)] for w in report.worst_samples]
        lines.append(table(rows, indent="    "))
    if report.worst_tokens:
        lines += ["", "  worst tokens:"]
        rows = [["step", "sample", "position", "token", "recorded", "recomputed", "|Δ|"]]
        rows += [[str(t.step), str(t.sample), str(t.position), str(t.token), f"{t.recorded:.6f}",
                  f"{t.recomputed:.6f}", _g(t.abs_diff)] for t in report.worst_tokens]
        lines.append(table(rows, indent="    "))
    return "\n".join(lines)


def _batches(source: Any, steps: Iterable[int] | None, split: str, trusted: bool,
             progress: bool | None = False) -> Iterable[tuple[int, Any]]:
    from rollout_mock.storage.reader import Dump, open_dump
    from rollout_mock.text import progress_bar

    wanted = None if steps is None else set(steps)
    if isinstance(source, str | os.PathLike | Dump):
        dump = source if isinstance(source, Dump) else open_dump(Path(source))
        stream = dump.stream(split)
        recorded = dump.steps(stream)
        chosen = [s for s in recorded if wanted is None or s in wanted]
        if wanted is not None and (missing := sorted(wanted - set(recorded))):
            raise DebugInputError(
                f"{dump.dump_dir}: steps {missing} are not recorded in {stream} (recorded: {recorded})"
            )
        with progress_bar(len(chosen), enabled=progress, unit="step", unit_scale=False, desc="logprobs") as bar:
            for step in chosen:
                yield step, dump.load(step, stream, trusted=trusted)
                bar.update(1)
        return
    if isinstance(source, Mapping) and source and all(isinstance(k, int) for k in source):
        for step in sorted(source):
            if wanted is None or step in wanted:
                yield step, source[step]
        return
    yield 0, source


def _diffs(report: LogprobReport, step: int, seqs: list[RecordedSequence], recomputed: list[torch.Tensor],
           samples: list[SampleDiff], tokens: list[TokenDiff], top: int) -> tuple[int, float, float, float]:
    n, total, total_exp, worst = 0, 0.0, 0.0, 0.0
    for seq, logp in zip(seqs, recomputed, strict=True):
        if not len(seq.positions):
            continue
        mine = logp[seq.positions]
        diff = (mine - seq.recorded).abs()
        # NaN in either side is a maximal error
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        k = int(diff.argmax())
        n += len(diff)
        total += float(diff.sum())
        total_exp += float(torch.exp(diff).sum())
        worst = max(worst, float(diff[k]))
        samples.append(SampleDiff(step, seq.sample, len(diff), float(diff.mean()), float(diff[k]),
                                  int(seq.positions[k])))
        for j in diff.topk(min(top, len(diff))).indices.tolist():
            pos = int(seq.positions[j])
            tokens.append(
                TokenDiff(step, seq.sample, pos, int(seq.tokens[pos]), float(seq.recorded[j]), float(mine[j]))
            )
    return n, total, total_exp, worst


def logprob_consistency(
    dump_or_batches: Any,
    model: str | os.PathLike[str] | ModelFn,
    *,
    steps: Iterable[int] | None = None,
    split: str = "train",
    keys: LogprobKeys | str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_abs_threshold: float | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    trusted: bool = False,
    top: int = 5,
    progress: bool | None = False,
) -> LogprobReport:
    """Recompute the recorded responses' log-probs with ``model`` and compare (module docstring).

    ``dump_or_batches``: a dump directory (or :class:`~rollout_mock.storage.reader.Dump`), a
    ``{step: batch}`` mapping, or one batch (step 0). ``model``: see :func:`load_model`.
    ``steps`` restricts the steps (all recorded steps by default); ``keys`` names the log-prob,
    token and mask keys (``LogprobKeys`` or ``"logprobs=K,tokens=K,mask=K"``). Sequences go
    through the model ``batch_size`` at a time. ``progress``: a bar over the steps on stderr
    (``None``: on a terminal outside CI only). Raises :class:`DebugInputError` when no key is
    found or nothing is compared.
    """
    if batch_size < 1:
        raise DebugInputError(f"batch_size must be >= 1, got {batch_size}")
    keys = LogprobKeys.parse(keys) if isinstance(keys, str) or keys is None else keys
    fn = load_model(model, device=device, dtype=dtype)
    report = LogprobReport(layout="", keys={}, threshold=threshold, max_abs_threshold=max_abs_threshold)
    samples: list[SampleDiff] = []
    tokens: list[TokenDiff] = []
    for step, batch in _batches(dump_or_batches, steps, split, trusted, progress):
        extraction = extract_sequences(batch, keys)
        report.layout, report.keys = extraction.layout, extraction.keys
        seqs = extraction.sequences
        recomputed: list[torch.Tensor] = []
        for i in range(0, len(seqs), batch_size):
            recomputed += token_logprobs(fn, [s.tokens for s in seqs[i : i + batch_size]], device=device)
        n, total, total_exp, worst = _diffs(report, step, seqs, recomputed, samples, tokens, top)
        report.steps.append(StepStats(
            step, len(seqs), n, extraction.rejected,
            total / n if n else math.nan, worst, total_exp / n if n else math.nan,
            math.exp(total / n) if n else math.nan,
        ))
        report.tokens += n
        report.sum_abs_diff += total
        report.sum_exp_abs_diff += total_exp
        report.max_abs_diff = max(report.max_abs_diff, worst)
    if not report.steps:
        raise DebugInputError("no steps to compare (the dump is empty or --steps matches none)")
    if not report.tokens:
        raise DebugInputError(
            f"no response tokens to compare in {len(report.steps)} step(s): every mask ({report.keys.get('mask')}) "
            f"is empty or no sample has log-probs"
        )
    report.worst_samples = sorted(samples, key=lambda s: (-s.mean_abs_diff, s.step, s.sample))[:top]
    report.worst_tokens = sorted(tokens, key=lambda t: (-t.abs_diff, t.step, t.sample, t.position))[:top]
    return report
