"""What verl 0.9.1's V1 trainer needs around it to run its real code on a CPU. Own code.

The trainer classes (``verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync``,
``trainer_separate_async.PPOTrainerSeparateAsync``), their ``__init__`` (which builds the real
``ReplayBuffer``/``ReplayBufferAsync``), ``fit``, ``step``, ``_step_once``, ``_balance_batch``,
``_compute_old_log_prob``, ``_compute_advantage``, ``_update_actor``, ``_compute_metrics`` and the
replay buffer's sampling, eviction and refill are verl's own. Stand-ins replace what needs GPUs,
Ray or servers (what ``PPOTrainer._setup`` would build):

- :class:`AgentLoop`: ``AgentLoopManagerTQ.generate_sequences`` (returns ``None``; per prompt
  marks the prompt ``running``, generates ``rollout.n`` sessions and writes them as
  ``{uid}_{session}_0`` with ``AgentLoopWorkerTQ``'s fields and tags, then marks it ``finished``).
  Responses depend on the weight version current when each token is generated, and
  ``min_global_steps``/``max_global_steps`` record the versions spanned. Asynchronous mode: two
  worker threads with random delays (seeded from ``os.urandom``: each process has its own timing).
- :class:`ActorGroup`: the actor worker group on a tiny torch model: ``compute_log_prob`` writes
  full-sequence ``log_probs``/``entropy`` into the queue, ``update_actor`` reads ``input_ids``,
  ``response_mask``, ``advantages``, ``old_log_probs`` from it and takes one SGD step.
- :class:`Weights`: the checkpoint-engine managers (``update_weights`` sets the agent loop's
  version).
- missing optional imports of verl (``hydra``, ``torchdata``, ``codetiming``...) are stood in for
  by :func:`install_imports` only when they are not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import queue
import random
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any
from unittest import mock

import torch

_HERE = Path(__file__).resolve().parent
VOCAB = 32
OPTIONAL = ("hydra", "codetiming", "cachetools", "uvicorn", "fastapi", "torchdata", "peft")


class _Timer:
    """codetiming.Timer as verl's ``_timer`` uses it."""

    def __init__(self, name: str | None = None, logger: Any = None) -> None:
        self.last = 0.0

    def __enter__(self) -> _Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.last = time.perf_counter() - self._start


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = mock.MagicMock(name=spec.name)
        module.__path__ = []
        module.__spec__ = spec
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _instantiate(config: Any, _convert_: str = "partial", **kwargs: Any) -> Any:
    """hydra.utils.instantiate for verl's ``_target_`` dataclass configs."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=True)
    if isinstance(config, list):
        return [_instantiate(item) for item in config]
    if not isinstance(config, dict):
        return config
    values = {k: _instantiate(v) for k, v in config.items() if k != "_target_"}
    if "_target_" not in config:
        return values
    module, _, name = config["_target_"].rpartition(".")
    target = getattr(importlib.import_module(module), name)
    return target(**values, **kwargs)


def install_imports() -> None:
    """The transfer_queue double as ``transfer_queue``; stand-ins for verl's uninstalled optional
    imports (never needed on the code paths the tests run, except codetiming's ``Timer``)."""
    if getattr(sys.modules.get("transfer_queue"), "__file__", None) != str(_HERE / "transfer_queue.py"):
        spec = importlib.util.spec_from_file_location("transfer_queue", _HERE / "transfer_queue.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["transfer_queue"] = module
        spec.loader.exec_module(module)
    missing = {name for name in OPTIONAL if importlib.util.find_spec(name) is None}
    if "codetiming" in missing:
        codetiming = types.ModuleType("codetiming")
        codetiming.Timer = _Timer  # type: ignore[attr-defined]
        sys.modules["codetiming"] = codetiming
        missing.discard("codetiming")
    if "hydra" in missing:
        hydra = types.ModuleType("hydra")
        utils = types.ModuleType("hydra.utils")
        utils.instantiate = _instantiate  # type: ignore[attr-defined]
        hydra.utils = utils  # type: ignore[attr-defined]
        sys.modules["hydra"], sys.modules["hydra.utils"] = hydra, utils
        missing.discard("hydra")
    if "torchdata" in missing:
        stateful = types.ModuleType("torchdata.stateful_dataloader")
        stateful.StatefulDataLoader = torch.utils.data.DataLoader  # type: ignore[attr-defined]
        sys.modules["torchdata"] = types.ModuleType("torchdata")
        sys.modules["torchdata.stateful_dataloader"] = stateful
        missing.discard("torchdata")
    if missing and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.append(_StubFinder(missing))


def _value(td: Any, name: str, i: int | None = None) -> Any:
    value = td.get(name)
    if type(value).__name__ == "NonTensorData":
        return value.data
    if i is None:
        return value
    item = value[i]
    return getattr(item, "data", item) if not isinstance(item, torch.Tensor) else item


def _token(prompt: list[int], session: int, position: int, version: int) -> int:
    return (sum(prompt) * 7 + session * 13 + position * 5 + version * 11) % (VOCAB - 1) + 1


class AgentLoop:
    """``AgentLoopManagerTQ`` (see the module docstring)."""

    def __init__(self, n: int, *, asynchronous: bool) -> None:
        self.n = n
        self.version = 0
        self.asynchronous = asynchronous
        self.generated = 0
        self._random = random.Random(os.urandom(8))
        self._work: queue.Queue[Any] = queue.Queue()
        self._threads = []
        if asynchronous:
            for _ in range(2):
                thread = threading.Thread(target=self._worker, daemon=True)
                thread.start()
                self._threads.append(thread)

    def generate_sequences(self, prompts: Any) -> None:
        count = int(prompts.batch_size[0])
        validate = bool(_value(prompts, "validate")) if "validate" in prompts.keys() else False
        steps = int(_value(prompts, "global_steps"))
        for i in range(count):
            row = {"uid": str(_value(prompts, "uid", i)), "input_ids": prompts.get("input_ids")[i].tolist(),
                   "raw_prompt": _value(prompts, "raw_prompt", i), "global_steps": steps,
                   "partition": "val" if validate else "train"}
            if self.asynchronous:
                self._work.put(row)
            else:
                self._run(row)
        return None

    def _worker(self) -> None:
        while True:
            row = self._work.get()
            if row is None:
                return
            self._run(row)

    def close(self) -> None:
        """Stop the worker threads (prompts still queued are dropped); a thread left running at
        interpreter exit can abort the process inside torch."""
        while not self._work.empty():
            try:
                self._work.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()

    def _pause(self) -> None:
        if self.asynchronous:
            time.sleep(self._random.random() * 0.02)

    def _run(self, row: dict[str, Any]) -> None:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        tq = sys.modules["transfer_queue"]
        uid, partition = row["uid"], row["partition"]
        tq.kv_batch_put(keys=[uid], partition_id=partition, tags=[{"status": "running"}])
        prompt = [t for t in row["input_ids"] if t != 0]
        keys, fields, tags = [], [], []
        for session in range(self.n):
            start = self.version
            length = 2 + (sum(prompt) + session) % 4
            response = []
            for position in range(length):
                self._pause()
                response.append(_token(prompt, session, position, self.version))
            end = self.version
            prompts = torch.tensor(prompt, dtype=torch.int64)
            responses = torch.tensor(response, dtype=torch.int64)
            reward = torch.zeros(length)
            reward[-1] = float(response[-1] % 3 == 0) + 0.5 * float(session == 0)
            fields.append({
                "prompts": prompts, "responses": responses, "response_mask": torch.ones(length, dtype=torch.int64),
                "input_ids": torch.cat([prompts, responses]), "rm_scores": reward, "uid": uid,
                "session_id": session, "num_turns": 2, "raw_prompt": row["raw_prompt"],
                "global_steps": row["global_steps"],
                "extra_fields": {"min_global_steps": start, "max_global_steps": end, "reward_extra_info": {}},
            })
            keys.append(f"{uid}_{session}_0")
            tags.append({"status": "success", "prompt_len": len(prompt), "response_len": length,
                         "seq_len": len(prompt) + length, "global_steps": row["global_steps"],
                         "min_global_steps": start, "max_global_steps": end})
        tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id=partition)
        tq.kv_batch_put(keys=[uid], partition_id=partition, tags=[{"status": "finished"}])
        self.generated += 1


class Weights:
    """The checkpoint-engine managers: ``update_weights(global_steps)`` is the new version."""

    def __init__(self, loop: AgentLoop | None = None) -> None:
        self.loop = loop

    def update_weights(self, global_steps: int = 0) -> dict[str, Any]:
        if self.loop is not None:
            self.loop.version = int(global_steps)
        return {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class _Output(list):  # type: ignore[type-arg]
    pass


class ActorGroup:
    """The actor worker group (see the module docstring)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self._dispatch_info = {"actor": [0]}

    def _log_probs(self, sequence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(sequence[:-1]).log_softmax(-1)
        chosen = logits.gather(-1, sequence[1:, None])[:, 0]
        entropy = -(logits.exp() * logits).sum(-1)
        return torch.cat([chosen, torch.zeros(1)]), torch.cat([entropy, torch.zeros(1)])

    def compute_log_prob(self, batch: Any) -> Any:
        tq = sys.modules["transfer_queue"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        with torch.no_grad():
            pairs = [self._log_probs(seq) for seq in data["input_ids"].unbind(0)]
        fields = {"log_probs": torch.nested.as_nested_tensor([p[0] for p in pairs], layout=torch.jagged),
                  "entropy": torch.nested.as_nested_tensor([p[1] for p in pairs], layout=torch.jagged)}
        from tensordict import TensorDict

        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict(fields, batch_size=[len(batch.keys)]))
        return _Output(batch.keys)

    def update_actor(self, batch: Any) -> dict[str, Any]:
        tq = sys.modules["transfer_queue"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["input_ids", "response_mask", "advantages", "old_log_probs"])
        self.optimizer.zero_grad()
        losses = []
        for seq, mask, adv, old in zip(data["input_ids"].unbind(0), data["response_mask"].unbind(0),
                                       data["advantages"].unbind(0), data["old_log_probs"].unbind(0)):
            logp, _ = self._log_probs(seq)
            length = mask.shape[0]
            logp = logp[-length - 1:-1]
            ratio = (logp - old).exp()
            losses.append(-(ratio * adv * mask).sum() / mask.sum())
        loss = torch.stack(losses).mean()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9)
        self.optimizer.step()
        return {"metrics": {"pg_loss": [loss.item()], "grad_norm": [grad_norm.item()], "mfu": [0.0]}}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class Tracking:
    """verl's ``Tracking``: what ``fit`` logs, kept."""

    logs: list[tuple[int, dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Tracking.logs = []

    def log(self, data: dict[str, Any], step: int) -> None:
        Tracking.logs.append((step, dict(data)))

    def finish(self) -> None:
        return None


def dataset(count: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        ids = [(i * 5 + j * 3) % (VOCAB - 1) + 1 for j in range(3 + i % 2)]
        ids = ids + [0] * (4 - len(ids))
        rows.append({"input_ids": torch.tensor(ids), "raw_prompt": [{"role": "user", "content": f"q{i}"}],
                     "data_source": "toy", "reward_model": {"ground_truth": str(i)}, "index": i})
    return rows
