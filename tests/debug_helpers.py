"""Helpers of the debug tests: a tiny randomly initialised causal LM built and saved by the test
(nothing downloaded) and recorded batches in the layouts of ROLL, verl, AReaL and slime whose
log-probs come from a plain one-sequence-at-a-time forward of that model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

VOCAB = 64


def tiny_model(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def save_tiny_model(path: Path, *, seed: int = 0, perturb: float = 0.0) -> Path:
    """Save the tiny model; ``perturb`` adds that much Gaussian noise (seeded) to every weight."""
    model = tiny_model(seed)
    if perturb:
        generator = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * perturb)
    model.save_pretrained(str(path))
    return path


#: How far the checker's one right-padded batched forward may differ from the one-sequence forwards
#: these helpers record with, for the same float32 model: GEMMs of other shapes round differently on
#: some CPUs (4.8e-7 seen on an AMD EPYC, exactly 0 on others). A misaligned token, a wrong key or a
#: perturbed model differs by orders of magnitude more.
FORWARD_NOISE = 1e-5


@torch.no_grad()
def reference_logprobs(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """``[L]`` log-probs of one unpadded sequence: element t = log p(tokens[t] | tokens[:t]), 0 at t=0."""
    logp = torch.log_softmax(model(tokens[None]).logits.float(), dim=-1)[0]
    out = torch.zeros(len(tokens))
    out[1:] = logp[:-1].gather(-1, tokens[1:, None]).squeeze(-1)
    return out


def make_samples(n: int = 6, seed: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` (prompt, response) pairs of varying lengths."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        p = 3 + (i * 2) % 5
        r = 2 + (i * 3) % 6
        pairs.append((torch.randint(1, VOCAB, (p,), generator=g), torch.randint(1, VOCAB, (r,), generator=g)))
    return pairs


def verl_batch(model: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """verl's agent-loop output: prompts left-padded to P, responses right-padded to R."""
    P = max(len(p) for p, _ in pairs)
    R = max(len(r) for _, r in pairs)
    B = len(pairs)
    prompts = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    rollout_log_probs = torch.zeros(B, R)
    for i, (p, r) in enumerate(pairs):
        prompts[i, P - len(p):] = p
        responses[i, : len(r)] = r
        attention[i, P - len(p): P + len(r)] = 1
        response_mask[i, : len(r)] = 1
        rollout_log_probs[i, : len(r)] = reference_logprobs(model, torch.cat([p, r]))[len(p):]
    return {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention, "response_mask": response_mask, "rollout_log_probs": rollout_log_probs,
    }


def roll_batch(model: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """ROLL agentic: right-padded sequences [B, L], infer_logprobs = token-aligned[:, 1:]."""
    L = max(len(p) + len(r) for p, r in pairs) + 2
    B = len(pairs)
    ids = torch.zeros(B, L, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.long)
    response_mask = torch.zeros(B, L, dtype=torch.long)
    full = torch.zeros(B, L)
    for i, (p, r) in enumerate(pairs):
        seq = torch.cat([p, r])
        ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
        response_mask[i, len(p): len(seq)] = 1
        full[i, len(p): len(seq)] = reference_logprobs(model, seq)[len(p):]
    return {"input_ids": ids, "attention_mask": attention, "response_mask": response_mask,
            "infer_logprobs": full[:, 1:]}


def areal_batch(model: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Any]:
    """AReaL: one trajectory dict per sample ([1, L], logprobs aligned with input_ids), a rejected None."""
    out: list[Any] = []
    for p, r in pairs:
        seq = torch.cat([p, r])
        logprobs = reference_logprobs(model, seq)
        logprobs[: len(p)] = 0.0
        loss_mask = torch.zeros(len(seq), dtype=torch.int32)
        loss_mask[len(p):] = 1
        out.append({"input_ids": seq.to(torch.int32)[None], "loss_mask": loss_mask[None],
                    "logprobs": logprobs[None], "attention_mask": torch.ones(1, len(seq), dtype=torch.bool),
                    "rewards": torch.tensor([0.5])})
    out.insert(1, None)
    return out


def slime_samples(model: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """slime's debug dump: ``{"rollout_id", "samples": [Sample.to_dict(), ...]}``."""
    samples = []
    for i, (p, r) in enumerate(pairs):
        seq = torch.cat([p, r])
        samples.append({
            "index": i, "prompt": f"prompt {i}", "response": f"response {i}", "tokens": seq.tolist(),
            "response_length": len(r), "reward": 1.0, "loss_mask": [1] * len(r),
            "rollout_log_probs": reference_logprobs(model, seq)[len(p):].tolist(), "status": "completed",
        })
    return {"rollout_id": 0, "samples": samples}


def object_column(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
