"""rollout_mock.adapters.verl on a V1-shaped trainer (fast, in-process): the checks of mock mode
(prompt content, prompts not yet submitted), the refusal of hybrid switching, one wrapper per
trainer. verl's real V1 trainer runs in tests/integration/test_frameworks_verl_v1.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensordict")
import torch  # noqa: E402
from tensordict import NonTensorData, NonTensorStack, TensorDict  # noqa: E402

from rollout_mock.adapters.verl import VerlV1Rollout, wrap_verl_rollout  # noqa: E402
from rollout_mock.errors import ConfigError, ReplayMismatchError  # noqa: E402


@pytest.fixture
def tq(monkeypatch: pytest.MonkeyPatch) -> Any:
    path = Path(__file__).resolve().parents[1] / "doubles" / "transfer_queue.py"
    spec = importlib.util.spec_from_file_location("transfer_queue", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "transfer_queue", module)
    spec.loader.exec_module(module)
    return module


class Loop:
    """AgentLoopManagerTQ's contract: one trajectory per prompt, written into the queue."""

    def __init__(self, tq: Any) -> None:
        self.tq = tq
        self.calls = 0

    def generate_sequences(self, prompts: Any) -> None:
        self.calls += 1
        uids = prompts.get("uid").tolist()
        keys = [f"{uid}_0_0" for uid in uids]
        fields = TensorDict({"responses": prompts.get("input_ids") + 1, "uid": NonTensorStack(*uids)},
                            batch_size=[len(uids)])
        self.tq.kv_batch_put(keys=keys, partition_id="train", fields=fields,
                             tags=[{"min_global_steps": 0, "max_global_steps": 0}] * len(keys))
        self.tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"status": "finished"}] * len(uids))


class Buffer:
    """ReplayBuffer's contract: sample() selects finished prompts, clears them, returns their keys."""

    def __init__(self, tq: Any) -> None:
        self.tq = tq
        self.refill_fn = lambda count: None

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict[str, Any]]:
        items = self.tq.kv_list(partition_id).get(partition_id, {})
        prompts = [k for k, t in items.items() if t.get("is_prompt") and t.get("status") == "finished"][:batch_size]
        self.tq.kv_clear(keys=prompts, partition_id=partition_id)
        keys = [k for k in items if not items[k].get("is_prompt") and k.split("_")[0] in prompts]
        return self.tq.KVBatchMeta(partition_id=partition_id, keys=keys, tags=[items[k] for k in keys]), {"m": 1.0}


class Trainer:
    def __init__(self, tq: Any, cfg: dict[str, Any], *, offset: int = 0, submit: bool = True, start: int = 1) -> None:
        self.tq = tq
        self.config = {"rollout_mock": cfg, "trainer": {"v1": {"trainer_mode": "sync"}}}
        self.replay_buffer = Buffer(tq)
        self.offset = offset
        self.submit = submit
        self.start = start
        self.trained: list[Any] = []

    def fit(self, loop: Any) -> None:
        import uuid

        for step in range(self.start, 3):
            if self.submit or step == 1:
                uids = [str(uuid.uuid4()) for _ in range(2)]
                batch = TensorDict({"input_ids": torch.arange(4).reshape(2, 2) + 10 * step + self.offset,
                                    "uid": NonTensorStack(*uids)}, batch_size=[2])
                batch.set("global_steps", NonTensorData(step))
                self.tq.kv_batch_put(keys=uids, partition_id="train",
                                     tags=[{"is_prompt": True, "status": "pending", "global_steps": step}] * 2)
                loop.generate_sequences(batch)
            meta, _ = self.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=2)
            data = self.tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["responses"])
            self.trained.append(torch.stack(list(data["responses"].unbind(0))))
            self.tq.kv_clear(keys=meta.keys, partition_id="train")


def dump(tq: Any, tmp_path: Path) -> list[Any]:
    trainer = Trainer(tq, {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")})
    wrapper = wrap_verl_rollout(trainer)
    assert isinstance(wrapper, VerlV1Rollout)
    assert wrap_verl_rollout(trainer) is wrapper  # one wrapper per trainer
    trainer.fit(Loop(tq))
    wrapper.close()
    return trainer.trained


def test_mock_trains_on_the_recorded_consumption_without_generating(tq: Any, tmp_path: Path) -> None:
    recorded = dump(tq, tmp_path)
    tq.reset()
    trainer = Trainer(tq, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")})
    wrapper = wrap_verl_rollout(trainer)
    loop = Loop(tq)
    trainer.fit(loop)
    assert loop.calls == 0
    assert all(torch.equal(a, b) for a, b in zip(trainer.trained, recorded, strict=True))
    assert wrapper is not None
    wrapper.close()


def test_mock_with_other_prompts_names_the_prompt_and_step(tq: Any, tmp_path: Path) -> None:
    dump(tq, tmp_path)
    tq.reset()
    trainer = Trainer(tq, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")}, offset=1)
    wrap_verl_rollout(trainer)
    with pytest.raises(ReplayMismatchError, match=r"step=1\): prompt 0 submitted at step 1 of the train partition "
                                                  r"differs") as err:
        trainer.fit(Loop(tq))
    assert err.value.step == 1 and err.value.argument == "prompts[1.0]"


def test_mock_before_the_prompts_were_submitted_says_how_many_were(tq: Any, tmp_path: Path) -> None:
    dump(tq, tmp_path)
    tq.reset()
    trainer = Trainer(tq, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")}, submit=False)
    wrap_verl_rollout(trainer)
    with pytest.raises(ReplayMismatchError, match=r"step=2\): the recorded call consumed prompt 0 submitted at step "
                                                  r"2 of the train partition; this run has submitted 0 prompts at "
                                                  r"step 2"):
        trainer.fit(Loop(tq))


def test_a_run_resumed_at_step_2_is_served_step_2s_consumption(tq: Any, tmp_path: Path) -> None:
    """A prompt is known by the step it was submitted at and its place in that step: a sync run
    resumed at step 2 (verl restores global_steps and the data loader) submits step 2's prompts
    again and trains on what the dump run trained on at step 2."""
    recorded = dump(tq, tmp_path)
    tq.reset()
    trainer = Trainer(tq, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")}, start=2)
    wrap_verl_rollout(trainer)
    trainer.fit(Loop(tq))
    assert len(trainer.trained) == 1 and torch.equal(trainer.trained[0], recorded[1])


def test_hybrid_switching_is_refused(tq: Any, tmp_path: Path) -> None:
    trainer = Trainer(tq, {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")})
    trainer.config["trainer"] = {"v1": {"trainer_mode": "separate_async",
                                        "separate_async": {"hybrid_rollout": {"enable_switch": True}}}}
    with pytest.raises(ConfigError, match="enable_switch=true"):
        wrap_verl_rollout(trainer)
