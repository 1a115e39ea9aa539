"""ROLL, end to end on a real local Ray cluster, with the DEFAULT config (safe loading, no trust).

ROLL's DataProto/BatchProxy and its two schedulers are faithful doubles (tests/doubles/), installed
as the real module paths ``roll.distributed.scheduler.{protocol,rollout_scheduler,generate_scheduler}``
so that pickles name ROLL's classes, and shipped to the Ray workers through PYTHONPATH. The
pipeline code below is ROLL's (agentic_pipeline.py / rlvr_pipeline.py) with the one changed line.
Covers: the rollout_mock: YAML block, both scheduler shapes as named Ray actors, per-domain streams
joined with DataProto.concat, the mock_class path and the MockScheduler-around-handle path,
ROLL's own mixin switched off, import of ROLL's own dump, diff, show and ls.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import local_ray_cluster

ray = pytest.importorskip("ray")

from rollout_mock import open_dump
from rollout_mock.adapters.roll import roll_config, roll_handle, roll_scheduler  # noqa: E402
from rollout_mock.cli import main  # noqa: E402

pytestmark = pytest.mark.ray

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def install_roll(root: Path) -> None:
    """A ``roll`` package made of the doubles, at ROLL's module paths.

    ``ROLLOUT_MOCK_TEST_ROLL_PKG`` (local checks only) names a folder holding a ``roll`` package
    with ROLL's real, unmodified ``protocol.py``/``remote_protocol.py`` (heavy imports stubbed):
    it is used instead of the protocol double; the schedulers stay doubles."""
    pkg = root / "roll" / "distributed" / "scheduler"
    real = os.environ.get("ROLLOUT_MOCK_TEST_ROLL_PKG")
    if real:
        shutil.copytree(Path(real) / "roll", root / "roll", dirs_exist_ok=True)
        for extra in (p for p in Path(real).iterdir() if p.is_dir() and p.name != "roll"):
            shutil.copytree(extra, root / extra.name, dirs_exist_ok=True)
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "roll", root / "roll" / "distributed", pkg):
        (d / "__init__.py").touch()
    if not real:
        shutil.copyfile(DOUBLES / "roll_protocol.py", pkg / "protocol.py")
        (pkg / "remote_protocol.py").write_text("from roll.distributed.scheduler.protocol import BatchProxy  # noqa\n")
    shutil.copyfile(DOUBLES / "roll_schedulers.py", pkg / "rollout_scheduler.py")
    (pkg / "generate_scheduler.py").write_text(
        "from roll.distributed.scheduler.rollout_scheduler import DynamicSamplingScheduler  # noqa\n")
    (root / "roll" / "configs.py").write_text(
        "from roll.distributed.scheduler.rollout_scheduler import RolloutMockConfig, PipelineConfig  # noqa\n")


@pytest.fixture(scope="module")
def roll_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("rollpkg")
    install_roll(root)
    sys.path.insert(0, str(root))
    saved_pp = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), saved_pp]))
    try:
        with local_ray_cluster(2, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}):
            yield root
    finally:
        if saved_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_pp
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "roll" or m.startswith("roll.")]:
            del sys.modules[name]


def pipeline_config(dump_dir: Path, mode: str) -> Any:
    from roll.configs import PipelineConfig, RolloutMockConfig  # ROLL's own dataclass block

    return PipelineConfig(rollout_mock=RolloutMockConfig(enable=True, mode=mode, dump_dir=str(dump_dir)))


def same(a: Any, b: Any) -> None:
    """Equality of two ROLL DataProtos without touching BatchProxy's missing methods."""
    assert type(a).__module__ == "roll.distributed.scheduler.protocol"
    assert sorted(a._batch.keys()) == sorted(b._batch.keys())
    for key in b._batch.keys():
        assert torch.equal(a._batch[key], b._batch[key]), key
    assert sorted(a._non_tensor_batch) == sorted(b._non_tensor_batch)
    for key, value in b._non_tensor_batch.items():
        assert a._non_tensor_batch[key].tolist() == value.tolist(), key
    assert a.meta_info.keys() == b.meta_info.keys()


def inject_trace_context(meta_info: dict[str, Any]) -> None:
    """roll.utils.telemetry.inject_trace_context: a W3C traceparent with fresh random ids in every
    request (it differs between two faithful runs: request matching must not compare it)."""
    import uuid

    meta_info["_otel_ctx"] = {"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"}


def agentic_run(cfg: Any, steps: int, batch_size: int = 4) -> tuple[list[Any], list[Any]]:
    """agentic_pipeline.py's construction and calls, with the one changed line."""
    from roll.distributed.scheduler.protocol import DataProto
    from roll.distributed.scheduler.rollout_scheduler import RolloutScheduler

    Scheduler = roll_scheduler(RolloutScheduler, cfg)  # <- the one line
    train = ray.remote(Scheduler).options(name="RolloutScheduler-train").remote(
        config=cfg, env_manager_config=None, resource_manager=None, infer_cluster=None, mode="train")
    val = ray.remote(Scheduler).options(name="RolloutScheduler-val").remote(
        config=cfg, env_manager_config=None, resource_manager=None, infer_cluster=None, mode="val")
    out_train, out_val = [], []
    try:
        ray.get(train.suspend.remote())  # lifecycle calls work in both modes
        for step in range(steps):
            batch = DataProto(meta_info={"global_step": step})
            inject_trace_context(batch.meta_info)
            out_train.append(ray.get(train.get_batch.remote(batch, batch_size)))
            out_val.append(ray.get(val.get_batch.remote(batch, 2)))
        ray.get([train.rollout_mock_close.remote(), val.rollout_mock_close.remote()])
        ray.get([train.shutdown.remote(), val.shutdown.remote()])
    finally:
        ray.kill(train)
        ray.kill(val)
    return out_train, out_val


def rlvr_run(cfg: Any, steps: int, domains: tuple[str, ...] = ("math", "code")) -> list[Any]:
    """rlvr_pipeline.py: one DynamicSamplingScheduler per domain, joined with DataProto.concat."""
    from roll.distributed.scheduler.generate_scheduler import DynamicSamplingScheduler
    from roll.distributed.scheduler.protocol import DataProto

    schedulers = {
        domain: ray.remote(roll_scheduler(DynamicSamplingScheduler, cfg)).options(name=f"dss-{domain}").remote(
            pipeline_config=cfg, actor_cluster=None, reward_clusters={domain: None}, dataset=None,
            collect_fn_cls=None, collect_fn_kwargs=None)
        for domain in domains
    }
    out = []
    try:
        for step in range(steps):
            batch = DataProto(meta_info={"generation_config": {"num_return_sequences": 2}, "global_step": step})
            inject_trace_context(batch.meta_info)
            refs = {d: s.get_batch.remote(data=batch, global_step=step, batch_size=2) for d, s in schedulers.items()}
            out.append(DataProto.concat([ray.get(r) for r in refs.values()]))
            ray.get([s.pause_sampling.remote() for s in schedulers.values()])
        ray.get([s.rollout_mock_close.remote() for s in schedulers.values()])
    finally:
        for s in schedulers.values():
            ray.kill(s)
    return out


def test_roll_yaml_block_loads_unchanged(roll_root: Path) -> None:
    assert roll_config(CONFIGS / "roll_dump.yaml").dump_dir == "./output/rollout_dumps/baseline_v1"
    assert roll_config(CONFIGS / "roll_mock.yaml").mode.value == "mock"
    cfg = roll_config(pipeline_config(Path("x"), "mock"))  # ROLL's own dataclass, via the attribute
    assert cfg.enable and cfg.mode.value == "mock" and cfg.dump_dir == "x"


def test_agentic_dump_then_mock_default_config(roll_root: Path, tmp_path: Path) -> None:
    dump = tmp_path / "agentic"
    recorded_train, recorded_val = agentic_run(pipeline_config(dump, "dump"), 3)
    assert not list(dump.glob("*/step_*.pkl.tmp*"))
    manifest = open_dump(dump).manifest
    assert [s.key for s in manifest.stream_ids()] == ["train", "val"]
    entry = manifest.entry(manifest.stream_ids()[0], 0)
    assert entry is not None and entry.samples == 4
    assert "non_tensor_batch.traj_id" in entry.keys  # read through the proxy's storage
    replay_train, replay_val = agentic_run(pipeline_config(dump, "mock"), 3)
    for a, b in zip(replay_train + replay_val, recorded_train + recorded_val):
        same(a, b)


def test_a_rerun_asking_for_other_data_or_with_other_settings_stops(roll_root: Path, tmp_path: Path) -> None:
    from roll.configs import PipelineConfig, RolloutMockConfig

    from rollout_mock import ReplayMismatchError, RolloutSettingsMismatchError
    from rollout_mock.adapters.roll import roll_settings

    dump = tmp_path / "agentic"
    agentic_run(pipeline_config(dump, "dump"), 2)
    # the pre-flight check runs on the driver, before any actor is created
    other = PipelineConfig(sequence_length=32, rollout_mock=RolloutMockConfig(enable=True, mode="mock",
                                                                              dump_dir=str(dump)))
    assert roll_settings(other) == {"sequence_length": 32, "prompt_length": 8, "seed": 0}
    from roll.distributed.scheduler.rollout_scheduler import RolloutScheduler

    with pytest.raises(RolloutSettingsMismatchError, match="sequence_length: 16 in the dump run, 32 now"):
        roll_scheduler(RolloutScheduler, other)
    # issue 35: the schedulers shuffle their prompts with pipeline_config.seed, and a get_batch
    # request carries no prompt: another seed served the dump run's prompts
    reseeded = PipelineConfig(seed=7, rollout_mock=RolloutMockConfig(enable=True, mode="mock", dump_dir=str(dump)))
    with pytest.raises(RolloutSettingsMismatchError, match="  seed: 0 in the dump run, 7 now"):
        roll_scheduler(RolloutScheduler, reseeded)
    # another batch size: the actor refuses before serving step 0
    with pytest.raises(ReplayMismatchError) as info:
        agentic_run(pipeline_config(dump, "mock"), 2, batch_size=2)
    assert "train step 0" in str(info.value) and "batch_size: 4 in the dump run, 2 now" in str(info.value)


def test_rlvr_per_domain_streams_default_config(roll_root: Path, tmp_path: Path) -> None:
    dump = tmp_path / "rlvr"
    recorded = rlvr_run(pipeline_config(dump, "dump"), 2)
    keys = [s.key for s in open_dump(dump).streams()]
    assert keys == ["train/code", "train/math"]  # one stream per domain: no overwriting
    assert len(recorded[0]) == 8 and list(recorded[0]._non_tensor_batch["domain"][:4]) == ["math"] * 4
    replayed = rlvr_run(pipeline_config(dump, "mock"), 2)
    for a, b in zip(replayed, recorded):
        same(a, b)
        assert list(a._non_tensor_batch["domain"]) == list(b._non_tensor_batch["domain"])


def test_handle_path_dump_then_mock_without_actor(roll_root: Path, tmp_path: Path) -> None:
    from roll.distributed.scheduler.protocol import DataProto
    from roll.distributed.scheduler.rollout_scheduler import RolloutScheduler

    dump = tmp_path / "handle"
    created = []

    def make(cfg: Any) -> Any:
        def factory() -> Any:
            created.append(1)
            return ray.remote(RolloutScheduler).options(name=f"h-{len(created)}").remote(
                config=cfg, env_manager_config=None, resource_manager=None, infer_cluster=None, mode="train")
        return factory

    cfg = pipeline_config(dump, "dump")
    handle = roll_handle(make(cfg), cfg, spec=RolloutScheduler)
    recorded = [ray.get(handle.get_batch.remote(DataProto(meta_info={"global_step": s}), 4)) for s in range(2)]
    handle.close()
    ray.kill(handle.scheduler)
    # ROLL's mixin inside the actor was switched off: only rollout_mock's file, in the manifest
    assert sorted(p.name for p in (dump / "train").glob("step_*")) == ["step_000000.pkl", "step_000001.pkl"]
    cfg = pipeline_config(dump, "mock")
    mock = roll_handle(make(cfg), cfg, spec=RolloutScheduler)
    for step in range(2):
        same(ray.get(mock.get_batch.remote(DataProto(meta_info={"global_step": step}), 4)), recorded[step])
    assert len(created) == 1  # mock mode built no actor
    mock.close()


def test_import_roll_own_dump_then_cli_reads_it(roll_root: Path, tmp_path: Path, capsys: Any) -> None:
    """A dump written by ROLL's own mixin converts, replays safely, and ls/show/diff read it."""
    import asyncio

    from roll.distributed.scheduler.protocol import DataProto  # noqa: F401
    from roll.distributed.scheduler.rollout_scheduler import PipelineConfig, RolloutMockConfig, RolloutScheduler

    native = tmp_path / "native"
    cfg = PipelineConfig(rollout_mock=RolloutMockConfig(enable=True, mode="dump", dump_dir=str(native)))
    scheduler = RolloutScheduler(cfg, mode="train")  # ROLL's own mixin writes plain pickles
    originals = [asyncio.run(scheduler.get_batch(DataProto(meta_info={"global_step": s}), 3)) for s in range(2)]
    ours = tmp_path / "ours"
    assert main(["import", str(native), str(ours)]) == 2
    assert "--trust" in capsys.readouterr().err
    assert main(["import", str(native), str(ours), "--trust"]) == 0
    dump = open_dump(ours)
    for step in range(2):
        same(dump.load(step, "train"), originals[step])  # default: safe loader, no trust
    assert main(["ls", str(ours), "--keys"]) == 0
    out = capsys.readouterr().out
    assert "non_tensor_batch.traj_id" in out and out.count("non_tensor_batch.traj_id") == 1
    assert main(["show", str(ours), "--step", "1"]) == 0
    capsys.readouterr()
    copy = tmp_path / "copy"
    shutil.copytree(ours, copy)
    assert main(["diff", str(ours), str(copy)]) == 0
    assert "IDENTICAL" in capsys.readouterr().out


def test_non_tensor_difference_named_through_batch_proxy(roll_root: Path) -> None:
    from roll.distributed.scheduler.protocol import DataProto

    from rollout_mock.compare.diff import compare_batches

    def batch(tag: str, when: float = 1.0) -> Any:
        return DataProto.from_single_dict({
            "input_ids": torch.arange(6).reshape(3, 2),
            "tags": np.array(["a", tag, "c"], dtype=object),
        }, meta_info={"get_batch_return_start_time": when, "metrics": {"x": 1}})

    keys, compared = compare_batches(batch("b"), batch("b"))  # new proxies on each access: still equal
    assert keys == [] and compared >= 3
    keys, _ = compare_batches(batch("b"), batch("x"))
    assert [k.key for k in keys] == ["non_tensor_batch.tags"] and keys[0].first_index == 1
    keys, _ = compare_batches(batch("b"), batch("b", 2.0))
    assert [k.key for k in keys] == ["meta_info.get_batch_return_start_time"]
    assert compare_batches(batch("b"), batch("b", 2.0), ignore_timing=True)[0] == []
    assert compare_batches(batch("b"), batch("b", 2.0), ignore_meta=("get_batch_return_start_time",))[0] == []
    # the proxy itself, compared as a mapping (keys() + [key] only)
    keys, _ = compare_batches(batch("b").non_tensor_batch, batch("x").non_tensor_batch)
    assert [k.key for k in keys] == ["tags"] and keys[0].first_index == 1


def test_roll_settings_cover_what_decides_the_data(tmp_path: Path) -> None:
    """Issue 35 item 1: the seed, the templates and the data files (by content: another machine's
    copy is the same file, another file of the same size is not) are rollout settings. Read from
    ROLL's own field names (roll/configs/data_args.py, roll/pipeline/rlvr/rlvr_config.py)."""
    from types import SimpleNamespace

    from rollout_mock.adapters.roll import roll_settings

    def config(data: Path, seed: int = 42, template: str = "qwen2_5") -> Any:
        data_args = SimpleNamespace(template=None, file_name=[str(data)], domain_interleave_probs={"math": 1.0},
                                    prompt="prompt", messages=None, tag="tag", id="id")
        return SimpleNamespace(rollout_mock=None, seed=seed, global_template=template, tag_to_template={},
                               rollout_batch_size=64, actor_train=SimpleNamespace(data_args=data_args))

    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    for where in ("here", "there"):
        (tmp_path / where / "math.jsonl").write_text('{"prompt": "1+1"}\n')
    (tmp_path / "same_size.jsonl").write_text('{"prompt": "2+2"}\n')
    base = roll_settings(config(tmp_path / "here" / "math.jsonl"))
    assert base is not None and base["seed"] == 42 and base["global_template"] == "qwen2_5"
    assert base["actor_train.data_args.file_name"] == [{"size": 18, "sha256": base[
        "actor_train.data_args.file_name"][0]["sha256"]}]
    assert roll_settings(config(tmp_path / "there" / "math.jsonl")) == base
    for changed in (config(tmp_path / "same_size.jsonl"), config(tmp_path / "here" / "math.jsonl", seed=7),
                    config(tmp_path / "here" / "math.jsonl", template="llama3")):
        assert roll_settings(changed) != base
