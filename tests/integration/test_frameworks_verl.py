"""verl, against the real ``verl.protocol.DataProto`` and verl's real ``skip.rollout`` layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S

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


# ------------------------------------------------------------------------------ issue 35
class CarryingManager(AgentLoopManager):
    """An output that carries its request's ``non_tensor_batch`` (verl 0.9.1 with a colocated
    reward model, an earlier agent_loop.py): the uid of each prompt comes back in the output."""

    def generate_sequences(self, prompts: Any) -> Any:
        out = super().generate_sequences(prompts)
        for key, value in prompts.non_tensor_batch.items():
            out.non_tensor_batch[key] = value.copy()
        return out


def test_an_output_carrying_its_requests_uid_is_served_with_the_live_uid(tmp_path: Path) -> None:
    """Issue 35 item 5: the replayed output held the dump run's uuid4 uids, the live batch fresh
    ones, and verl's own ``batch.union(gen_batch_output)`` failed on an identical rerun."""
    block = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}

    def run(mode: str) -> list[Any]:
        trainer = FitTrainer({**block, "mode": mode})
        trainer.async_rollout_manager = CarryingManager()
        wrapper = wrap_verl_rollout(trainer)
        assert wrapper is not None
        unions = []
        for step in (1, 2):
            batch = trainer.prompts(step)
            gen_output = trainer.async_rollout_manager.generate_sequences(batch)
            unions.append(batch.union(gen_output))  # verl's own check of the overlapping uid
        wrapper.close()
        assert trainer.async_rollout_manager.calls == ([] if mode == "mock" else [(1, False), (2, False)])
        return unions

    recorded, replayed = run("dump"), run("mock")
    for got, expected in zip(replayed, recorded):
        assert list(got.non_tensor_batch["uid"]) != list(expected.non_tensor_batch["uid"])  # fresh uuid4s
        assert torch.equal(got.batch["responses"], expected.batch["responses"])
        assert list(got.non_tensor_batch["raw_prompt"]) == list(expected.non_tensor_batch["raw_prompt"])
    stored = open_dump(tmp_path / "d")
    assert list(stored.load(1, "train").non_tensor_batch["uid"]) == \
        list(recorded[0].non_tensor_batch["uid"])  # the record itself is unchanged


def test_serve_live_fields_needs_the_same_field_with_the_same_length() -> None:
    from rollout_mock.adapters import serve_live_fields

    live = DataProto.from_dict(non_tensors={"uid": np.array(["a", "b"], dtype=object)})
    longer = DataProto.from_dict(non_tensors={"uid": np.array(["x", "y", "z", "w"], dtype=object)})
    without = DataProto.from_dict(tensors={"responses": torch.zeros(2, 1)})
    assert serve_live_fields("verl", live, longer) is longer  # n samples per prompt: not the same rows
    assert serve_live_fields("verl", live, without) is without
    assert serve_live_fields("roll", live, longer) is longer
    same_rows = DataProto.from_dict(non_tensors={"uid": np.array(["x", "y"], dtype=object)})
    served = serve_live_fields("verl", live, same_rows)
    assert list(served.non_tensor_batch["uid"]) == ["a", "b"] and list(same_rows.non_tensor_batch["uid"]) == ["x", "y"]


RUN = Path(__file__).with_name("verl_run.py")
REPO = Path(__file__).resolve().parents[2]


def _verl_run(tmp_path: Path, name: str, mode: str, how: str, *extra: str, hash_seed: int) -> dict[str, Any]:
    """One run of verl's rollout side in its own process with its own hash seed (verl_run.py)."""
    import os
    import subprocess
    import sys

    out = tmp_path / f"{name}.json"
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(RUN), str(out), mode, str(tmp_path / f"dump-{how}"), how, *extra],
                          capture_output=True, text=True, timeout=HANG_S, env=env, check=False)
    assert out.exists(), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.parametrize("how", ["one-line", "by-hand"])
def test_the_docs_recipes_replay_an_identical_rerun_and_stop_another_data_seed(tmp_path: Path, how: str) -> None:
    """Issue 35: the by-hand snippet wrapped ``actor_rollout_wg`` (no ``generate_sequences`` in
    verl >= 0.6) in one split, which a validation at a training step's ``global_steps`` collides
    with (``StepExistsError`` at step 2); the outputs carry their request's uid (DataProto.union).
    Both recipes: dump and mock in two processes with other hash seeds."""
    dumped = _verl_run(tmp_path, "dump", "dump", how, hash_seed=1)
    assert "error" not in dumped, dumped
    assert dumped["live_calls"] == 7  # validation at 0, 4 steps, validation at 2 and 4
    replayed = _verl_run(tmp_path, "mock", "mock", how, hash_seed=2)
    assert "error" not in replayed, replayed
    assert replayed["responses"] == dumped["responses"] and replayed["live_calls"] == 0
    reseeded = _verl_run(tmp_path, "reseeded", "mock", how, "--seed", "2", hash_seed=3)
    assert reseeded["error"] == "RolloutSettingsMismatchError", reseeded  # the pre-flight names the setting
    assert "data.seed: 1 in the dump run, 2 now" in reseeded["message"]
    # another loader order under the same settings: the first training call names the first differing row
    reshuffled = _verl_run(tmp_path, "reshuffled", "mock", how, "--shuffle-seed", "5", hash_seed=4)
    assert reshuffled["error"] == "ReplayMismatchError", reshuffled
    assert "train step 1" in reshuffled["message"]
    assert "prompts.non_tensor_batch.raw_prompt: row 0: [{'content': 'What is" in reshuffled["message"]


def test_a_changed_chat_template_fails_the_pre_flight_naming_it(tmp_path: Path) -> None:
    """Issue 34 item 4 (for the lead) / 35: the trainer's tokenizer is fingerprinted by content
    (vocabulary, special tokens, chat template), not by path, and recorded in the settings."""
    import sys

    from rollout_mock import RolloutSettingsMismatchError
    from rollout_mock.adapters import tokenizer_fingerprint

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_run import build_tokenizer

    def tokenizer(template: str, where: str) -> Any:
        from transformers import AutoTokenizer

        built = build_tokenizer()
        built.chat_template = template
        built.save_pretrained(str(tmp_path / where))
        return AutoTokenizer.from_pretrained(str(tmp_path / where))  # another path, another object

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    here, there = tokenizer(template, "here"), tokenizer(template, "there")
    changed = tokenizer("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}", "changed")
    assert tokenizer_fingerprint(here) == tokenizer_fingerprint(there)
    difference = {k for k, v in tokenizer_fingerprint(here).items() if tokenizer_fingerprint(changed)[k] != v}
    assert difference == {"chat_template"}

    block = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    trainer = FitTrainer(block)
    trainer.tokenizer = here
    wrapper = wrap_verl_rollout(trainer)
    assert wrapper is not None
    trainer.fit(1)
    wrapper.close()
    moved = FitTrainer({**block, "mode": "mock"})
    moved.tokenizer = there
    assert wrap_verl_rollout(moved) is not None  # the same tokenizer under another path
    other = FitTrainer({**block, "mode": "mock"})
    other.tokenizer = changed
    with pytest.raises(RolloutSettingsMismatchError) as info:
        wrap_verl_rollout(other)
    assert [d[0] for d in info.value.differences] == ["tokenizer.chat_template"]


def test_the_wrapper_works_where_a_mock_scheduler_does(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A context manager, ``expected=`` of a MetricsWriter (it raised "cannot read a config from
    VerlRollout"), and a run without validation closes without warning about ``val``."""
    import logging

    from rollout_mock import MetricsWriter
    from rollout_mock.compare.expected import read_expected

    dump = tmp_path / "d"
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    trainer = Trainer({"enable": True, "mode": "dump", "dump_dir": str(dump)})
    with wrap_verl_rollout(trainer) as rollout, MetricsWriter(tmp_path / "m.jsonl", expected=rollout) as log:
        for step in (1, 2):
            batch = DataProto.from_dict(tensors={"input_ids": torch.zeros(4, 2, dtype=torch.long)})
            batch.meta_info["global_steps"] = step
            rollout.generate_sequences(batch)
            log.log(step, {"loss": 1.0 / step})
    assert "closed without recording" not in caplog.text, caplog.text  # no validation: no val stream
    listing = open_dump(dump)
    assert {s.key: listing.steps(s) for s in listing.streams()} == {"train": [1, 2]}
    expected = read_expected(dump)
    assert expected is not None and expected.steps == [1, 2]


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
                              env={**env, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=HANG_S)
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
