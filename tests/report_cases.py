"""Dumps in the real batch shapes of verl, ROLL, AReaL, slime and TRL, for the report's tests.

Each builder returns one step's batch as the framework's rollout returns it (what rollout_mock
records): verl's ``DataProto`` (the real class when verl is installed, else its fields as a
dict), ROLL's ``DataProto`` (the double of tests/doubles, installed at ROLL's module path by
:func:`install_roll`), AReaL's list of per-prompt trajectory dicts (``None`` = rejected),
slime's recorded rollout (``rollout_mock.adapters.slime.record_from_output`` of ``Sample`` groups)
and TRL's generation record (``rollout_mock.trl/1``, the dict ``rollout_mock.adapters.trl``
writes per generation call). Every step has GRPO groups of 4, rewards that vary, response
lengths that vary and per-token sampling log-probs.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from conftest import HANG_S

from rollout_mock import MockScheduler

DOUBLES = Path(__file__).resolve().parent / "doubles"
GROUP = 4
PROMPT = 5
MAX_RESPONSE = 8


def _obj(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _pairs(step: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """``n`` (prompt ids, response ids, reward) in groups of :data:`GROUP` (one prompt each)."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for i in range(n):
        prompt = torch.arange(PROMPT) + 10 * (i // GROUP) + 1
        length = 2 + int(torch.randint(0, MAX_RESPONSE - 1, (1,), generator=g))
        response = torch.randint(1, 60, (length,), generator=g)
        reward = float(i % GROUP == 0) if (i // GROUP + step) % 3 else 1.0  # every third group: no signal
        out.append((prompt, response, reward + 0.1 * step))
    return out


def _logprobs(step: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(2000 + step)
    return -torch.rand(n, MAX_RESPONSE, generator=g) * (2.0 - step / 20)


def verl_fields(step: int, n: int = 16) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """verl's agent-loop output: prompts left-padded, responses right-padded, ``uid`` groups."""
    pairs = _pairs(step, n)
    prompts = torch.zeros(n, PROMPT, dtype=torch.long)
    responses = torch.zeros(n, MAX_RESPONSE, dtype=torch.long)
    attention = torch.zeros(n, PROMPT + MAX_RESPONSE, dtype=torch.long)
    response_mask = torch.zeros(n, MAX_RESPONSE, dtype=torch.long)
    scores = torch.zeros(n, MAX_RESPONSE)
    for i, (p, r, reward) in enumerate(pairs):
        prompts[i] = p
        responses[i, : len(r)] = r
        attention[i, : PROMPT + len(r)] = 1
        response_mask[i, : len(r)] = 1
        scores[i, len(r) - 1] = reward
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
               "attention_mask": attention, "response_mask": response_mask,
               "rollout_log_probs": _logprobs(step, n) * response_mask, "token_level_scores": scores}
    others = {"uid": _obj([f"p{i // GROUP}" for i in range(n)]),
              "raw_prompt": _obj([[{"role": "user", "content": f"question {i // GROUP} of step {step}"}]
                                  for i in range(n)])}
    return tensors, others


def verl_batch(step: int, n: int = 16, *, drift: float = 0.0) -> Any:
    """verl's batch; ``drift`` is added to the log-probs from step 5 on (a precision divergence)."""
    tensors, others = verl_fields(step, n)
    if step >= 5:
        tensors["rollout_log_probs"] = tensors["rollout_log_probs"] + drift * tensors["response_mask"]
    try:
        from verl.protocol import DataProto
    except ImportError:
        return {**tensors, **others}
    return DataProto.from_dict(tensors=tensors, non_tensors=others, meta_info={"global_steps": step})


def install_roll(root: Path) -> None:
    """ROLL's ``DataProto`` double at ROLL's module path (``roll.distributed.scheduler.protocol``);
    put ``root`` on ``sys.path`` to import it."""
    pkg = root / "roll" / "distributed" / "scheduler"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "roll", root / "roll" / "distributed", pkg):
        (d / "__init__.py").touch()
    shutil.copyfile(DOUBLES / "roll_protocol.py", pkg / "protocol.py")


def roll_batch(step: int, n: int = 16) -> Any:
    """ROLL's RLVR scheduler output: right-padded sequences, ``infer_logprobs`` token-aligned
    ``[:, 1:]``, per-row ``scores``, ``prompt_id`` groups (needs :func:`install_roll`)."""
    from roll.distributed.scheduler.protocol import DataProto  # type: ignore[import-not-found]

    pairs = _pairs(step, n)
    length = PROMPT + MAX_RESPONSE
    ids = torch.zeros(n, length, dtype=torch.long)
    attention = torch.zeros(n, length, dtype=torch.long)
    response_mask = torch.zeros(n, length, dtype=torch.long)
    logp = torch.zeros(n, length)
    drawn = _logprobs(step, n)
    for i, (p, r, _) in enumerate(pairs):
        seq = torch.cat([p, r])
        ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
        response_mask[i, PROMPT: len(seq)] = 1
        logp[i, PROMPT: len(seq)] = drawn[i, : len(r)]
    return DataProto.from_single_dict({
        "prompts": ids[:, :PROMPT], "responses": ids[:, PROMPT:], "input_ids": ids, "attention_mask": attention,
        "response_mask": response_mask, "infer_logprobs": logp[:, 1:],
        "scores": torch.tensor([r for _, _, r in pairs]), "prompt_id": torch.arange(n) // GROUP,
        "domain": np.array(["math_rule"] * n, dtype=object),
    }, meta_info={"metrics": {"scheduler/math_rule/score/mean": 0.5}})


def areal_batch(step: int, n: int = 16) -> list[Any]:
    """AReaL's ``prepare_batch``: one dict of ``[GROUP, L]`` tensors per prompt (L varies per
    prompt), ``loss_mask`` 1 on generated tokens, ``logprobs`` aligned with ``input_ids``; a
    rejected prompt is ``None``."""
    pairs = _pairs(step, n)
    drawn = _logprobs(step, n)
    out: list[Any] = []
    for g in range(n // GROUP):
        group = pairs[g * GROUP:(g + 1) * GROUP]
        length = PROMPT + max(len(r) for _, r, _ in group)
        ids = torch.zeros(GROUP, length, dtype=torch.int32)
        loss_mask = torch.zeros(GROUP, length, dtype=torch.int32)
        attention = torch.zeros(GROUP, length, dtype=torch.bool)
        logprobs = torch.zeros(GROUP, length)
        for j, (p, r, _) in enumerate(group):
            ids[j, : PROMPT + len(r)] = torch.cat([p, r]).to(torch.int32)
            loss_mask[j, PROMPT: PROMPT + len(r)] = 1
            attention[j, : PROMPT + len(r)] = True
            logprobs[j, PROMPT: PROMPT + len(r)] = drawn[g * GROUP + j, : len(r)]
        out.append({"input_ids": ids, "loss_mask": loss_mask, "logprobs": logprobs,
                    "versions": torch.where(loss_mask.bool(), step, -1).to(torch.int32),
                    "attention_mask": attention, "rewards": torch.tensor([r for _, _, r in group])})
    out.insert(1, None)  # a rejected trajectory
    return out


def slime_batch(step: int, n: int = 16) -> dict[str, Any]:
    """slime's ``RolloutFnTrainOutput``: groups of ``Sample``, recorded as the adapter records it."""
    sys.path.insert(0, str(DOUBLES))
    try:
        from slime_rollout import Sample  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(DOUBLES))
    from rollout_mock.adapters.slime import record_from_output

    pairs = _pairs(step, n)
    drawn = _logprobs(step, n)
    groups: list[list[Any]] = []
    for i, (p, r, reward) in enumerate(pairs):
        if i % GROUP == 0:
            groups.append([])
        status = Sample.Status.ABORTED if i == 5 else Sample.Status.COMPLETED
        groups[-1].append(Sample(
            group_index=i // GROUP, index=i, prompt=[{"role": "user", "content": f"question {i // GROUP}"}],
            tokens=torch.cat([p, r]).tolist(), response=f"answer {i} of step {step}", response_length=len(r),
            reward=reward, loss_mask=[1] * len(r), rollout_log_probs=drawn[i, : len(r)].tolist(), status=status))
    return record_from_output(groups, evaluation=False)


def trl_batch(step: int, n: int = 16) -> dict[str, Any]:
    """TRL's generation record (``rollout_mock.adapters.trl``): ``_generate``'s return values
    (prompt ids, completion ids, tool mask, completion texts, sampling log-probs, extra fields,
    images, tool images) and ``_calculate_rewards``' ``rewards_per_func``."""
    pairs = _pairs(step, n)
    drawn = _logprobs(step, n)
    output = [[p.tolist() for p, _, _ in pairs], [r.tolist() for _, r, _ in pairs], None,
              [f"completion {i} of step {step}" for i in range(n)],
              [drawn[i, : len(r)].tolist() for i, (_, r, _) in enumerate(pairs)], {}, None, []]
    rewards = torch.tensor([[r] for _, _, r in pairs])
    return {"format": "rollout_mock.trl/1", "mode": "train", "global_step": step, "micro_step": 0,
            "generate": {"output": output, "tuple": True, "metrics": {"num_tokens": {"append": [n * 9]}},
                         "num_input_tokens_seen": n * 9, "rng": None},
            "rewards": {"rewards_per_func": rewards, "pending_metrics": {}, "pending_extra_logs": {}, "rng": None}}


def verl_drifted(step: int, n: int = 16) -> Any:
    """:func:`verl_batch` whose log-probs drift by 1e-8 from step 5 on."""
    return verl_batch(step, n, drift=1e-8)


def run_metrics(step: int, drift: float = 0.0) -> dict[str, float]:
    """A training run's metrics at ``step``; ``drift`` is added to ``pg_loss`` from step 5 on."""
    return {"pg_loss": 1.0 / (step + 1) + (drift if step >= 5 else 0.0), "grad_norm": 0.5 + 0.01 * step}


BUILDERS: dict[str, Callable[[int], Any]] = {
    "verl": verl_batch, "roll": roll_batch, "areal": areal_batch, "slime": slime_batch, "trl": trl_batch,
    "verl-drifted": verl_drifted,
}


class _Source:
    def __init__(self, build: Callable[[int], Any]) -> None:
        self.build = build

    def get_batch(self, data: Any, global_step: int) -> Any:
        return self.build(global_step)


def framework_dump(path: Path, framework: str, steps: int = 12, *, split: str = "train",
                   metrics: Callable[[int], dict[str, float]] | None = None) -> Path:
    """A dump of ``steps`` steps of ``framework``'s batches (ROLL: call :func:`install_roll` and put
    its root on ``sys.path`` first); with ``metrics``, the run's metrics of each step are stored
    in the dump too (``expected/``)."""
    from rollout_mock.compare import MetricsWriter

    config = {"enable": True, "mode": "dump", "dump_dir": str(path)}
    with MockScheduler(_Source(BUILDERS[framework]), config, split=split) as mock:  # type: ignore[arg-type]
        log = MetricsWriter(path.parent / f"{path.name}-metrics.jsonl", expected=mock) if metrics else None
        for step in range(steps):
            mock.get_batch(None, step)
            if log is not None and metrics is not None:
                log.log(step, metrics(step))
        if log is not None:
            log.close()
    return path


# ------------------------------------------------------------------------------ a real browser
def browser() -> tuple[Any, str]:
    """``(sync_playwright, chromium path)``; the test is skipped, with the reason, without either."""
    import pytest

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium); Playwright's own download does not work here")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install rollout_mock[test])")
    return sync_playwright, chromium


def open_page(p: Any, chromium: str, url: str, errors: list[str], requests: list[str],
              dialogs: list[str] | None = None) -> tuple[Any, Any]:
    """A headless page at ``url`` that records script errors, console errors and warnings, every
    request that is not the file itself, and dialogs."""
    browser = p.chromium.launch(executable_path=chromium,
                                args=["--headless", "--no-sandbox", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type in ("error", "warning") else None)
    if dialogs is not None:
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url) if r.url != url else None)
    page.goto(url, timeout=HANG_S * 1000)
    return browser, page
