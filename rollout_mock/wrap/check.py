"""Check mode: the real rollout runs, its batch is compared with the recorded one key by key.

What it is for (miles' "inject" mode): catching stale weights on the inference engines, or an
engine upgrade that changes what is generated, while training stays on the recorded data.

Comparison (:func:`score_batches`, over the structural comparison engine
:mod:`rollout_mock.codec.structure`: its walk, its value equality, its tolerance rule), per key
(a dotted path; list items are ``[]``, so the trajectories of an AReaL list or the samples of a
slime record aggregate into one key each):

* token sequences (integer values of ``responses``, ``response_ids``, ``completion_ids``,
  ``response_tokens`` when the batch has one of them, else of every ``*ids`` / ``tokens`` key):
  the fraction of positions holding the same token (a length difference counts as different
  positions);
* floating-point values: equal within the key's ``check_tolerances`` (exact without one); the
  largest absolute difference is reported;
* everything else: equal or not.

**Samples are paired by key, not position** (:func:`pair_samples`): by ``check_sample_key`` (a
request id) when set, else by a hash of the prompt tokens (samples of one prompt, a GRPO group,
by their longest common response prefix), else by position. The live batch is put in the
recorded order before the key-by-key comparison, so an engine that returns the same samples in
another order checks equal. Per sample the verdict keeps the first diverging token and the
largest log-prob difference of the tokens before it. A comparison that is empty (no sample on a
side) or partial (a sample on one side only) fails the step: a check that compared nothing must
not pass.

The step's *match* is the token fraction when the batch has token sequences, else the fraction
of equal values. Volatile fields (:func:`rollout_mock.wrap.hooks.register_volatile_fields`) are
left out, as in request matching.

Verdicts: one small JSON object per step, ``checks/{split}[/{name}]/step_NNNNNN[_rankR].json``
beside the dump (written atomically through the store; the latest check run's verdict of a step
replaces an earlier one), and one log line per step. :func:`read_check_verdicts` reads them back
(bounded: at most :data:`MAX_VERDICTS` files of :data:`MAX_VERDICT_BYTES` each) as
:class:`CheckVerdict` objects.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import take_rows
from rollout_mock.codec.structure import compile_patterns, leaves, matches_pattern, same_value
from rollout_mock.config import CheckServes, CheckSettings
from rollout_mock.errors import CheckFailedError, DumpNotWritableError, RolloutMockError, UnsafePathError
from rollout_mock.jsonio import parse_bounded
from rollout_mock.storage.manifest import StreamId, utc_now
from rollout_mock.storage.store import Store, StoreSettings, open_store, verdict_relpath
from rollout_mock.text import json_float, logger, short_repr, step_log_level, within_tolerance_array
from rollout_mock.wrap.hooks import volatile_patterns

__all__ = [
    "MAX_VERDICTS", "MAX_VERDICT_BYTES", "VERDICT_FORMAT", "CheckVerdict", "Checker",
    "pair_samples", "read_check_verdicts", "score_batches", "verdict_relpath",
]

VERDICT_FORMAT = "rollout_mock.check/1"
MAX_VERDICTS = 100_000
MAX_VERDICT_BYTES = 256 << 10
#: Keys listed per verdict (the others are counted in ``omitted``).
MAX_KEYS = 64
_RESPONSE_KEYS = ("responses", "response_ids", "completion_ids", "response_tokens")
_TOKEN_SUFFIXES = ("ids", "tokens")
_PROMPT_KEYS = ("prompts", "prompt_ids", "prompt_tokens", "prompt")
_LOGPROB_KEYS = ("rollout_log_probs", "rollout_logprobs", "logprobs", "old_log_probs", "log_probs", "old_logps")
#: Samples listed per verdict (differing ones first; the others are counted).
MAX_SAMPLES = 256


@dataclass
class CheckVerdict:
    """One step's check: ``match`` in [0, 1], ``equal`` (every key equal or within tolerance),
    ``passed`` (``match`` reaches ``check_min_match``, or no threshold), and one dict per key that
    is not equal (``key``, ``status``: ``differs``/``missing``/``extra``, ``match``, ``max_abs_diff``,
    ``detail``)."""

    stream: str
    step: int
    run_step: int
    method: str
    match: float
    token_match: float | None
    tokens: int
    equal: bool
    passed: bool
    served: str
    keys: list[dict[str, Any]] = field(default_factory=list)
    omitted: int = 0
    checked_at: str = ""
    #: the sample pairing (:func:`pair_samples`): ``paired_by``, counts and one dict per sample
    samples: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["match"], data["token_match"] = json_float(self.match), json_float(self.token_match)
        return {"format": VERDICT_FORMAT, **data}

    @classmethod
    def from_json(cls, data: Any) -> CheckVerdict | None:
        if not isinstance(data, dict) or data.get("format") != VERDICT_FORMAT:
            return None
        try:
            keys = data.get("keys") or []
            for name in ("match", "token_match"):  # "nan", "inf" as strings: float() takes them
                if data.get(name) is not None and not math.isfinite(float(data[name])):
                    return None
            for name in ("step", "run_step", "tokens", "omitted"):  # counts: int64, not 90 digits
                if not 0 <= int(data.get(name, 0)) < 2**63:
                    return None
            return cls(
                stream=StreamId.from_key(str(data["stream"])).key, step=int(data["step"]),
                run_step=int(data["run_step"]), method=str(data.get("method", ""))[:200],
                match=float(data["match"]),
                token_match=None if data.get("token_match") is None else float(data["token_match"]),
                tokens=int(data.get("tokens", 0)), equal=bool(data["equal"]), passed=bool(data["passed"]),
                served=str(data.get("served", ""))[:20],
                keys=[k for k in keys[:MAX_KEYS] if isinstance(k, dict)] if isinstance(keys, list) else [],
                omitted=int(data.get("omitted", 0)), checked_at=str(data.get("checked_at", ""))[:40],
                samples=data["samples"] if isinstance(data.get("samples"), dict) else None,
            )
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError, UnsafePathError):
            return None


# ----------------------------------------------------------------------------- comparison
def _key(path: tuple[str, ...]) -> str:
    out = ""
    for part in path:
        out += part if part == "[]" or not out else f".{part}"
    return out or "(batch)"


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.layout != torch.strided or value.device.type == "meta":
            return None
        value = value.detach().cpu()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return value
    return None


def _ragged(value: Any) -> list[list[Any]] | None:
    """A list of int sequences (or one) as rows, else ``None``."""
    if isinstance(value, list | tuple) and value:
        if isinstance(value[0], list | tuple):
            return [list(v) for v in value] if all(isinstance(x, int) for v in value[:4] for x in v[:8]) else None
        if isinstance(value[0], int) and not isinstance(value[0], bool):
            return [list(value)]
    return None


@dataclass
class _Stats:
    equal: float = 0.0
    total: float = 0.0
    tokens: bool = False
    max_abs: float = 0.0
    detail: str = ""
    status: str = "equal"

    def add(self, equal: float, total: float) -> None:
        self.equal += equal
        self.total += total


def _compare_value(stats: _Stats, live: Any, recorded: Any, tolerance: Any, token: bool) -> None:
    a, b = _as_array(live), _as_array(recorded)
    if a is not None and b is not None:
        if a.shape != b.shape or a.dtype != b.dtype:
            if token and a.ndim == b.ndim and a.ndim >= 1:
                overlap = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
                stats.add(float((a[overlap] == b[overlap]).sum()), max(a.size, b.size))
            else:
                stats.add(0, max(a.size, b.size, 1))
            stats.detail = stats.detail or f"{b.dtype} {list(b.shape)} recorded, {a.dtype} {list(a.shape)} live"
            return
        if a.dtype.kind == "f" or a.dtype.kind == "c":
            wide = np.complex128 if a.dtype.kind == "c" else np.float64
            va, vb = a.astype(wide), b.astype(wide)
            atol, rtol = (0.0, 0.0) if tolerance is None else (tolerance.atol, tolerance.rtol)
            ok = within_tolerance_array(va, vb, rtol, atol)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(va - vb)
            finite = diff[~np.isnan(diff)]
            if finite.size:
                stats.max_abs = max(stats.max_abs, float(finite.max()))
            stats.add(float(ok.sum()), a.size)
        else:
            stats.add(float((a == b).sum()), a.size)
        return
    rows_a, rows_b = (_ragged(live), _ragged(recorded)) if token else (None, None)
    if rows_a is not None and rows_b is not None:
        for i in range(max(len(rows_a), len(rows_b))):
            x = rows_a[i] if i < len(rows_a) else []
            y = rows_b[i] if i < len(rows_b) else []
            stats.add(sum(1 for p, q in zip(x, y) if p == q), max(len(x), len(y)))
        return
    same = same_value(live, recorded)
    stats.add(1.0 if same else 0.0, 1.0)
    if not same and not stats.detail:
        stats.detail = f"{short_repr(recorded, 60)} recorded, {short_repr(live, 60)} live"


def _is_token_key(parts: tuple[str, ...], value: Any, names: tuple[str, ...]) -> bool:
    name = next((p for p in reversed(parts) if p != "[]"), "")
    if not any(name == n or (n in _TOKEN_SUFFIXES and name.endswith(n)) for n in names):
        return False
    array = _as_array(value)
    if array is not None:
        return array.dtype.kind in "iu"
    return _ragged(value) is not None


def score_batches(live: Any, recorded: Any, settings: CheckSettings,
                  volatile: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check mode's key-by-key score (see the module docstring) over the leaves of the
    structural comparison engine (:func:`rollout_mock.codec.structure.leaves`), values compared
    by its rule (:func:`~rollout_mock.codec.structure.same_value`, the tolerance rule
    :func:`~rollout_mock.text.within_tolerance`): ``{"match", "token_match", "tokens", "equal",
    "keys": [...], "omitted"}``."""
    patterns = compile_patterns(volatile)
    live_leaves: dict[str, list[Any]] = {}
    recorded_leaves: dict[str, list[Any]] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for target, obj in ((live_leaves, live), (recorded_leaves, recorded)):
        for path, value in leaves(obj):
            if patterns and matches_pattern(path, patterns):
                continue
            key = _key(path)
            paths.setdefault(key, path)
            target.setdefault(key, []).append(value)
    names = tuple(n for n in _RESPONSE_KEYS if any(paths[k][-1:] == (n,) for k in paths)) or _TOKEN_SUFFIXES
    stats: dict[str, _Stats] = {}
    for key in sorted(set(live_leaves) | set(recorded_leaves)):
        entry = stats[key] = _Stats()
        a, b = live_leaves.get(key), recorded_leaves.get(key)
        if a is None or b is None:
            entry.status, entry.total = ("extra" if b is None else "missing"), 1.0
            entry.detail = "only in the live batch" if b is None else "only in the recorded batch"
            continue
        entry.tokens = _is_token_key(paths[key], b[0], names)
        tolerance = settings.tolerance(key)
        for x, y in zip(a, b):
            _compare_value(entry, x, y, tolerance, entry.tokens)
        if len(a) != len(b):
            entry.add(0, abs(len(a) - len(b)))
            entry.detail = entry.detail or f"{len(b)} recorded, {len(a)} live"
        if entry.equal < entry.total:
            entry.status = "differs"
    token_total = sum(s.total for s in stats.values() if s.tokens)
    token_match = None if not token_total else sum(s.equal for s in stats.values() if s.tokens) / token_total
    fractions = [s.equal / s.total if s.total else 1.0 for s in stats.values()]
    match = token_match if token_match is not None else (sum(fractions) / len(fractions) if fractions else 1.0)
    differing = [(k, s) for k, s in stats.items() if s.status != "equal"]
    keys = [{"key": k, "status": s.status, "match": json_float(s.equal / s.total if s.total else 0.0),
             "tokens": s.tokens, "max_abs_diff": json_float(s.max_abs) if s.max_abs else None, "detail": s.detail}
            for k, s in differing[:MAX_KEYS]]
    return {"match": match, "token_match": token_match, "tokens": int(token_total), "equal": not differing,
            "keys": keys, "omitted": max(len(differing) - MAX_KEYS, 0)}


# ----------------------------------------------------------------------------- samples by key
def _rows(values: list[Any]) -> list[Any] | None:
    """The per-sample rows of one key (its values over ``[]`` items, concatenated): a tensor or
    array's first dimension, a list's items; ``None`` when a value has no rows."""
    out: list[Any] = []
    for value in values:
        array = _as_array(value)
        if array is not None:
            if array.ndim == 0:
                return None
            out.extend(array[i] for i in range(array.shape[0]))
        elif isinstance(value, list | tuple):
            out.extend(value)
        elif isinstance(value, np.ndarray):  # an object array (verl's non_tensor_batch)
            out.extend(value.tolist())
        else:
            return None
    return out


def _seq(row: Any) -> list[Any]:
    if isinstance(row, np.ndarray):
        return row.reshape(-1).tolist()
    return list(row) if isinstance(row, list | tuple) else [row]


def _find(leaves: Mapping[str, list[Any]], names: tuple[str, ...]) -> str | None:
    """The first key (in ``names`` order) whose last component, or dotted end, is one of ``names``."""
    for name in names:
        for key in leaves:
            if key == name or key.endswith((f".{name}", f"[]{name}")):
                return key
    return None


def _identity(row: Any) -> str:
    return json.dumps(_seq(row), default=str, sort_keys=True)


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pair_samples(live: Any, recorded: Any, sample_key: str | None = None) -> dict[str, Any] | None:
    """Pair the samples of two batches by key (see the module docstring): ``{"paired_by", "live",
    "recorded", "paired", "missing", "extra", "identical", "order"`` (for each recorded sample, the
    live index paired with it, or None)``, "samples": [...]}``; ``None`` when the batches hold no
    token sequences to pair. A sample: ``key`` (its request key or prompt digest), ``status``
    (``equal``, ``differs``, ``missing``: recorded only, ``extra``: live only), ``first_diff``
    (the first diverging token position), the tokens there, both lengths, and the largest
    absolute log-prob difference of the tokens before ``first_diff`` (``logprob_diff_before``)."""
    import hashlib

    sides = []
    for obj in (live, recorded):
        found: dict[str, list[Any]] = {}
        for path, value in leaves(obj):
            found.setdefault(_key(path), []).append(value)
        sides.append(found)
    response = _find(sides[1], _RESPONSE_KEYS)
    if response is None or response not in sides[0]:
        return None
    live_rows, recorded_rows = _rows(sides[0][response]), _rows(sides[1][response])
    if live_rows is None or recorded_rows is None:
        return None
    rows = [live_rows, recorded_rows]
    paired_by, keys = "position", [list(map(str, range(len(r)))) for r in rows]
    key_name = _find(sides[1], (sample_key,)) if sample_key else _find(sides[1], _PROMPT_KEYS)
    if key_name is not None and key_name in sides[0]:
        live_ids, recorded_ids = _rows(sides[0][key_name]), _rows(sides[1][key_name])
        if live_ids is not None and recorded_ids is not None and len(live_ids) == len(live_rows) \
                and len(recorded_ids) == len(recorded_rows):
            paired_by = f"request key {key_name}" if sample_key else f"prompt hash of {key_name}"
            keys = [[_identity(r) if sample_key else hashlib.sha256(_identity(r).encode()).hexdigest()[:12]
                     for r in side] for side in (live_ids, recorded_ids)]
    logprob = _find(sides[1], _LOGPROB_KEYS)
    lps = [_rows(side[logprob]) if logprob in side else None for side in sides] if logprob else [None, None]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys[0]):
        groups.setdefault(key, []).append(i)
    order: list[int | None] = []
    samples: list[dict[str, Any]] = []
    live_seqs = [_seq(r) for r in rows[0]]
    for j, key in enumerate(keys[1]):
        rec = _seq(rows[1][j])
        free = groups.get(key, [])
        if not free:
            order.append(None)
            samples.append({"key": key[:80], "recorded_index": j, "live_index": None, "status": "missing"})
            continue
        best = max(free, key=lambda i: (_common_prefix(live_seqs[i], rec), -i))
        free.remove(best)
        order.append(best)
        got = live_seqs[best]
        first = _common_prefix(got, rec)
        sample: dict[str, Any] = {"key": key[:80], "recorded_index": j, "live_index": best,
                                  "recorded_len": len(rec), "live_len": len(got)}
        if first == len(rec) == len(got):
            sample.update(status="equal", first_diff=None)
        else:
            sample.update(status="differs", first_diff=first,
                          recorded_token=rec[first] if first < len(rec) else None,
                          live_token=got[first] if first < len(got) else None)
        if lps[0] is not None and lps[1] is not None and best < len(lps[0]) and j < len(lps[1]):
            a = np.asarray(_seq(lps[0][best]), dtype=np.float64)
            b = np.asarray(_seq(lps[1][j]), dtype=np.float64)
            n = min(first, len(a), len(b))
            diff = np.abs(a[:n] - b[:n])
            diff = diff[~np.isnan(diff)]
            sample["logprob_diff_before"] = json_float(float(diff.max())) if diff.size else 0.0
        samples.append(sample)
    extra = [i for members in groups.values() for i in members]
    samples += [{"key": keys[0][i][:80], "recorded_index": None, "live_index": i, "status": "extra"} for i in extra]
    counts = {status: sum(1 for s in samples if s["status"] == status) for status in ("equal", "differs", "missing")}
    listed = sorted(samples, key=lambda s: (s["status"] == "equal", s.get("recorded_index") or 0))
    return {
        "paired_by": paired_by, "live": len(rows[0]), "recorded": len(rows[1]),
        "paired": counts["equal"] + counts["differs"], "identical": counts["equal"], "differs": counts["differs"],
        "missing": counts["missing"], "extra": len(extra), "order": order,
        "samples": listed[:MAX_SAMPLES], "omitted": max(len(listed) - MAX_SAMPLES, 0),
    }


def _incomplete(pairing: dict[str, Any] | None) -> str | None:
    """Why a pairing shows too little to pass: an empty or a partial comparison."""
    if pairing is None:
        return None
    if not pairing["live"] or not pairing["recorded"]:
        return (f"empty comparison: {pairing['recorded']} recorded and {pairing['live']} live sample(s), "
                f"nothing was compared")
    if pairing["missing"] or pairing["extra"]:
        return (f"partial comparison: {pairing['missing']} recorded sample(s) have no live counterpart and "
                f"{pairing['extra']} live sample(s) no recorded one (paired by {pairing['paired_by']})")
    return None


def key_summary(key: Mapping[str, Any]) -> str:
    """One differing key of a verdict in words: ``differs: match 0.2700, max_abs_diff 0.73`` (and
    the comparison's own note, when it made one: "3 recorded, 4 live")."""
    parts = [f"match {key['match']:.4f}"] if isinstance(key.get("match"), (int, float)) else []
    if key.get("max_abs_diff") is not None:
        parts.append(f"max_abs_diff {key['max_abs_diff']:.3g}")
    if key.get("detail"):
        parts.append(str(key["detail"]))
    return f"{key.get('status', 'differs')}: {', '.join(parts) or 'no detail recorded'}"


# ----------------------------------------------------------------------------- the checker
class Checker:
    """Check mode for one stream: compare, write the verdict, pick the batch to serve.

    ``views``: per-method functions turning a batch into what is compared (an adapter whose
    recorded object holds more than the rollout's output, e.g. TRL's record). ``framework``:
    whose volatile fields are not compared (``None``: none)."""

    def __init__(self, settings: CheckSettings, store: Store, stream: StreamId, *,
                 views: Mapping[str, Callable[[Any], Any]] | None = None, framework: str | None = None) -> None:
        self.settings = settings
        self.store = store
        self.stream = stream
        self.views = dict(views or {})
        self.checked = 0
        self._volatile = volatile_patterns(framework)

    def __repr__(self) -> str:
        return f"Checker({self.stream}, checked={self.checked})"

    def check(self, *, step: int, source: int, method: str, live: Any, recorded: Any) -> Any:
        """Compare the two batches of run step ``step`` (recorded step ``source``), write and log
        the verdict, raise :class:`CheckFailedError` below ``check_min_match``, return the batch
        to serve."""
        view = self.views.get(method)
        live_view, recorded_view = (live, recorded) if view is None else (view(live), view(recorded))
        pairing = pair_samples(live_view, recorded_view, self.settings.sample_key)
        incomplete = _incomplete(pairing)
        if pairing is not None and incomplete is None and pairing["order"] != list(range(len(pairing["order"]))):
            try:  # the live samples in the recorded order: every key is then compared sample by sample
                live_view = take_rows(live_view, [int(i) for i in pairing["order"]])
            except (RolloutMockError, TypeError, ValueError, IndexError) as exc:
                logger.warning("[RolloutMock] check mode, step %d of %s: cannot reorder the live batch by sample "
                               "(%s); its keys are compared by position", step, self.stream, exc)
        result = score_batches(live_view, recorded_view, self.settings, self._volatile)
        threshold = self.settings.min_match
        if pairing is not None:
            pairing.pop("order")
        verdict = CheckVerdict(
            stream=self.stream.key, step=source, run_step=step, method=method, match=result["match"],
            token_match=result["token_match"], tokens=result["tokens"], equal=result["equal"] and incomplete is None,
            passed=(threshold is None or result["match"] >= threshold) and incomplete is None,
            served=self.settings.serves.value, keys=result["keys"], omitted=result["omitted"], checked_at=utc_now(),
            samples=pairing)
        self.checked += 1
        self._write(verdict)
        first = verdict.keys[0] if verdict.keys else None
        if pairing is not None and pairing["differs"]:
            sample = next(x for x in pairing["samples"] if x["status"] == "differs")
            logger.warning("[RolloutMock] Checked step %d of %s: %d of %d sample(s) differ (paired by %s); first: "
                           "sample %s at token %s (recorded %r, live %r; log-prob diff before it %s)", source,
                           self.stream, pairing["differs"], pairing["paired"], pairing["paired_by"], sample["key"][:16],
                           sample["first_diff"], sample.get("recorded_token"), sample.get("live_token"),
                           sample.get("logprob_diff_before"))
        logger.log(
            step_log_level(self.checked) if verdict.equal else 30,
            "[RolloutMock] Checked step %d of %s: %s (match %.4f%s)%s", source, self.stream,
            "equal to the recording" if verdict.equal else "DIFFERS from the recording", verdict.match,
            "" if verdict.token_match is None else f" of {verdict.tokens} tokens",
            "" if first is None else f"; first: {first['key']} ({key_summary(first)})")
        if incomplete is not None:
            raise CheckFailedError(
                f"[RolloutMock] mode=check, step {step} of {self.stream}: {incomplete}; a check must compare every "
                f"sample. Did the engine drop or add samples, or does check_sample_key name a key that differs "
                f"between runs? The verdict is in {verdict_relpath(self.stream, source)}.",
                match=verdict.match, threshold=threshold or 0.0, mode="check", split=self.stream.split, step=step)
        if not verdict.passed:
            assert threshold is not None
            raise CheckFailedError(
                f"[RolloutMock] mode=check, step {step} of {self.stream}: the live rollout matches the recording "
                f"{verdict.match:.4f}, below check_min_match={threshold} (first differing key: "
                f"{first['key'] if first else '?'}). Stale weights on the inference engines, or another engine "
                f"version? The verdict is in {self.store.describe_location(self.stream, source)} "
                f"({verdict_relpath(self.stream, source)}).",
                match=verdict.match, threshold=threshold, mode="check", split=self.stream.split, step=step)
        return live if self.settings.serves is CheckServes.LIVE else recorded

    def _write(self, verdict: CheckVerdict) -> None:
        try:
            self.store.write_verdict(self.stream, verdict.step, verdict.to_json())
        except (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError) as exc:
            where = self.store.where(verdict_relpath(self.stream, verdict.step))
            raise DumpNotWritableError(
                f"[RolloutMock] check mode: the verdict of {self.stream.key} step {verdict.step} cannot be written "
                f"to {where} ({exc.strerror or type(exc).__name__}): something else is at that "
                f"path or the folder is read-only; remove what is there, or check into another dump_dir",
                mode="check", split=self.stream.split, step=verdict.step, path=where) from None


# ----------------------------------------------------------------------------- reading
def read_check_verdicts(dump: str | os.PathLike[str] | Store, *, split: str | None = None,
                        storage_options: dict[str, Any] | None = None) -> list[CheckVerdict]:
    """Every check-mode verdict written beside ``dump`` (a path, a URL or a :class:`Store`),
    sorted by stream and step; ``split`` keeps one split. Files that are not verdicts, too large or
    damaged are skipped (and logged); an absent ``checks/`` folder gives ``[]``."""
    store = (open_store(StoreSettings(os.fspath(dump), storage_options)) if isinstance(dump, (str, os.PathLike))
             else dump)
    out: list[CheckVerdict] = []
    for rel in store.verdict_files(MAX_VERDICTS):
        try:
            data = store.read_side(rel, MAX_VERDICT_BYTES)
            if data is None:
                continue
            if len(data) > MAX_VERDICT_BYTES:
                logger.warning("[RolloutMock] skipping check verdict %s: more than %d bytes", store.where(rel),
                               MAX_VERDICT_BYTES)
                continue
            verdict = CheckVerdict.from_json(parse_bounded(data, max_bytes=MAX_VERDICT_BYTES, max_depth=16))
        except (ValueError, UnicodeDecodeError, OSError, UnsafePathError) as exc:
            logger.warning("[RolloutMock] skipping check verdict %s: %s", store.where(rel), exc)
            continue
        if verdict is not None and (split is None or StreamId.from_key(verdict.stream).split == split):
            out.append(verdict)
    return sorted(out, key=lambda v: (v.stream, v.step))
