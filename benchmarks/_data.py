"""A realistic verl ``DataProto`` for the benchmarks (shared by the scripts in this folder)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: name -> (batch size, prompt length, response length); ~186 KB of tensor data per sample.
SIZES: dict[str, tuple[int, int, int]] = {
    "small": (104, 1024, 3072),  # ~20 MB
    "medium": (1812, 1024, 3072),  # ~0.35 GB
    "large": (4096, 1024, 3072),  # ~0.78 GB
}

#: bytes per sample of the (prompt 1024, response 3072) shape: tensors + ~2.4 KB of strings.
SAMPLE_BYTES = 3 * 4096 * 8 + 3072 * 8 + 3072 * 4 * 5 + 3072 * 2 + 2665


def samples_for(nbytes: int) -> int:
    """The batch size whose DataProto holds about ``nbytes`` (at least one sample)."""
    return max(1, round(nbytes / SAMPLE_BYTES))


def make_dataproto(size: str | int, seed: int = 0) -> Any:
    """``size``: a name in :data:`SIZES` or a number of samples (prompt 1024, response 3072).

    10 tensors (int64 ids/masks/positions, float32 log-probs/values/advantages, a bfloat16
    tensor), object arrays of uid and raw prompt strings, and meta_info, as verl builds them."""
    from tensordict import TensorDict
    from verl.protocol import DataProto

    batch, prompt, response = SIZES[size] if isinstance(size, str) else (size, 1024, 3072)
    length = prompt + response
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 150_000, (batch, length), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, length, dtype=torch.int64)
    floats = lambda: torch.randn(batch, response, generator=gen)  # noqa: E731
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.arange(length, dtype=torch.int64).expand(batch, length).contiguous(),
        "responses": ids[:, prompt:].clone(),
        "old_log_probs": floats(),
        "ref_log_prob": floats(),
        "values": floats(),
        "advantages": floats(),
        "returns": floats(),
        "rollout_log_probs": floats().to(torch.bfloat16),
    }
    rng = np.random.default_rng(seed)
    words = np.array(["the", "a", "solve", "for", "x", "prove", "that", "integer", "sum", "of"])
    uid = np.array([f"{i // 8:08x}-uid" for i in range(batch)], dtype=object)
    raw = np.array(
        [" ".join(rng.choice(words, 600)) for _ in range(batch)], dtype=object
    )  # ~2.4 KB of text per sample
    return DataProto(
        batch=TensorDict(tensors, batch_size=[batch]),
        non_tensor_batch={"uid": uid, "raw_prompt": raw},
        meta_info={"global_step": 1, "temperature": 1.0, "eos_token_id": 2},
    )


def tensor_bytes(data: Any) -> int:
    return sum(t.numel() * t.element_size() for t in data.batch.values())


def object_bytes(data: Any) -> int:
    return sum(len(str(x)) for arr in data.non_tensor_batch.values() for x in arr)


def clone_all(data: Any) -> list[torch.Tensor]:
    """One in-memory copy of every tensor: the baseline for the dump-mode call."""
    return [t.clone() for t in data.batch.values()]
