"""Test double for AReaL's remote-tensor handles (areal-project/AReaL cbff54d6, areal 1.0.x). Own code.

Real location and shape: areal.infra.rpc.rtensor
  @dataclass TensorShardInfo: shard_id (a uuid string from the backend's store()), node_addr ("host:port")
  @dataclass RTensor: shard: TensorShardInfo, data: torch.Tensor (device "meta" until fetched)
      to_local() -> torch.Tensor: data if not meta, else the client-side fetch buffer, else
          get_backend().fetch([shard])[0] (HTTP GET of the shard from the worker at node_addr)
      RTensor.remotize(obj, node_addr): tensors (detached, on the CPU) stored with the backend and
          replaced by RTensor(shard, tensor.to("meta")), recursively through dicts, lists, tuples
      RTensor.localize(obj): every RTensor replaced by its local tensor (batched fetch)
  The single controller's rollout_batch/prepare_batch return trajectory dicts of RTensors; the
  shards live on the rollout workers and are dropped when those clear their buffers.

Here the "workers" are one in-process dict (:data:`SHARDS`); :func:`clear_shards` is a worker
dropping its buffer (a later to_local() then fails, as an HTTP 404 would).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import torch

#: shard_id -> tensor, what the rollout workers hold
SHARDS: dict[str, torch.Tensor] = {}


class ShardFetchError(RuntimeError):
    """What the HTTP backend raises for a shard the worker no longer has."""


def clear_shards() -> None:
    SHARDS.clear()


@dataclass
class TensorShardInfo:
    shard_id: Any
    node_addr: str


@dataclass
class RTensor:
    shard: TensorShardInfo
    data: torch.Tensor

    def to_local(self) -> torch.Tensor:
        if not self.data.is_meta:
            return self.data
        if self.shard.shard_id not in SHARDS:
            raise ShardFetchError(f"shard {self.shard.shard_id} not found on {self.shard.node_addr}")
        self.data = SHARDS[self.shard.shard_id].clone()
        return self.data

    @staticmethod
    def remotize(obj: Any, node_addr: str) -> Any:
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu()
            shard_id = str(uuid.uuid4())
            SHARDS[shard_id] = tensor
            return RTensor(shard=TensorShardInfo(shard_id=shard_id, node_addr=node_addr), data=tensor.to("meta"))
        if isinstance(obj, dict):
            return {k: RTensor.remotize(v, node_addr) for k, v in obj.items()}
        if isinstance(obj, list):
            return [RTensor.remotize(v, node_addr) for v in obj]
        if isinstance(obj, tuple):
            return tuple(RTensor.remotize(v, node_addr) for v in obj)
        return obj

    @staticmethod
    def localize(obj: Any) -> Any:
        if isinstance(obj, RTensor):
            return obj.to_local()
        if isinstance(obj, dict):
            return {k: RTensor.localize(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [RTensor.localize(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(RTensor.localize(v) for v in obj)
        return obj
