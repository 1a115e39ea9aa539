"""slime: rollout_mock.adapters.slime.generate_rollout as --rollout-function-path, wrapping the
default rollout (a faithful double of slime installed at slime's module paths), and slime's
--save-debug-rollout-data files written by slime's own writer (double)."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_mock import open_dump
from rollout_mock.adapters import slime as adapter
from rollout_mock.cli import main

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"


@pytest.fixture
def slime_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    root = tmp_path / "pkg"
    for sub in ("slime", "slime/utils", "slime/rollout", "slime/observability"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").touch()
    shutil.copyfile(DOUBLES / "slime_rollout.py", root / "slime" / "utils" / "types.py")
    (root / "slime" / "rollout" / "base_types.py").write_text(
        "from slime.utils.types import RolloutFnTrainOutput, RolloutFnEvalOutput, call_rollout_fn  # noqa\n")
    (root / "slime" / "rollout" / "sglang_rollout.py").write_text(
        "CALLS = []\nfrom slime.utils import types as _t\n"
        "def generate_rollout(args, rollout_id, data_source, evaluation=False):\n"
        "    CALLS.append((rollout_id, evaluation))\n"
        "    return _t.generate_rollout(args, rollout_id, data_source, evaluation=evaluation)\n")
    (root / "slime" / "observability" / "rollout_data_utils.py").write_text(
        "from slime.utils.types import save_debug_rollout_data, load_debug_rollout_data, flatten  # noqa\n")
    monkeypatch.syspath_prepend(str(root))
    import slime.rollout.sglang_rollout as real

    yield real
    adapter.reset()
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]


def args() -> argparse.Namespace:
    return argparse.Namespace(rollout_batch_size=2, n_samples_per_prompt=2, n_eval=2)


def test_rollout_function_path_dump_then_mock(slime_pkg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn

    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "dump")
    monkeypatch.setenv("ROLLOUT_MOCK_DUMP_DIR", str(tmp_path / "d"))
    fn = adapter.generate_rollout  # what --rollout-function-path / --eval-function-path resolve to
    recorded = [call_rollout_fn(fn, args(), i, None, evaluation=False) for i in range(2)]
    evaluated = call_rollout_fn(fn, args(), 1, None, evaluation=True)
    assert isinstance(recorded[0], RolloutFnTrainOutput) and isinstance(evaluated, RolloutFnEvalOutput)
    assert slime_pkg.CALLS == [(0, False), (1, False), (1, True)]
    adapter.reset()
    dump = open_dump(tmp_path / "d")
    assert {s.key: dump.steps(s) for s in dump.streams()} == {"train": [0, 1], "val": [1]}

    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "mock")  # default config otherwise: safe loader
    slime_pkg.CALLS.clear()
    for i in range(2):
        out = call_rollout_fn(fn, args(), i, None, evaluation=False)
        assert [[s.to_dict() for s in g] for g in out.samples] == [[s.to_dict() for s in g] for g in recorded[i].samples]
        assert out.metrics == recorded[i].metrics
    ev = call_rollout_fn(fn, args(), 1, None, evaluation=True)
    assert [s.to_dict() for s in ev.data["eval_ds"]["samples"]] == [s.to_dict() for s in evaluated.data["eval_ds"]["samples"]]
    assert slime_pkg.CALLS == []  # the real rollout (sglang) never ran


def test_config_from_args_and_missing_config(slime_pkg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUT_MOCK_MODE", raising=False)
    monkeypatch.delenv("ROLLOUT_MOCK_CONFIG", raising=False)
    with pytest.raises(Exception, match="ROLLOUT_MOCK_CONFIG"):
        adapter.generate_rollout(args(), 0, None)
    a = args()
    a.rollout_mock_config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "e")}
    adapter.generate_rollout(a, 0, None)
    adapter.reset()
    assert open_dump(tmp_path / "e").steps(open_dump(tmp_path / "e").stream("train")) == [0]


def test_import_debug_rollout_data_and_subsample(slime_pkg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slime.observability.rollout_data_utils import flatten, save_debug_rollout_data
    from slime.rollout.base_types import RolloutFnTrainOutput

    template = str(tmp_path / "debug" / "{rollout_id}.pt")
    originals = {}
    for rid in (0, 1):
        out = slime_pkg.generate_rollout(args(), rid, None)
        originals[rid] = flatten(out.samples)
        save_debug_rollout_data(template, originals[rid], rollout_id=rid, evaluation=False)
    ev = slime_pkg.generate_rollout(args(), 1, None, evaluation=True)
    save_debug_rollout_data(template, ev.data, rollout_id=1, evaluation=True)
    assert main(["import", str(tmp_path / "debug"), str(tmp_path / "ours"), "--trust"]) == 0
    monkeypatch.setenv("ROLLOUT_MOCK_CONFIG", str(tmp_path / "cfg.yaml"))
    (tmp_path / "cfg.yaml").write_text(f"rollout_mock:\n  enable: true\n  mode: mock\n  dump_dir: {tmp_path / 'ours'}\n")
    replayed = adapter.generate_rollout(args(), 1, None)
    assert isinstance(replayed, RolloutFnTrainOutput)
    assert [s.to_dict() for s in flatten(replayed.samples)] == [s.to_dict() for s in originals[1]]
    assert len(replayed.samples) == 2  # regrouped by group_index
    adapter.reset()
    (tmp_path / "cfg.yaml").write_text(
        f"rollout_mock:\n  enable: true\n  mode: mock\n  dump_dir: {tmp_path / 'ours'}\n  subsample: 0.5\n")
    half = adapter.generate_rollout(args(), 0, None)
    # slime's rule: k = int(2 * 0.5) = 1 group kept: the first k // 2 = 0 and the last 1
    assert len(half.samples) == 1 and half.samples[0][0].to_dict() == originals[0][2].to_dict()


# ------------------------------------------------------------------------------ faithful replay (issue 26)
def _slime_args(**extra: Any) -> argparse.Namespace:
    return argparse.Namespace(rollout_batch_size=3, n_samples_per_prompt=2, rollout_temperature=1.0,
                              rollout_top_p=1.0, rollout_max_response_len=3, **extra)


def _samples(output: Any) -> list[Any]:
    out = []
    for group in output.samples:
        for sample in group:
            data = sample.to_dict()
            data.pop("non_generation_time")  # a wall time
            out.append(data)
    return out


def test_faithful_rerun_resume_and_mismatches(slime_pkg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slime.rollout.base_types import call_rollout_fn
    from slime.utils.types import RolloutDataSource

    from rollout_mock import ReplayMismatchError, RolloutSettingsMismatchError

    fn = adapter.generate_rollout
    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "dump")
    monkeypatch.setenv("ROLLOUT_MOCK_DUMP_DIR", str(tmp_path / "d"))
    source = RolloutDataSource(_slime_args())
    recorded, positions = [], []
    for i in range(4):
        recorded.append(call_rollout_fn(fn, _slime_args(), i, source, evaluation=False))
        positions.append(source.state_dict())  # what slime checkpoints after rollout i
    adapter.reset()

    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "mock")
    slime_pkg.CALLS.clear()
    fresh = RolloutDataSource(_slime_args())
    for i in range(4):  # a faithful rerun: same records, the data source moved as in the dump run
        assert _samples(call_rollout_fn(fn, _slime_args(), i, fresh, evaluation=False)) == _samples(recorded[i])
        assert fresh.state_dict() == positions[i]
    assert slime_pkg.CALLS == []
    adapter.reset()

    resumed = RolloutDataSource(_slime_args())
    resumed.load_state_dict(positions[1])  # slime --load: the data source of checkpoint 1
    for i in (2, 3):
        assert _samples(call_rollout_fn(fn, _slime_args(), i, resumed, evaluation=False)) == _samples(recorded[i])
    adapter.reset()

    shifted = RolloutDataSource(_slime_args())
    shifted.load_state_dict(positions[0])  # resumed from the wrong checkpoint
    with pytest.raises(ReplayMismatchError) as info:
        call_rollout_fn(fn, _slime_args(), 2, shifted, evaluation=False)
    assert info.value.step == 2 and info.value.nearest == 1 and "data_source" in info.value.argument
    adapter.reset()

    with pytest.raises(RolloutSettingsMismatchError, match="rollout_temperature: 1.0 in the dump run, 0.7 now"):
        a = _slime_args()
        a.rollout_temperature = 0.7
        call_rollout_fn(fn, a, 0, RolloutDataSource(a), evaluation=False)


def test_partial_rollouts_keep_every_segments_weight_version(slime_pkg: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """--partial-rollout: a sample aborted at a weight update is continued under the next
    weights; slime appends each segment's version to Sample.weight_versions. The record keeps
    them in order (provenance: segment_versions) and mock mode hands them back exactly."""
    from slime.rollout.base_types import call_rollout_fn

    real = slime_pkg.generate_rollout
    plans = [["2", "4", "6"], ["6"], ["4", "6"], ["2", "4", "6"]]

    def partial(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        output = real(args, rollout_id, data_source, evaluation=evaluation)
        for sample, versions in zip([s for g in output.samples for s in g], plans):
            sample.weight_versions = list(versions)  # one entry per generation segment
            sample.tokens = sample.tokens + [7] * (len(versions) - 1)  # continued segments add tokens
        return output

    monkeypatch.setattr(slime_pkg, "generate_rollout", partial)
    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "dump")
    monkeypatch.setenv("ROLLOUT_MOCK_DUMP_DIR", str(tmp_path / "d"))
    recorded = call_rollout_fn(adapter.generate_rollout, args(), 0, None, evaluation=False)
    adapter.reset()
    dump = open_dump(tmp_path / "d")
    record = dump.load(0)
    assert adapter.segment_versions(record) == {
        "segments": plans, "first": ["2", "6", "4", "2"], "last": ["6", "6", "6", "6"]}
    assert [c.provenance for c in dump.calls(0)] == [adapter.segment_versions(record)]  # in the index

    monkeypatch.setenv("ROLLOUT_MOCK_MODE", "mock")
    slime_pkg.CALLS.clear()
    out = call_rollout_fn(adapter.generate_rollout, args(), 0, None, evaluation=False)
    assert [s.weight_versions for g in out.samples for s in g] == plans
    assert [[s.to_dict() for s in g] for g in out.samples] == [[s.to_dict() for s in g] for g in recorded.samples]
    assert slime_pkg.CALLS == []
