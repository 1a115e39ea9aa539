"""Log-prob consistency on batches in the layouts of ROLL, verl, AReaL and slime."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from debug_helpers import (  # noqa: E402
    FORWARD_NOISE,
    areal_batch,
    make_samples,
    roll_batch,
    slime_samples,
    tiny_model,
    verl_batch,
)

from rollout_mock.debug import LogprobKeys, logprob_consistency  # noqa: E402
from rollout_mock.debug.sequences import extract_sequences  # noqa: E402
from rollout_mock.errors import DebugInputError  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fixed_threads() -> Any:
    """The same-model checks compare batched and one-sequence forwards: both must run with the same
    CPU thread count, whatever earlier tests set (the demo pins 1 thread). Restored afterwards."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


@pytest.fixture(scope="module")
def pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return make_samples()


def _response_tokens(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(len(r) for _, r in pairs)


@pytest.mark.parametrize(
    ("builder", "layout", "logprob_key"),
    [
        (verl_batch, "verl", "rollout_log_probs"),
        (roll_batch, "roll", "infer_logprobs"),
        (areal_batch, "areal", "logprobs"),
        (slime_samples, "slime", "rollout_log_probs"),
    ],
)
def test_same_model_gives_zero_difference(model: Any, pairs: Any, builder: Any, layout: str, logprob_key: str) -> None:
    batch = builder(model, pairs)
    report = logprob_consistency(batch, model, threshold=1.0 + FORWARD_NOISE)
    assert report.layout == layout
    assert report.keys["logprobs"] == logprob_key
    assert report.tokens == _response_tokens(pairs)  # every response token, no prompt token
    assert report.max_abs_diff <= FORWARD_NOISE
    assert report.mean_abs_diff <= FORWARD_NOISE
    assert report.token_mult_prob_error == pytest.approx(1.0, abs=FORWARD_NOISE)
    assert report.ok
    if layout == "areal":
        assert report.steps[0].rejected == 1


def test_alignment_off_by_one_is_caught(model: Any, pairs: Any) -> None:
    """Log-probs recorded one position late (a classic bug) must not look consistent."""
    batch = verl_batch(model, pairs)
    batch["rollout_log_probs"] = torch.roll(batch["rollout_log_probs"], 1, dims=1)
    report = logprob_consistency(batch, model)
    assert report.max_abs_diff > 0.1
    assert report.token_mult_prob_error > 1.05
    assert not report.ok


def test_perturbed_recording_finds_the_worst_token(model: Any, pairs: Any) -> None:
    batch = roll_batch(model, pairs)
    p, r = pairs[2]
    position = len(p) + 1  # second response token of sample 2
    batch["infer_logprobs"][2, position - 1] += 0.5  # shifted: column t-1 is token t
    report = logprob_consistency({3: batch}, model, top=3)
    assert report.steps[0].step == 3
    assert report.max_abs_diff == pytest.approx(0.5, abs=1e-6)
    worst = report.worst_tokens[0]
    assert (worst.step, worst.sample, worst.position, worst.token) == (3, 2, position, int(r[1]))
    assert report.worst_samples[0].sample == 2
    n = _response_tokens(pairs)
    assert report.token_mult_prob_error == pytest.approx((n - 1 + math.exp(0.5)) / n, rel=1e-6)
    assert report.ok  # 1.03 is within NeMo-RL's 1.05
    assert not logprob_consistency(batch, model, max_abs_threshold=0.4).ok


def test_mask_excludes_tokens(model: Any, pairs: Any) -> None:
    batch = verl_batch(model, pairs)
    batch["rollout_log_probs"][0, 0] += 5.0
    batch["response_mask"][0, 0] = 0
    report = logprob_consistency(batch, model)
    assert report.max_abs_diff <= FORWARD_NOISE
    assert report.tokens == _response_tokens(pairs) - 1


def test_keys_can_be_named(model: Any, pairs: Any) -> None:
    batch = verl_batch(model, pairs)
    batch["engine_lp"] = batch.pop("rollout_log_probs")
    with pytest.raises(DebugInputError, match="no log-prob key"):
        logprob_consistency(batch, model)
    report = logprob_consistency(batch, model, keys="logprobs=engine_lp,mask=response_mask")
    assert report.keys == {"logprobs": "engine_lp", "tokens": "input_ids", "mask": "response_mask"}
    assert report.max_abs_diff <= FORWARD_NOISE
    with pytest.raises(DebugInputError, match="NAME=KEY"):
        LogprobKeys.parse("logprob=x")
    with pytest.raises(DebugInputError, match="no such key"):
        logprob_consistency(batch, model, keys="logprobs=engine_lp,mask=nope")


def test_real_verl_dataproto(model: Any, pairs: Any) -> None:
    protocol = pytest.importorskip("verl.protocol")
    batch = verl_batch(model, pairs)
    data = protocol.DataProto.from_dict(tensors=batch)
    report = logprob_consistency(data, model)
    assert report.layout == "verl" and report.max_abs_diff <= FORWARD_NOISE
    assert report.tokens == _response_tokens(pairs)


def test_roll_style_proxy_is_read_without_len(model: Any, pairs: Any) -> None:
    """ROLL's DataProto hands out a proxy without __len__/__iter__: its TensorDict is read instead."""
    from tensordict import TensorDict

    class Proxy:
        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    class RollDataProto:
        def __init__(self, batch: TensorDict) -> None:
            self._batch = batch
            self._non_tensor_batch: dict[str, Any] = {}
            self.meta_info: dict[str, Any] = {}

        @property
        def batch(self) -> Proxy:
            return Proxy()

        @property
        def non_tensor_batch(self) -> Proxy:
            return Proxy()

    tensors = roll_batch(model, pairs)
    data = RollDataProto(TensorDict(tensors, batch_size=[len(pairs)]))
    report = logprob_consistency(data, model)
    assert report.layout == "roll" and report.max_abs_diff <= FORWARD_NOISE


def test_callable_returning_logprobs_is_used_as_is(model: Any, pairs: Any) -> None:
    batch = verl_batch(model, pairs)
    calls: list[tuple[int, ...]] = []

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(input_ids.shape))
        return torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)

    report = logprob_consistency(batch, fn, batch_size=4)
    assert report.max_abs_diff <= FORWARD_NOISE
    assert len(calls) == 2 and calls[0][0] == 4  # 6 sequences, 4 at a time


def test_report_json_is_strict(model: Any, pairs: Any) -> None:
    batch = slime_samples(model, pairs)
    batch["samples"][0]["rollout_log_probs"][0] = float("nan")
    report = logprob_consistency(batch, model)
    text = json.dumps(report.to_json(), allow_nan=False)
    data = json.loads(text)
    assert data["max_abs_diff"] == "Infinity"  # a NaN log-prob is a maximal error, never hidden
    assert data["ok"] is False


def test_extraction_positions_follow_the_attention_mask(model: Any, pairs: Any) -> None:
    extraction = extract_sequences(verl_batch(model, pairs))
    p, r = pairs[0]
    seq = extraction.sequences[0]
    assert seq.tokens.tolist() == torch.cat([p, r]).tolist()  # left padding removed
    assert seq.positions.tolist() == list(range(len(p), len(p) + len(r)))


def test_nothing_to_compare_is_an_error(model: Any, pairs: Any) -> None:
    batch = verl_batch(model, pairs)
    batch["response_mask"].zero_()
    with pytest.raises(DebugInputError, match="no response tokens"):
        logprob_consistency(batch, model)
