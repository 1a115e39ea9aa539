"""AReaL: wrap_areal around an engine with AReaL's prepare_batch shape, and the trajectory_debug
files of PR #1407 (written here with torch.save, as AReaL's PPOTrainer._save_trajectory does).
AReaL itself does not import on this CPU environment (it pins torch<2.11): see the docs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

from rollout_mock import open_dump
from rollout_mock.adapters.areal import wrap_areal
from rollout_mock.adapters.foreign import open_foreign
from rollout_mock.cli import main


def trajectories(step: int, n: int = 3) -> list[Any]:
    """prepare_batch's return: list of dicts of [group, L] tensors; None = rejected."""
    out: list[Any] = []
    for i in range(n):
        length = 4 + i
        g = torch.Generator().manual_seed(step * 10 + i)
        out.append({
            "input_ids": torch.randint(0, 50, (2, length), generator=g, dtype=torch.int64).to(torch.int32),
            "loss_mask": torch.tensor([[0, 0] + [1] * (length - 2)] * 2, dtype=torch.int32),
            "logprobs": torch.randn(2, length, generator=g),
            "versions": torch.full((2, length), step, dtype=torch.int32),
            "attention_mask": torch.ones(2, length, dtype=torch.bool),
            "rewards": torch.tensor([1.0, 0.0]),
        })
    out.append(None)
    return out


class Engine:
    def __init__(self) -> None:
        self.calls = 0

    def prepare_batch(self, dataloader: Any, workflow: Any, workflow_kwargs: Any = None,
                      should_accept_fn: Any = None, group_size: int = 1, dynamic_bs: bool = False) -> list[Any]:
        self.calls += 1
        return trajectories(self.calls)

    def rollout_batch(self, data: list[Any], workflow: Any, workflow_kwargs: Any = None, group_size: int = 1) -> list[Any]:
        return trajectories(100 + len(data))


def same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if y is None:
            assert x is None
            continue
        assert x.keys() == y.keys()
        for key in y:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key


def test_wrap_areal_with_trainer_global_step(tmp_path: Path) -> None:
    global_step = 0
    rollout = wrap_areal(Engine(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")},
                         step=lambda: global_step)
    recorded = []
    # the step= lambda reads global_step: the loop variable is the trainer's step counter
    for global_step in (5, 6, 7):  # noqa: B007 (a run resumed at step 5: files are named by the trainer's step)
        recorded.append(rollout.prepare_batch(None, workflow=None, group_size=2))
    rollout.close()
    assert open_dump(tmp_path / "d").steps(open_dump(tmp_path / "d").stream("train")) == [5, 6, 7]
    engine = Engine()
    replay = wrap_areal(engine, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")},
                        step=lambda: global_step)
    for global_step, expected in zip((5, 6, 7), recorded):  # noqa: B007 (read by step=)
        same(replay.prepare_batch(None, workflow=None, group_size=2), expected)
    assert engine.calls == 0
    replay.close()


def test_read_and_import_trajectory_debug_files(tmp_path: Path) -> None:
    src = tmp_path / "debug_trajectories"
    src.mkdir()
    single = {s: trajectories(s) for s in (0, 1)}
    for step, batch in single.items():
        torch.save(batch, src / f"step_{step:06d}.pt")  # single controller
    spmd = tmp_path / "spmd"
    spmd.mkdir()
    for rank in (0, 1):
        torch.save(trajectories(rank + 50), spmd / f"step_{3:06d}_dp_{rank}.pt")
    foreign = open_foreign(src, trust=True)
    assert foreign.format == "areal" and foreign.steps("train") == [0, 1]
    same(foreign.load(1), single[1])
    assert main(["import", str(src), str(tmp_path / "a"), "--trust"]) == 0
    dump = open_dump(tmp_path / "a")
    same(dump.load(0, "train"), single[0])  # safe mode
    assert main(["import", str(spmd), str(tmp_path / "b"), "--trust"]) == 0
    ranks = sorted(s.key for s in open_dump(tmp_path / "b").streams())
    assert ranks == ["train@rank0", "train@rank1"]


def test_areal_does_not_import_here() -> None:
    try:
        import areal  # noqa: F401
    except ImportError:
        return
    pytest.skip("AReaL is importable here: the wrapper still needs only prepare_batch's shape")


def test_mock_mode_without_engine_answers_the_trainers_engine_calls(tmp_path: Path) -> None:
    """AReaL's trainer pauses, resumes, versions and destroys its rollout engine; with no engine
    (mock mode) those are no-ops, while a batch method still replays or names the missing step."""
    from rollout_mock.adapters.areal import ENGINE_CONTROL, wrap_areal
    from rollout_mock.errors import StepNotFoundError

    class Engine:
        def rollout_batch(self, data: Any, workflow: Any = None) -> list[Any]:
            return [{"rewards": torch.tensor([1.0])}, None]

    cfg = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path)}
    dumped = wrap_areal(Engine(), cfg, methods=("rollout_batch",))
    assert dumped.rollout_batch([0])[1] is None
    dumped.close()
    replay = wrap_areal(None, {**cfg, "mode": "mock"}, methods=("rollout_batch",))
    for name in ENGINE_CONTROL:
        if name != "get_version":
            assert getattr(replay, name)() is None
    replay.set_version(7)
    assert replay.get_version() == 7
    batch = replay.rollout_batch([0])
    assert torch.equal(batch[0]["rewards"], torch.tensor([1.0])) and batch[1] is None
    with pytest.raises(StepNotFoundError):
        replay.rollout_batch([0])
    replay.close()


# ------------------------------------------------------------------------------ single controller (issue 26)
def _rtensor() -> Any:
    import sys

    doubles = str(Path(__file__).resolve().parents[1] / "doubles")
    if doubles not in sys.path:
        sys.path.insert(0, doubles)
    import areal_rtensor

    return areal_rtensor


class Controller:
    """AReaL 1.0's single controller: prepare_batch returns trajectory dicts of remote-tensor handles."""

    def __init__(self) -> None:
        self.calls = 0

    def prepare_batch(self, dataloader: Any, workflow: Any, group_size: int = 1) -> list[Any]:
        self.calls += 1
        return _rtensor().RTensor.remotize(trajectories(self.calls), node_addr="10.0.0.7:18000")


def test_single_controller_handles_are_recorded_by_value(tmp_path: Path) -> None:
    rt = _rtensor()
    cfg = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    rollout = wrap_areal(Controller(), cfg, methods=("prepare_batch",))
    handles = [rollout.prepare_batch(None, workflow="rlvr", group_size=2) for _ in range(2)]
    rollout.close()
    assert isinstance(handles[0][0]["input_ids"], rt.RTensor)  # the caller still gets the handles
    expected = [rt.RTensor.localize(h) for h in handles]
    rt.clear_shards()  # the rollout workers are gone: only the recorded values are left
    replay = wrap_areal(None, {**cfg, "mode": "mock"}, methods=("prepare_batch",))
    for batch in expected:
        same(replay.prepare_batch(None, workflow="rlvr", group_size=2), batch)  # plain tensors
    replay.close()


def test_a_handle_that_cannot_be_fetched_stops_the_dump_at_dump_time(tmp_path: Path) -> None:
    from rollout_mock import UnrecordableBatchError

    rt = _rtensor()

    class Gone(Controller):
        def prepare_batch(self, dataloader: Any, workflow: Any, group_size: int = 1) -> list[Any]:
            batch = super().prepare_batch(dataloader, workflow, group_size)
            rt.clear_shards()
            return batch

    rollout = wrap_areal(Gone(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")},
                         methods=("prepare_batch",))
    with pytest.raises(UnrecordableBatchError, match="remote-tensor handle"):
        rollout.prepare_batch(None, workflow="rlvr")
    rollout.close()
    assert open_dump(tmp_path / "d").steps(open_dump(tmp_path / "d").stream("train")) == []


# ------------------------------------------------------------------------------ issue 35
PROMPTS = [{"messages": [{"role": "user", "content": f"What is {i} times {i + 2}?"}], "answer": str(i * (i + 2))}
           for i in range(12)]


def loader(seed: int) -> Any:
    """AReaL's train dataloader: shuffled by a seeded generator, batches of prompt dicts."""
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(PROMPTS, batch_size=4, shuffle=True, generator=generator,
                                       collate_fn=lambda rows: rows)


def cycle_dataloader(dataloader: Any) -> Any:
    """areal.utils.data.cycle_dataloader."""
    iterator = iter(dataloader)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            iterator = iter(dataloader)


class WorkflowEngine:
    """The workflow executor's prepare_batch: it keeps one generator over the loader it was first
    given (``self.data_generator``), reads ``dataloader.batch_size`` and may draw ahead
    (``ahead``: batches submitted before the first wait, as its asynchronous rollout does)."""

    def __init__(self, ahead: int = 0) -> None:
        self.ahead = ahead
        self.consumed: list[list[str]] = []
        self.pending: list[Any] = []

    def prepare_batch(self, dataloader: Any, workflow: Any = None, workflow_kwargs: Any = None,
                      should_accept_fn: Any = None, group_size: int = 1, dynamic_bs: bool = False) -> list[Any]:
        if not hasattr(self, "data_generator"):
            self.data_generator = cycle_dataloader(dataloader)
            self.pending += [next(self.data_generator) for _ in range(self.ahead)]
        assert dataloader.batch_size == 4
        self.pending.append(next(self.data_generator))
        data = self.pending.pop(0)
        self.consumed.append([row["answer"] for row in data])
        return [{"input_ids": torch.tensor([[len(row["messages"][0]["content"]), int(row["answer"])]]),
                 "rewards": torch.tensor([float(row["answer"])])} for row in data]


def test_prepare_batch_compares_the_prompts_the_loader_yields(tmp_path: Path) -> None:
    """Issue 35 item 3: the loader was compared by type only, so on AReaL's documented one line
    (``prepare_batch(dataloader, ...)``) a loader with another shuffle seed served the dump's
    batches. Now the k-th call's request is the loader's k-th batch, and the engine reads the
    very same sequence (also when it draws ahead)."""
    from rollout_mock import ReplayMismatchError

    cfg = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    live_run = WorkflowEngine(ahead=1)
    train = loader(seed=1)
    for _ in range(4):
        live_run.prepare_batch(train, workflow="rlvr")
    engine = WorkflowEngine(ahead=1)
    rollout = wrap_areal(engine, cfg)  # an engine without rollout_batch (issue 35)
    dataloader = loader(seed=1)
    recorded = [rollout.prepare_batch(dataloader, workflow="rlvr", workflow_kwargs={"n": 2}) for _ in range(4)]
    rollout.close()
    assert engine.consumed == live_run.consumed  # the wrapper changes nothing of what the engine reads

    replay = wrap_areal(None, {**cfg, "mode": "mock"})  # methods: those recorded
    again = loader(seed=1)
    for expected in recorded:
        same(replay.prepare_batch(again, workflow="rlvr", workflow_kwargs={"n": 2}), expected)
    replay.close()

    reshuffled = wrap_areal(None, {**cfg, "mode": "mock"})
    other = loader(seed=2)
    with pytest.raises(ReplayMismatchError) as info:
        reshuffled.prepare_batch(other, workflow="rlvr", workflow_kwargs={"n": 2})
    assert info.value.step == 0 and info.value.argument == "dataloader"
    assert "row 0, key 'answer'" in str(info.value) or "row 0, key 'messages'" in str(info.value)
    reshuffled.close()


def _save_tokenizer(path: Path, template: str) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_run import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(path))
    return path


def test_the_tokenizer_in_workflow_kwargs_is_compared_by_fingerprint_not_path(tmp_path: Path) -> None:
    """Issue 35: AReaL passes ``workflow_kwargs["tokenizer"] = config.tokenizer_path``; a mock run
    on another machine with another model path was refused. A changed chat template is not."""
    pytest.importorskip("transformers")
    from rollout_mock import ReplayMismatchError, RolloutSettingsMismatchError

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    here, there = _save_tokenizer(tmp_path / "here", template), _save_tokenizer(tmp_path / "there", template)
    changed = _save_tokenizer(tmp_path / "changed", "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    cfg = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    rollout = wrap_areal(Engine(), cfg, methods=("rollout_batch",), tokenizer=str(here))
    recorded = rollout.rollout_batch(PROMPTS[:2], workflow="rlvr", workflow_kwargs={"tokenizer": str(here)})
    rollout.close()
    moved = wrap_areal(None, {**cfg, "mode": "mock"}, tokenizer=str(there))
    same(moved.rollout_batch(PROMPTS[:2], workflow="rlvr", workflow_kwargs={"tokenizer": str(there)}), recorded)
    moved.close()
    with pytest.raises(RolloutSettingsMismatchError, match="tokenizer.chat_template"):
        wrap_areal(None, {**cfg, "mode": "mock"}, tokenizer=str(changed))
    other = wrap_areal(None, {**cfg, "mode": "mock"})
    with pytest.raises(ReplayMismatchError, match="workflow_kwargs.tokenizer.chat_template"):
        other.rollout_batch(PROMPTS[:2], workflow="rlvr", workflow_kwargs={"tokenizer": str(changed)})
    other.close()


_BY_HAND_RUN = r'''
import json, os, re, sys, torch
from pathlib import Path
import rollout_mock

out, mode, dump, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
doc = Path(os.environ["AREAL_DOC"]).read_text(encoding="utf-8")
code = re.search(r"<!-- areal-by-hand -->\s*```python\n(.*?)```", doc, re.DOTALL).group(1)
code = code.replace("    ...\n", "    served.append([t['input_ids'].tolist() for t in batch])\n")
Path(dump + ".yaml").write_text(f"rollout_mock:\n  enable: true\n  mode: {mode}\n  dump_dir: {dump}\n")
code = code.replace('"rollout_mock.yaml"', repr(dump + ".yaml"))

class Engine:  # the inference engine: responses from the OS's entropy (a replay equals the dump only by reading it)
    def rollout_batch(self, data, workflow=None, workflow_kwargs=None):
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        return [{"input_ids": torch.randint(0, 99, (2, 3), generator=g)} for _ in data]

prompts = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(12)]
dataloader = torch.utils.data.DataLoader(prompts, batch_size=4, shuffle=True, collate_fn=lambda r: r,
                                         generator=torch.Generator().manual_seed(seed))
served = []
namespace = {"engine": Engine() if mode == "dump" else None, "dataloader": dataloader, "workflow": "rlvr",
             "start_step": 0, "total_steps": 3, "served": served}
try:
    exec(compile(code, "areal.md", "exec"), namespace)
    namespace["rollout"].close()
except rollout_mock.RolloutMockError as exc:
    Path(out).write_text(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    sys.exit(3)
Path(out).write_text(json.dumps({"served": served}))
'''


def test_the_by_hand_recipe_replays_an_identical_rerun_and_stops_another_loader_order(tmp_path: Path) -> None:
    """Issue 35: the documented by-hand recipe wrapped ``prepare_batch(dataloader, ...)``, whose
    loader is compared by type only, and required ``rollout_batch``. Dump and mock in two
    processes with other hash seeds."""
    import json
    import os
    import subprocess
    import sys

    doc = Path(__file__).resolve().parents[2] / "docs" / "frameworks" / "areal.md"
    script = tmp_path / "run.py"
    script.write_text(_BY_HAND_RUN)

    def run(name: str, mode: str, seed: int, hash_seed: int) -> dict[str, Any]:
        env = dict(os.environ, PYTHONHASHSEED=str(hash_seed), AREAL_DOC=str(doc),
                   PYTHONPATH=os.pathsep.join([str(doc.parents[2]), os.environ.get("PYTHONPATH", "")]))
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, str(script), str(out), mode, str(tmp_path / "d"), str(seed)],
                              capture_output=True, text=True, timeout=HANG_S, env=env, check=False)
        assert out.exists(), proc.stderr[-3000:]
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    dumped = run("dump", "dump", 1, 1)
    assert "error" not in dumped and len(dumped["served"]) == 3, dumped
    replayed = run("mock", "mock", 1, 2)
    assert replayed == dumped
    reshuffled = run("other", "mock", 2, 3)
    assert reshuffled["error"] == "ReplayMismatchError" and "data: row 0, key 'messages'" in reshuffled["message"]


def test_the_wrapper_is_a_context_manager_and_an_expected_source(tmp_path: Path) -> None:
    """Works wherever a MockScheduler does: ``with``, and ``expected=`` of a MetricsWriter."""
    from rollout_mock import MetricsWriter
    from rollout_mock.compare.expected import read_expected

    dump = tmp_path / "d"
    with wrap_areal(Engine(), {"enable": True, "mode": "dump", "dump_dir": str(dump)}) as rollout, \
            MetricsWriter(tmp_path / "m.jsonl", expected=rollout) as log:
        for step in range(2):
            rollout.step = step
            rollout.prepare_batch(None, workflow=None, group_size=2)
            log.log(step, {"loss": 1.0})
    assert open_dump(dump).steps(open_dump(dump).stream("train")) == [0, 1]  # closed: the manifest is written
    expected = read_expected(dump)
    assert expected is not None and expected.steps == [0, 1]


# ---------------------------------------------------------------- asynchronous rollout, versions

AREAL_RUN = Path(__file__).with_name("areal_run.py")


def areal_run(mode: str, method: str, dump: Path, out: Path, *, seed: str, count: int = 4,
              expect: int = 0) -> dict[str, Any]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, str(AREAL_RUN), mode, method, str(dump), str(out), str(count)],
                          env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == expect, proc.stderr[-4000:]
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("method", ["wait", "prepare_batch"])
def test_async_producer_with_staleness_2_dump_then_mock_in_separate_processes(method: str, tmp_path: Path) -> None:
    """A producer thread (max_head_offpolicyness=2) generates with its own timing in each process;
    the trainer consumes what is ready (submit many + wait(count), or prepare_batch). The mock run
    generates nothing and trains bit-identically on what the dump run consumed, versions included."""
    dump = tmp_path / "dump"
    recorded = areal_run("dump", method, dump, tmp_path / "dump.pt", seed="1")
    replayed = areal_run("mock", method, dump, tmp_path / "mock.pt", seed="2")
    assert recorded["generated"] > 0 and replayed["generated"] == 0
    for name in recorded["params"]:
        assert torch.equal(recorded["params"][name], replayed["params"][name]), name
    assert recorded["metrics"] == replayed["metrics"]
    assert recorded["versions"] == replayed["versions"]
    # off-policy data was consumed: some tokens were generated 1-2 versions before they were trained on
    assert max(m["max_staleness"] for m in recorded["metrics"]) >= 1
    assert max(m["max_staleness"] for m in recorded["metrics"]) <= 2
    listing = open_dump(dump)
    stream = listing.stream("train", name="wait") if method == "wait" else listing.stream("train")
    assert list(listing.steps(stream)) == [0, 1, 2, 3, 4]
    batch = listing.load(4, stream)
    assert [t["versions"].tolist() for t in batch] == recorded["versions"][4]
    from rollout_mock.adapters.areal import versions_provenance

    assert [c.provenance for c in listing.calls(4, stream)] == [versions_provenance(batch)]  # in the index


@pytest.mark.slow
def test_async_wait_with_another_count_is_an_error_naming_step_and_counts(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    areal_run("dump", "wait", dump, tmp_path / "dump.pt", seed="1")
    error = areal_run("mock", "wait", dump, tmp_path / "mock.pt", seed="3", count=3, expect=3)
    assert error["error"] == "ReplayMismatchError" and error["step"] == 0
    assert "step=0" in error["message"] and "wait asks for 3 trajectories" in error["message"]
    assert "returned 4" in error["message"] and "nothing is cycled" in error["message"]


def test_versions_provenance_per_row_min_and_max() -> None:
    from rollout_mock.adapters.areal import versions_provenance

    traj = {"versions": torch.tensor([[-1, -1, 2, 2, 4], [-1, 6, 6, -1, -1]], dtype=torch.int32)}
    assert versions_provenance([traj, None, {"input_ids": torch.zeros(1, 2)}]) == {
        "min": [[2, 6], None, None], "max": [[4, 6], None, None]}
