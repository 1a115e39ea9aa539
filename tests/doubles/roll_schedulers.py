"""Test doubles for ROLL's two rollout schedulers (ROLL 8eb27cc2, v0.3.0+). Own code.

Real classes / call shapes reproduced:
  * agentic: roll.distributed.scheduler.rollout_scheduler.RolloutScheduler(RolloutMockMixin)
        __init__(self, config, env_manager_config, resource_manager, infer_cluster, mode, collator=None)
        async def get_batch(self, data: DataProto, batch_size) -> DataProto | None
        global_step comes from data.meta_info["global_step"]; returns None if no trajectories.
        Driver: ray.remote(RolloutScheduler).options(name="RolloutScheduler-train"|"RolloutScheduler-val", ...)
                batch = ray.get(sched.get_batch.remote(batch, rollout_batch_size))
  * RLVR:    roll.distributed.scheduler.generate_scheduler.DynamicSamplingScheduler(RolloutMockMixin)
        __init__(self, pipeline_config, actor_cluster, reward_clusters, dataset, collect_fn_cls,
                 collect_fn_kwargs, state=None, is_val=False, get_data_item_kwargs=None)
        async def get_batch(self, data: DataProto, global_step: int, batch_size: int) -> DataProto
        rows = batch_size * data.meta_info["generation_config"]["num_return_sequences"].
        Driver: one UNNAMED actor per domain (ray.remote(DSS).options(scheduling_strategy=...)),
                refs[domain] = s.get_batch.remote(data=batch, global_step=step, batch_size=domain_bs)
                then DataProto.concat([ray.get(r) for r in refs.values()]) (dict insertion order).
  * Both inherit RolloutMockMixin: dump/mock file = {dump_dir}/{mode}/step_{global_step:06d}.pkl,
    mode = self.mode ("train"/"val") or "val" if self.is_val else "train"; pickle.HIGHEST_PROTOCOL;
    dump happens on the merged local batch *before* DataProto.to_remote. Per-domain RLVR
    schedulers all share {dump_dir}/train, so with >1 domain they overwrite each other.

Import DataProto from the installed double (see roll_protocol.py) or pass ``dataproto_cls``.
"""
import asyncio
import os
import pickle
import time
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RolloutMockConfig:  # roll.configs.base_config.RolloutMockConfig
    enable: bool = False
    mode: str = "dump"  # Literal["dump", "mock"]
    dump_dir: str = "./rollout_mock_dumps"


@dataclass
class PipelineConfig:  # the few BaseConfig fields the doubles read
    seed: int = 0
    sequence_length: int = 16
    prompt_length: int = 8
    rollout_mock: RolloutMockConfig | None = None
    extra: dict = field(default_factory=dict)


def _dp_cls():
    from roll.distributed.scheduler.protocol import DataProto
    return DataProto


class RolloutMockMixinDouble:
    """Same file layout/semantics as roll/distributed/scheduler/rollout_mock_mixin.py."""

    def _init_rollout_mock(self):
        cfg = getattr(self, "config", None) or getattr(self, "pipeline_config", None)
        self.mock_config = getattr(cfg, "rollout_mock", None) if cfg is not None else None
        if self.mock_config and self.mock_config.enable:
            os.makedirs(os.path.join(self.mock_config.dump_dir, self._get_mode_str()), exist_ok=True)

    def _get_mode_str(self):
        if hasattr(self, "mode"):
            return self.mode
        return "val" if self.is_val else "train"

    def _mock_path(self, global_step):
        return os.path.join(self.mock_config.dump_dir, self._get_mode_str(), f"step_{global_step:06d}.pkl")

    def _should_load_mock(self, global_step):
        return bool(self.mock_config and self.mock_config.enable and self.mock_config.mode == "mock")

    async def _maybe_dump_batch(self, batch, global_step):
        if self.mock_config and self.mock_config.enable and self.mock_config.mode == "dump":
            with open(self._mock_path(global_step), "wb") as f:
                pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)

    async def _load_mock_batch(self, global_step):
        path = self._mock_path(global_step)
        if not os.path.exists(path):
            raise FileNotFoundError(f"[RolloutMock] Mock file not found: {path}")
        with open(path, "rb") as f:
            return pickle.load(f)


def _rows(seed, step, n, seq_len, prompt_len):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    input_ids = torch.randint(3, 1000, (n, seq_len), generator=g)
    resp_len = torch.randint(1, seq_len - prompt_len + 1, (n,), generator=g)
    pos = torch.arange(seq_len).unsqueeze(0)
    attention_mask = (pos < (prompt_len + resp_len).unsqueeze(1)).long()
    prompt_mask = (pos < prompt_len).expand(n, -1).clone()
    response_mask = attention_mask.bool() & ~prompt_mask
    logp = -torch.rand(n, seq_len, generator=g) * response_mask
    return input_ids, attention_mask, prompt_mask, response_mask, logp


class RolloutScheduler(RolloutMockMixinDouble):
    def __init__(self, config, env_manager_config=None, resource_manager=None, infer_cluster=None,
                 mode="train", collator=None, dataproto_cls=None):
        self.config, self.env_manager_config, self.mode = config, env_manager_config, mode
        self.DataProto = dataproto_cls or _dp_cls()
        self.calls = []
        self._init_rollout_mock()

    async def get_batch(self, data, batch_size):
        global_step = data.meta_info["global_step"]
        self.calls.append((global_step, batch_size))
        if self._should_load_mock(global_step):
            return await self._load_mock_batch(global_step)
        await asyncio.sleep(0)
        n = max(int(batch_size), 1)
        c = self.config
        ids, am, pm, rm, logp = _rows(c.seed, global_step, n, c.sequence_length, c.prompt_length)
        scores = torch.zeros(n, c.sequence_length)
        scores[:, -1] = torch.arange(n, dtype=torch.float)
        def obj(xs):  # 1-D object array even when the items are lists (np.array would make 2-D)
            items = list(xs)
            arr = np.empty(len(items), dtype=object)
            arr[:] = items
            return arr
        batch = self.DataProto.from_single_dict({
            "input_ids": ids, "attention_mask": am, "position_ids": (am.cumsum(-1) - 1).clamp(min=0),
            "response_mask": rm, "prompt_mask": pm, "scores": scores, "infer_logprobs": logp[:, 1:],
            "env_ids": obj(range(n)), "group_ids": obj(i // 2 for i in range(n)), "tags": obj(["SimpleSokoban"] * n),
            "traj_id": obj(f"{self.mode}_{global_step}_{i}" for i in range(n)),
            "step_scores": obj([float(i)] for i in range(n)), "episode_scores": obj(float(i) for i in range(n)),
        })
        batch.meta_info["metrics"] = {"env/response_length": [float(rm.sum(-1).float().mean())]}
        batch.meta_info["get_batch_return_start_time"] = time.time()
        await self._maybe_dump_batch(batch, global_step)
        return batch

    async def suspend(self):
        pass

    async def shutdown(self):
        pass


class DynamicSamplingScheduler(RolloutMockMixinDouble):
    def __init__(self, pipeline_config, actor_cluster=None, reward_clusters=None, dataset=None,
                 collect_fn_cls=None, collect_fn_kwargs=None, state=None, is_val=False,
                 get_data_item_kwargs=None, dataproto_cls=None):
        self.pipeline_config, self.is_val = pipeline_config, is_val
        self.reward_clusters = reward_clusters or {"math_rule": None}
        self.DataProto = dataproto_cls or _dp_cls()
        self.calls = []
        self._init_rollout_mock()

    async def get_batch(self, data, global_step, batch_size):
        self.calls.append((global_step, batch_size))
        if self._should_load_mock(global_step):
            return await self._load_mock_batch(global_step)
        await asyncio.sleep(0)
        nrs = data.meta_info.get("generation_config", {}).get("num_return_sequences", 1)
        n = batch_size * nrs
        c = self.pipeline_config
        ids, am, pm, rm, logp = _rows(c.seed + len(self.reward_clusters), global_step, n, c.sequence_length, c.prompt_length)
        domain = next(iter(self.reward_clusters))
        batch = self.DataProto.from_single_dict({
            "prompts": ids[:, :c.prompt_length], "responses": ids[:, c.prompt_length:], "input_ids": ids,
            "attention_mask": am, "position_ids": (am.cumsum(-1) - 1).clamp(min=0), "prompt_mask": pm,
            "response_mask": rm, "infer_logprobs": logp[:, 1:], "scores": torch.rand(n),
            "prompt_id": torch.arange(n) // nrs,
            "domain": np.array([domain] * n, dtype=object), "tag": np.array([domain] * n, dtype=object),
        }, meta_info={"metrics": {f"scheduler/{domain}/score/mean": 0.5}})
        await self._maybe_dump_batch(batch, global_step)
        return batch

    async def pause_sampling(self):
        pass

    async def shutdown(self):
        pass
