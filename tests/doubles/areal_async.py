"""Test double of AReaL's asynchronous rollout (areal.core.workflow_executor / RemoteInfEngine
shapes). Own code.

Real behaviour reproduced:
- ``submit(data, workflow, ...)`` queues one prompt and returns at once; a producer thread starts
  rollouts while the staleness bound allows: ``capacity = (max_head_offpolicyness + version + 1)
  * consumer_batch_size - (accepted + running)``; each trajectory is put in the output queue when
  it finishes (finish order is random: two producer threads, random per-token delays seeded from
  ``os.urandom``, so every process has its own timing).
- ``wait(count)`` blocks until ``count`` trajectories finished and returns the first ``count`` in
  finish order (a list of trajectory dicts).
- ``rollout_batch(data, workflow)``: submits every item, returns ``wait(len(data))``.
- ``prepare_batch(dataloader, workflow)``: submits dataloader batches while there is capacity,
  then returns ``wait(dataloader.batch_size)``.
- ``set_version(v)`` / ``get_version()``: the weight version; every generated token records the
  version current when it was generated (``versions`` int32 [group, L], -1 on prompt tokens),
  so a trajectory can span several versions (partial rollouts across weight updates).
- A trajectory: ``input_ids`` int32 [group, L], ``loss_mask`` int32, ``logprobs`` float32,
  ``versions`` int32, ``attention_mask`` bool, ``rewards`` float32 [group].
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from typing import Any

import torch

VOCAB = 32


class AsyncRolloutEngine:
    def __init__(self, *, batch_size: int, max_head_offpolicyness: int, group: int = 2) -> None:
        self.batch_size = batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self.group = group
        self.version = 0
        self.generated = 0
        self.max_staleness_seen = 0
        self._random = random.Random(os.urandom(8))
        self._cond = threading.Condition()
        self._pending: deque[Any] = deque()
        self._done: list[dict[str, Any]] = []
        self._accepted = 0
        self._running = 0
        self._data_iter: Any = None
        self._closed = False
        self._threads = [threading.Thread(target=self._producer, daemon=True) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def destroy(self) -> None:
        """Stop the producer threads (AReaL's engine.destroy()); a thread left running at
        interpreter exit can abort the process inside torch."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- AReaL's InferenceEngine surface
    def set_version(self, version: int) -> None:
        with self._cond:
            self.version = int(version)
            self._cond.notify_all()

    def get_version(self) -> int:
        return self.version

    def get_capacity(self) -> int:
        return (self.max_head_offpolicyness + self.version + 1) * self.batch_size - (self._accepted + self._running)

    def submit(self, data: dict[str, Any], workflow: Any = None, workflow_kwargs: Any = None,
               should_accept_fn: Any = None) -> None:
        with self._cond:
            self._pending.append(data)
            self._cond.notify_all()

    def wait(self, count: int, timeout: float | None = None, raise_timeout: bool = True) -> list[Any]:
        with self._cond:
            self._cond.wait_for(lambda: len(self._done) >= count)
            out, self._done = self._done[:count], self._done[count:]
            return out

    def rollout_batch(self, data: list[dict[str, Any]], workflow: Any = None, workflow_kwargs: Any = None,
                      should_accept_fn: Any = None) -> list[Any]:
        for item in data:
            self.submit(item, workflow)
        return self.wait(len(data))

    def prepare_batch(self, dataloader: Any, workflow: Any = None, workflow_kwargs: Any = None,
                      should_accept_fn: Any = None) -> list[Any]:
        if self._data_iter is None:
            self._data_iter = iter(dataloader)
        while True:
            with self._cond:
                room = self.get_capacity() - len(self._pending) >= dataloader.batch_size
                ready = len(self._done) >= dataloader.batch_size
            if ready:
                return self.wait(dataloader.batch_size)
            if room:
                for item in next(self._data_iter):
                    self.submit(item, workflow)
            else:
                with self._cond:
                    self._cond.wait_for(lambda: len(self._done) >= dataloader.batch_size
                                        or self.get_capacity() - len(self._pending) >= dataloader.batch_size)

    # -- the producer
    def _producer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._pending and self.get_capacity() > 0))
                if self._closed:
                    return
                data = self._pending.popleft()
                self._running += 1
            trajectory = self._rollout(data)
            with self._cond:
                self._running -= 1
                self._accepted += 1
                self.generated += 1
                self._done.append(trajectory)
                self._cond.notify_all()

    def _rollout(self, data: dict[str, Any]) -> dict[str, Any]:
        prompt = [int(t) for t in data["prompt"]]
        rows, versions, rewards = [], [], []
        for g in range(self.group):
            tokens, token_versions = [], []
            for position in range(2 + (sum(prompt) + g) % 3):
                time.sleep(self._random.random() * 0.003)
                version = self.version
                tokens.append((sum(prompt) * 3 + g * 7 + position * 5 + version * 11) % (VOCAB - 1) + 1)
                token_versions.append(version)
            rows.append(prompt + tokens)
            versions.append([-1] * len(prompt) + token_versions)
            rewards.append(float(tokens[-1] % 2))
        width = max(len(r) for r in rows)
        input_ids = torch.zeros(self.group, width, dtype=torch.int32)
        loss_mask = torch.zeros(self.group, width, dtype=torch.int32)
        version_t = torch.full((self.group, width), -1, dtype=torch.int32)
        attention = torch.zeros(self.group, width, dtype=torch.bool)
        for i, row in enumerate(rows):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
            loss_mask[i, len(prompt):len(row)] = 1
            version_t[i, :len(row)] = torch.tensor(versions[i], dtype=torch.int32)
            attention[i, :len(row)] = True
        return {"input_ids": input_ids, "loss_mask": loss_mask, "logprobs": torch.zeros(self.group, width),
                "versions": version_t, "attention_mask": attention, "rewards": torch.tensor(rewards)}


class Loader:
    """A dataloader of prompt dicts (``batch_size`` per batch, cycling)."""

    def __init__(self, prompts: list[list[int]], batch_size: int) -> None:
        self.prompts = prompts
        self.batch_size = batch_size

    def __iter__(self) -> Any:
        i = 0
        while True:
            yield [{"prompt": self.prompts[(i + k) % len(self.prompts)]} for k in range(self.batch_size)]
            i += self.batch_size
