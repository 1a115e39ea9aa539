"""verl, against the real ``verl.protocol.DataProto`` and verl's real ``skip.rollout`` layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

verl_protocol = pytest.importorskip("verl.protocol")
DataProto = verl_protocol.DataProto
pytestmark = pytest.mark.verl

from rollout_mock import open_dump
from rollout_mock.adapters.foreign import open_foreign  # noqa: E402
from rollout_mock.adapters.verl import VerlRollout, wrap_verl_rollout  # noqa: E402
from rollout_mock.cli import main  # noqa: E402


def output(step: int, validate: bool = False) -> Any:
    g = torch.Generator().manual_seed(step * 7 + validate)
    return DataProto.from_dict(
        tensors={"responses": torch.randint(0, 100, (4, 3), generator=g),
                 "rollout_log_probs": torch.randn(4, 3, generator=g)},
        non_tensors={"__num_turns__": np.array([1, 2, 1, 2], dtype=object)},
        meta_info={"global_steps": step, "timing": {"gen": 0.1}},
    )


class AgentLoopManager:
    """verl 0.9's async_rollout_manager shape: sync generate_sequences(prompts) -> DataProto."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def generate_sequences(self, prompts: Any) -> Any:
        step, validate = prompts.meta_info["global_steps"], bool(prompts.meta_info.get("validate"))
        self.calls.append((step, validate))
        return output(step, validate)

    def wake_up(self) -> str:
        return "awake"


class Trainer:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.config = {"rollout_mock": cfg}
        self.async_rollout_manager = AgentLoopManager()
        self.actor_rollout_wg = None
        self.global_steps = 0

    def fit(self, steps: int) -> list[Any]:
        """ray_trainer.py's rollout calls (train with global_steps from 1; one validation)."""
        out = []
        for _ in range(steps):
            self.global_steps += 1
            gen_batch = DataProto.from_dict(tensors={"input_ids": torch.zeros(4, 2, dtype=torch.long)})
            gen_batch.meta_info["global_steps"] = self.global_steps
            out.append(self.async_rollout_manager.generate_sequences(gen_batch))
        test_batch = DataProto.from_dict(tensors={"input_ids": torch.zeros(4, 2, dtype=torch.long)})
        test_batch.meta_info = {"validate": True, "global_steps": self.global_steps, "do_sample": False}
        out.append(self.async_rollout_manager.generate_sequences(test_batch))
        return out


def same(a: Any, b: Any) -> None:
    assert type(a) is DataProto
    for key in b.batch.keys():
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert a.non_tensor_batch["__num_turns__"].tolist() == b.non_tensor_batch["__num_turns__"].tolist()
    assert a.meta_info == b.meta_info


def test_one_call_wraps_trainer_train_and_val_splits(tmp_path: Path) -> None:
    dump = tmp_path / "d"
    trainer = Trainer({"enable": True, "mode": "dump", "dump_dir": str(dump)})
    wrapper = wrap_verl_rollout(trainer)  # the one line, after init_workers()
    assert isinstance(trainer.async_rollout_manager, VerlRollout)
    assert trainer.async_rollout_manager.wake_up() == "awake"  # other attributes pass through
    recorded = trainer.fit(3)
    assert wrapper is not None
    wrapper.close()
    listing = open_dump(dump)
    assert {s.key: listing.steps(s) for s in listing.streams()} == {"train": [1, 2, 3], "val": [3]}

    trainer = Trainer({"enable": True, "mode": "mock", "dump_dir": str(dump)})  # default: safe loader
    wrap_verl_rollout(trainer)
    real = trainer.async_rollout_manager._rollout
    replayed = trainer.fit(3)
    assert real.calls == []  # the rollout never ran
    for a, b in zip(replayed, recorded):
        same(a, b)


def test_old_actor_rollout_wg_and_disabled(tmp_path: Path) -> None:
    trainer = Trainer({"enable": False})
    assert wrap_verl_rollout(trainer) is None
    trainer = Trainer({"enable": True, "dump_dir": str(tmp_path / "d")})
    trainer.actor_rollout_wg, trainer.async_rollout_manager = trainer.async_rollout_manager, None
    wrapped = wrap_verl_rollout(trainer)
    assert trainer.actor_rollout_wg is wrapped
    wrapped.close()


def write_verl_skip(root: Path, steps: list[int]) -> tuple[Path, list[Any]]:
    """Exactly RolloutSkip's layout: {dump_dir}/{exp}_{proj}/GBS.._N.._in.._out../{step}/gen_batch.dp + meta.json."""
    run = root / "exp_proj" / "GBS4_N2_in2_out3"
    outs = []
    for step in steps:
        (run / str(step)).mkdir(parents=True)
        out = output(step)
        out.save_to_disk(run / str(step) / "gen_batch.dp")  # verl's real writer
        (run / str(step) / "meta.json").write_text(json.dumps({"global_steps": step}))
        outs.append(out)
    (run / "9").mkdir()  # incomplete step dir (no meta.json): verl ignores it, so do we
    output(9).save_to_disk(run / "9" / "gen_batch.dp")
    return run, outs


def test_read_and_import_verl_skip_dump(tmp_path: Path, capsys: Any) -> None:
    from verl.utils.skip import RolloutSkip  # noqa: F401  (the reader follows this class's layout)

    run, outs = write_verl_skip(tmp_path / "verl_dump", [1, 2])
    foreign = open_foreign(tmp_path / "verl_dump", trust=True)  # the top-level dump_dir works
    assert foreign.format == "verl" and foreign.steps("train") == [1, 2]
    same(foreign.load(2), outs[1])
    with pytest.raises(Exception, match="trust=True"):
        open_foreign(run).load(1)
    dst = tmp_path / "ours"
    assert main(["import", str(run), str(dst), "--trust"]) == 0
    dump = open_dump(dst)
    for i, step in enumerate([1, 2]):
        same(dump.load(step, "train"), outs[i])  # safe mode, no trust


def test_verl_native_switches_import(tmp_path: Path) -> None:
    from verl.utils.skip import RolloutSkip, SkipManager

    assert RolloutSkip.gen_batch_name == "gen_batch.dp" and RolloutSkip.meta_name == "meta.json"
    assert SkipManager is not None


# ------------------------------------------------------------------------------ faithful replay (issue 26)
class FitTrainer:
    """RayPPOTrainer.fit's rollout side, as verl 0.9 builds it: the trainer config (OmegaConf),
    prompts from a seeded loader, a fresh ``uuid4`` uid per prompt, ``global_steps`` from 1 (or
    from the checkpoint it resumes at)."""

    def __init__(self, cfg: dict[str, Any], *, n: int = 2, temperature: float = 1.0, seed: int = 0) -> None:
        from omegaconf import OmegaConf

        self.config = OmegaConf.create({
            "rollout_mock": cfg,
            "data": {"train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 3},
            "actor_rollout_ref": {"rollout": {"name": "vllm", "temperature": temperature, "top_p": 1.0, "n": n,
                                              "response_length": 3, "gpu_memory_utilization": 0.5,
                                              "val_kwargs": {"n": 1, "do_sample": False}}},
        })
        self.async_rollout_manager = AgentLoopManager()
        self.actor_rollout_wg = None
        self.global_steps = 0
        self.seed = seed

    def prompts(self, step: int) -> Any:
        import uuid

        g = torch.Generator().manual_seed(self.seed * 1000 + step)
        batch = DataProto.from_dict(tensors={"input_ids": torch.randint(0, 50, (4, 8), generator=g)},
                                    non_tensors={"raw_prompt": np.array([f"q{step}-{i}" for i in range(4)], dtype=object)})
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(4)], dtype=object)
        batch.meta_info["global_steps"] = step
        return batch

    def fit(self, steps: int) -> list[Any]:
        out = []
        for _ in range(steps):
            self.global_steps += 1
            out.append(self.async_rollout_manager.generate_sequences(self.prompts(self.global_steps)))
        return out


def test_a_faithful_rerun_with_fresh_uids_replays_and_other_prompts_stop(tmp_path: Path) -> None:
    from rollout_mock import ReplayMismatchError, RolloutSettingsMismatchError

    block = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    trainer = FitTrainer(block)
    wrapper = wrap_verl_rollout(trainer)
    assert wrapper is not None
    recorded = trainer.fit(3)
    wrapper.close()

    mock = FitTrainer({**block, "mode": "mock"})
    wrap_verl_rollout(mock)
    for got, expected in zip(mock.fit(3), recorded):
        same(got, expected)
    assert mock.async_rollout_manager.calls == []

    resumed = FitTrainer({**block, "mode": "mock"})  # verl's _load_checkpoint set global_steps = 1
    resumed.global_steps = 1
    wrap_verl_rollout(resumed)
    for got, expected in zip(resumed.fit(2), recorded[1:]):
        same(got, expected)

    reseeded = FitTrainer({**block, "mode": "mock"}, seed=1)
    wrap_verl_rollout(reseeded)
    with pytest.raises(ReplayMismatchError) as info:
        reseeded.fit(1)
    assert info.value.step == 1 and info.value.argument == "prompts.batch.input_ids"

    with pytest.raises(RolloutSettingsMismatchError) as settings:
        wrap_verl_rollout(FitTrainer({**block, "mode": "mock"}, n=4, temperature=0.6))
    assert [d[0] for d in settings.value.differences] == ["actor_rollout_ref.rollout.n",
                                                          "actor_rollout_ref.rollout.temperature"]


@pytest.mark.slow
def test_v0_validate_in_three_batches_dump_then_mock_in_separate_processes(tmp_path: Path) -> None:
    """verl V0's real RayPPOTrainer._validate with data.val_batch_size < the validation set: three
    generate_sequences calls with one global_steps per validation, two validations. Each call is
    recorded and replayed (matched by its request, in recorded order); the rollout's random answers
    differ in every process, so only a faithful replay gives the dump run's metrics."""
    import os
    import subprocess
    import sys

    script = Path(__file__).with_name("verl_v0_validate_run.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    results = []
    for mode, seed in (("dump", "1"), ("mock", "2")):
        out = tmp_path / f"{mode}.pt"
        proc = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "d"), str(out)],
                              env={**env, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results.append(torch.load(out, weights_only=False))
    recorded, replayed = results
    assert "error" not in recorded, recorded
    assert recorded["generated"] == 6 and replayed["generated"] == 0
    assert len(recorded["metrics"]) == 2 and recorded["metrics"][0]
    assert replayed["metrics"] == recorded["metrics"]
    listing = open_dump(tmp_path / "d")
    assert list(listing.steps(listing.stream("val"))) == [0, 2]
    assert [[c.call for c in listing.calls(step, "val")] for step in (0, 2)] == [[0, 1, 2], [0, 1, 2]]
