"""The demo's policy as a log-prob model, for ``rollout-mock logprobs DUMP --model
rollout_mock.debug.demo_model:initial_policy`` on a ``rollout-mock demo`` dump.

It rebuilds the toy policy exactly as :func:`rollout_mock.demo.run_pipeline` does before its first
update (same seed), so step 0 of the demo's dump — sampled from those weights — should match up
to float rounding, and later steps (sampled after training updates) should not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["initial_policy"]


def initial_policy(seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(input_ids, attention_mask) -> logits`` of the demo's untrained policy."""
    from rollout_mock.demo import Policy
    from rollout_mock.determinism.process import seed_everything

    seed_everything(seed)
    policy = Policy().eval()

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return policy(input_ids)  # a GRU: causal, right padding does not reach earlier positions

    return fn
