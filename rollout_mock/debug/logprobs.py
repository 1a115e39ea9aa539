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
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollout_mock.debug.model import ModelFn, load_model, token_logprobs
from rollout_mock.debug.sequences import LogprobKeys, RecordedSequence, extract_sequences
from rollout_mock.errors import DebugInputError
from rollout_mock.text import jsonable, table

__all__ = ["LogprobReport", "SampleDiff", "StepStats", "TokenDiff", "format_logprob_report", "logprob_consistency"]

#: NeMo-RL's threshold for ``token_mult_prob_error``.
DEFAULT_THRESHOLD = 1.05


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
    from rollout_mock.progress import progress_bar
    from rollout_mock.storage.reader import Dump, open_dump

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
    ``{step: batch}`` mapping, or one batch (step 0). ``model``: see :mod:`rollout_mock.debug.model`.
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
