"""Test double for slime's rollout side (THUDM/slime 624b824a). Own code.

Real locations:
  slime.utils.types.Sample                       (@dataclass; to_dict()/from_dict())
  slime.rollout.base_types.RolloutFnTrainOutput  (samples: list[list[Sample]], metrics: dict = None)
  slime.rollout.base_types.RolloutFnEvalOutput   (data: dict[str, dict[str, Any]], metrics: dict = None)
  slime.rollout.base_types.call_rollout_fn(fn, *args, evaluation, **kw)  wraps legacy bare returns
  slime.rollout.sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=False)
      -> RolloutFnTrainOutput | RolloutFnEvalOutput        (default of --rollout-function-path;
         --eval-function-path defaults to the same function); a train rollout takes its prompts
         from data_source.get_samples(args.rollout_batch_size)
  slime.rollout.data_source.RolloutDataSource(args): epoch_id, sample_group_index, sample_index,
      sample_offset (all 0 at start); get_samples(n) hands out the next n prompts (wrapping into the
      next epoch), each as a group of args.n_samples_per_prompt copies numbered by group_index /
      index; save(rollout_id)/load(rollout_id) persist those four counters with the checkpoint.
  slime.observability.rollout_data_utils.save_debug_rollout_data / load_debug_rollout_data
      --save-debug-rollout-data TEMPLATE: torch.save({"rollout_id": int, "samples": [Sample.to_dict()...]},
      Path(TEMPLATE.format(rollout_id=id or f"eval_{id}"))); train samples are the FLATTENED list;
      eval samples are [s for info in data.values() for s in info["samples"]].
      --dump-details DIR sets it to f"{DIR}/rollout_data/{{rollout_id}}.pt".
      --load-debug-rollout-data TEMPLATE forces debug_train_only (no sglang) and returns
      [Sample.from_dict(d) for d in torch.load(path, weights_only=False)["samples"]].
"""
import itertools
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt + response token ids
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0  # response = tokens[-response_length:]
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # len == response_length (None -> all ones)
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # len == response_length
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self):  # shallow copy of __dict__ (extra attributes included), enums/nested -> plain
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = dict(vars(self.spec_info))
        value["prefix_cache_info"] = dict(vars(self.prefix_cache_info))
        return value

    @staticmethod
    def from_dict(data: dict):
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo(**data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo(**data.get("prefix_cache_info", {}))
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(sample, k, v)
        return sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = None


def call_rollout_fn(fn, *args, evaluation: bool, **kwargs):
    output = fn(*args, **kwargs, evaluation=evaluation)
    if not isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        output = RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
    return output


def _fake_sample(group, i, rollout_id, prompt_len=4, resp_len=3):
    g = torch.Generator().manual_seed(rollout_id * 7919 + group * 31 + i)
    toks = torch.randint(3, 500, (prompt_len + resp_len,), generator=g).tolist()
    return Sample(group_index=group, index=group * 1000 + i, prompt=f"p{group}", tokens=toks,
                  response=f"r{group}.{i}", response_length=resp_len, label="1", reward=float(i % 2),
                  loss_mask=[1] * resp_len, status=Sample.Status.COMPLETED,
                  rollout_log_probs=(-torch.rand(resp_len, generator=g)).tolist())


class RolloutDataSource:
    """The position bookkeeping of slime's RolloutDataSource over an in-memory prompt list."""

    def __init__(self, args, prompts=None):
        self.args = args
        self.epoch_id = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.sample_offset = 0
        self.metadata = {}
        self.prompts = list(prompts) if prompts is not None else [f"prompt {i}" for i in range(10)]

    def get_samples(self, num_samples):
        taken = self.prompts[self.sample_offset:self.sample_offset + num_samples]
        if len(taken) == num_samples:
            self.sample_offset += num_samples
        else:  # the rest of this epoch, then the start of the next
            self.epoch_id += 1
            rest = num_samples - len(taken)
            taken += self.prompts[:rest]
            self.sample_offset = rest
        groups = []
        for prompt in taken:
            group = []
            for _ in range(getattr(self.args, "n_samples_per_prompt", 2)):
                group.append(Sample(prompt=prompt, group_index=self.sample_group_index, index=self.sample_index))
                self.sample_index += 1
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def state_dict(self):  # what save(rollout_id) torch.saves
        return {"sample_offset": self.sample_offset, "epoch_id": self.epoch_id,
                "sample_group_index": self.sample_group_index, "sample_index": self.sample_index,
                "metadata": self.metadata}

    def load_state_dict(self, state):  # what load(rollout_id) restores
        for key in ("sample_offset", "epoch_id", "sample_group_index", "sample_index", "metadata"):
            setattr(self, key, state[key])


def _generated(sample, rollout_id, resp_len=3):
    g = torch.Generator().manual_seed(rollout_id * 7919 + sample.index)
    prompt_tokens = [3 + (ord(c) % 400) for c in sample.prompt][:4]
    sample.tokens = prompt_tokens + torch.randint(3, 500, (resp_len,), generator=g).tolist()
    sample.response, sample.response_length, sample.label = f"r{sample.index}", resp_len, "1"
    sample.reward, sample.loss_mask, sample.status = float(sample.index % 2), [1] * resp_len, Sample.Status.COMPLETED
    sample.rollout_log_probs = (-torch.rand(resp_len, generator=g)).tolist()
    sample.non_generation_time = float(torch.rand(1).item())  # a wall time: differs run to run
    return sample


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """Same signature/return types as slime.rollout.sglang_rollout.generate_rollout (no sglang)."""
    n = getattr(args, "n_samples_per_prompt", 2)
    if evaluation:
        samples = [_fake_sample(g, 0, rollout_id) for g in range(getattr(args, "n_eval", 2))]
        return RolloutFnEvalOutput(data={"eval_ds": {"rewards": [s.reward for s in samples],
                                                    "truncated": [False] * len(samples), "samples": samples}})
    if data_source is not None:
        groups = [[_generated(s, rollout_id) for s in group] for group in data_source.get_samples(args.rollout_batch_size)]
    else:
        groups = [[_fake_sample(g, i, rollout_id) for i in range(n)] for g in range(args.rollout_batch_size)]
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout/fake": 1.0})


def flatten(samples):  # what RolloutManager._get_rollout_data does before saving
    while samples and isinstance(samples[0], list):
        samples = list(itertools.chain.from_iterable(samples))
    return samples


def save_debug_rollout_data(path_template, data, *, rollout_id: int, evaluation: bool) -> None:
    """Writes exactly what slime's --save-debug-rollout-data writes."""
    if path_template is None:
        return
    path = Path(path_template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if evaluation:
        samples = [s.to_dict() for info in data.values() for s in info["samples"]]
    else:
        samples = [s.to_dict() for s in data]
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)


def load_debug_rollout_data(path_template, *, rollout_id: int) -> list[Sample]:
    raw = torch.load(path_template.format(rollout_id=rollout_id), weights_only=False)["samples"]
    return [Sample.from_dict(d) for d in raw]
