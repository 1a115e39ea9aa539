"""A toy RL pipeline that uses rollout_mock as a user would: the ``rollout-mock demo`` job.

Everything runs on the CPU in seconds:

* :class:`Policy` — a tiny GRU language model over a 16-token vocabulary;
* :class:`ToyRolloutScheduler` — really samples responses autoregressively from the current
  policy weights with an unseeded generator (so two rollouts never agree, like a real inference
  engine), scores them and returns a DataProto-like batch;
* :func:`train_step` — a GRPO update: group-normalised advantages, PPO clipped loss,
  gradient accumulation over micro-batches, gradient clipping, Adam.

:func:`run_pipeline` runs N steps in dump or mock mode through :class:`~rollout_mock.MockScheduler`
(in mock mode the scheduler is never constructed) and logs per-step metrics with
:class:`~rollout_mock.compare.expected.MetricsWriter`; :func:`main` runs both and verifies them.

:func:`initial_policy` rebuilds the untrained policy as a log-prob model, for ``rollout-mock logprobs DUMP
--model rollout_mock.demo:initial_policy`` on a ``rollout-mock demo`` dump: step 0 of the demo's dump (sampled
from those weights) should match up to float rounding, later steps (sampled after updates) should not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rollout_mock.codec import register_batch_class
from rollout_mock.compare.expected import MetricsWriter
from rollout_mock.determinism import apply as apply_determinism
from rollout_mock.determinism.process import seed_everything
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = [
    "BOS",
    "VOCAB",
    "Policy",
    "RolloutBatch",
    "RunResult",
    "StepRequest",
    "ToyRolloutScheduler",
    "initial_policy",
    "run_pipeline",
    "target_of",
    "train_step",
]

#: The demo's vocabulary.
VOCAB = 16


class Policy(nn.Module):
    """The demo's toy policy: embedding, GRU, linear head over :data:`VOCAB` tokens."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


BOS = 0
#: Responses sampled per prompt (GRPO group size): the batch size is a multiple of it.
GROUP_SIZE = 4


@register_batch_class
@dataclass
class RolloutBatch:
    """A DataProto-like batch: tensors with one batch dimension, object arrays, meta info."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(next(iter(self.batch.values())).shape[0])


@dataclass
class StepRequest:
    """What the trainer passes to ``get_batch``: ROLL-style, the step rides in ``meta_info``."""

    meta_info: dict[str, Any]


def target_of(prompts: torch.Tensor, length: int) -> torch.Tensor:
    """The task: continue counting up from the prompt's last token (mod the vocabulary)."""
    start = prompts[:, -1:] + 1
    return (start + torch.arange(length)) % (VOCAB - 1) + 1


class ToyRolloutScheduler:
    """Samples ``group`` responses per prompt from the live policy; counts its constructions."""

    constructed = 0

    def __init__(self, policy: Policy, *, prompt_len: int = 4, response_len: int = 10, group: int = GROUP_SIZE) -> None:
        ToyRolloutScheduler.constructed += 1
        self.policy = policy
        self.prompt_len = prompt_len
        self.response_len = response_len
        self.group = group
        self.generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    @torch.no_grad()
    def get_batch(self, data: StepRequest, batch_size: int) -> RolloutBatch:
        n_prompts = batch_size // self.group
        prompts = torch.randint(1, VOCAB, (n_prompts, self.prompt_len), generator=self.generator)
        prompts = prompts.repeat_interleave(self.group, dim=0)
        tokens = torch.cat([torch.full((batch_size, 1), BOS), prompts], dim=1)
        log_probs = []
        for _ in range(self.response_len):
            logits = self.policy(tokens)[:, -1]
            dist = torch.distributions.Categorical(logits=logits)
            nxt = torch.multinomial(dist.probs, 1, generator=self.generator)
            log_probs.append(dist.log_prob(nxt.squeeze(1)))
            tokens = torch.cat([tokens, nxt], dim=1)
        responses = tokens[:, 1 + self.prompt_len :]
        rewards = (responses == target_of(prompts, self.response_len)).float().mean(dim=1)
        text = np.array([" ".join(map(str, row.tolist())) for row in responses], dtype=object)
        uid = np.array([f"p{i // self.group}" for i in range(batch_size)], dtype=object)
        return RolloutBatch(
            batch={
                "input_ids": tokens,
                "responses": responses,
                "old_log_probs": torch.stack(log_probs, dim=1),
                "rewards": rewards,
            },
            non_tensor_batch={"uid": uid, "response_text": text},
            meta_info={**data.meta_info, "group": self.group},
        )


def train_step(policy: Policy, optimizer: torch.optim.Optimizer, batch: RolloutBatch, *,
               micro_batches: int = 2, epochs: int = 2, clip: float = 0.2) -> dict[str, float]:
    """One GRPO update (``epochs`` optimizer steps over the batch); returns metrics as floats."""
    group = int(batch.meta_info["group"])
    tensors = batch.batch
    rewards = tensors["rewards"].view(-1, group)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1)
    response_len = tensors["responses"].shape[1]
    totals = {"pg_loss": 0.0, "approx_kl": 0.0, "clip_frac": 0.0, "entropy": 0.0}
    weight = 1.0 / (micro_batches * epochs)
    for _ in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        for index in torch.arange(len(batch)).chunk(micro_batches):
            logits = policy(tensors["input_ids"][index, :-1])[:, -response_len:]
            logp_all = F.log_softmax(logits, dim=-1)
            logp = logp_all.gather(-1, tensors["responses"][index].unsqueeze(-1)).squeeze(-1)
            ratio = torch.exp(logp - tensors["old_log_probs"][index])
            adv = advantages[index].unsqueeze(1)
            loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
            (loss / micro_batches).backward()
            with torch.no_grad():
                totals["pg_loss"] += loss.item() * weight
                totals["approx_kl"] += (tensors["old_log_probs"][index] - logp).mean().item() * weight
                totals["clip_frac"] += ((ratio - 1).abs() > clip).float().mean().item() * weight
                totals["entropy"] += -(logp_all.exp() * logp_all).sum(-1).mean().item() * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
    return {**totals, "grad_norm": grad_norm.item(), "reward_mean": tensors["rewards"].mean().item()}


@dataclass
class RunResult:
    mode: str
    seconds: float
    metrics: dict[int, dict[str, float]]
    metrics_path: Path
    scheduler_constructed: int


def run_pipeline(mode: str, dump_dir: Path, metrics_path: Path, *, steps: int = 8, batch_size: int = 64,
                 micro_batches: int = 2, seed: int = 0) -> RunResult:
    """Train ``steps`` GRPO steps with rollouts recorded (``dump``) or replayed (``mock``)."""
    apply_determinism(seed=seed)
    torch.set_num_threads(1)  # thread count changes CPU reduction order: keep it fixed
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    config = {"enable": True, "mode": mode, "dump_dir": str(dump_dir), "max_steps": steps if mode == "mock" else None}
    before = ToyRolloutScheduler.constructed
    start = time.perf_counter()
    metrics: dict[int, dict[str, float]] = {}
    scheduler = MockScheduler(
        None, config, factory=lambda: ToyRolloutScheduler(policy), spec=ToyRolloutScheduler
    )
    with scheduler, MetricsWriter(metrics_path, expected=scheduler) as log:
        for step in range(steps):
            batch = scheduler.get_batch(StepRequest({"global_step": step}), batch_size)
            metrics[step] = train_step(policy, optimizer, batch, micro_batches=micro_batches)
            log.log(step, metrics[step])
    return RunResult(mode, time.perf_counter() - start, metrics, metrics_path,
                     ToyRolloutScheduler.constructed - before)


def initial_policy(seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(input_ids, attention_mask) -> logits`` of the demo's untrained policy."""
    seed_everything(seed)
    policy = Policy().eval()

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return policy(input_ids)  # a GRU: causal, right padding does not reach earlier positions

    return fn
