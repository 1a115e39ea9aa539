"""The demo's policy as a log-prob model, for ``rollout-mock logprobs DUMP --model
rollout_mock.debug.demo_model:initial_policy`` on a ``rollout-mock demo`` dump.

It rebuilds the toy policy exactly as :func:`rollout_mock.demo.run_pipeline` does before its first
update (same seed), so step 0 of the demo's dump — sampled from those weights — should match up
to float rounding, and later steps (sampled after training updates) should not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from rollout_mock.determinism.process import seed_everything

__all__ = ["VOCAB", "Policy", "initial_policy"]

#: The demo's vocabulary (the demo imports it and :class:`Policy` from here: debug sits below
#: the demo in the layer graph, since the demo drives wrap/, which uses debug's watchdog).
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


def initial_policy(seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(input_ids, attention_mask) -> logits`` of the demo's untrained policy."""
    seed_everything(seed)
    policy = Policy().eval()

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return policy(input_ids)  # a GRU: causal, right padding does not reach earlier positions

    return fn
