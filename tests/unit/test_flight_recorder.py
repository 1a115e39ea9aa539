"""The flight recorder (``keep:``): its config, the NaN/inf scan, the robust z detector, the ring's
decisions, pins in the index, and what ``rollout-mock ls`` shows. The 2,000-step scenario and S3
are in tests/integration/test_flight_recorder_scenario.py."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

import rollout_mock
from rollout_mock import ConfigError, ManifestError, MetricsWriter, MockScheduler, load_config, open_dump
from rollout_mock.cli import main as cli_main
from rollout_mock.codec.scan import nonfinite_values
from rollout_mock.config import config_parts
from rollout_mock.storage import BatchInfo, DirectoryStore
from rollout_mock.storage.manifest import MAX_PIN_CHARS, StepEntry, StreamId
from rollout_mock.wrap.retention import MetricWatch, Retention, active_recorders, robust_z

TRAIN = StreamId("train")


def keep_settings(**keep: Any) -> Any:
    settings = config_parts(load_config(cfg(Path("/unused"), keep=keep))).record.keep
    assert settings is not None
    return settings


class Steps:
    """A scheduler whose batch of step N holds N (and a NaN where asked)."""

    def __init__(self, nan_at: tuple[int, ...] = ()) -> None:
        self.nan_at = nan_at

    def get_batch(self, data: Any, global_step: int) -> dict[str, torch.Tensor]:
        x = torch.full((2, 3), float(global_step))
        if global_step in self.nan_at:
            x[1, 2] = math.nan
        return {"x": x, "ids": torch.arange(3)}


def record(dump: Path, steps: range, **options: Any) -> MockScheduler[Steps]:
    """Record ``steps`` (the scheduler is returned closed)."""
    nan_at = options.pop("nan_at", ())
    with MockScheduler(Steps(nan_at), cfg(dump, **options)) as sched:
        for step in steps:
            sched.get_batch(None, global_step=step)
    return sched


def kept(dump: Path) -> dict[int, list[str] | None]:
    reader = open_dump(dump)
    return {step: reader.entry(TRAIN, step).pin for step in reader.steps(TRAIN)}  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(("block", "says"), [
    ({"max_keep": 3, "keep": {"last": 4}}, "rollout_mock.keep: invalid value {'last': 4}: last (4) contradicts max_keep (3)"),
    ({"keep": {"last": 3, "before": 3}}, "before (3) must be below last (3)"),
    ({"max_keep": 3, "keep": {"before": 5}}, "raise max_keep to at least 6"),
    ({"keep": {"metrics": {"loss": {"z": 0}}}}, "metrics.loss.z: Input should be greater than 0"),
    ({"keep": {"metrics": {"loss": {"window": 20, "warmup": 30}}}}, "warmup (30) must be at most window (20)"),
    ({"keep": {"max_bytes": "a lot"}}, "max_bytes: could not parse"),
    ({"keep": {"max_bytes": 0}}, "max_bytes: must be at least 1 byte"),
    ({"keep": {"lats": 5}}, "rollout_mock.keep: unknown key 'lats' in keep (did you mean 'last'?); valid keys: last,"),
    ({"keep": {"metrics": {"loss": {"zz": 1}}}}, "unknown key 'zz' in keep.metrics.loss (did you mean 'z'?)"),
    ({"keep": {"after": -1}}, "after: Input should be greater than or equal to 0"),
])
def test_contradictory_or_bad_keep_settings_are_one_line_errors(block: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"enable": True, "dump_dir": "/x", **block})
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_max_keep_is_keep_last_shorthand() -> None:
    assert keep_settings(last=7).last == 7
    parts = config_parts(load_config({"enable": True, "dump_dir": "/x", "max_keep": 7}))
    assert parts.record.keep is not None and parts.record.keep.last == 7 and parts.record.keep.before == 0
    same = config_parts(load_config({"enable": True, "dump_dir": "/x", "max_keep": 7, "keep": {"last": 7, "after": 2}}))
    assert same.record.keep is not None and (same.record.keep.last, same.record.keep.after) == (7, 2)
    merged = config_parts(load_config({"enable": True, "dump_dir": "/x", "max_keep": 7, "keep": {"before": 6}}))
    assert merged.record.keep is not None and merged.record.keep.last == 7
    assert config_parts(load_config({"enable": True, "dump_dir": "/x"})).record.keep is None  # nothing kept or scanned


def test_keep_values_and_rule_lookup() -> None:
    keep = keep_settings(max_bytes="2GiB", metrics={"loss": 6, "grad_*": {"z": 5, "window": 20}, "*": {"z": 9}})
    assert keep.max_bytes == 2 << 30 and keep.last is None and keep.ring
    assert keep.rule("loss").z == 6 and keep.rule("grad_norm").window == 20 and keep.rule("reward").z == 9
    plain = keep_settings()
    assert plain.rule("anything").z is None and plain.rule("anything").nonfinite and not plain.ring


# ----------------------------------------------------------------------------- NaN/inf scan
def test_scan_names_where_a_batch_holds_nan_or_inf() -> None:
    batch = {
        "logprobs": torch.tensor([[0.1, math.nan], [math.inf, 0.2]]),
        "rewards": torch.tensor([1.0, -math.inf]).bfloat16(),
        "ids": torch.arange(4),
        "mask": torch.ones(4, dtype=torch.bool),
        "values": np.array([1.0, np.nan], dtype=np.float32),
        "meta": {"temperature": math.nan, "prompts": ["a", "b"]},
    }
    assert nonfinite_values(batch) == ["logprobs (1 NaN, 1 inf)", "rewards (1 inf)", "values (1 NaN)",
                                       "meta.temperature (nan)"]
    assert nonfinite_values(batch, limit=1) == ["logprobs (1 NaN, 1 inf)"]


def test_scan_walks_every_batch_type() -> None:
    items = [{"rewards": torch.tensor([1.0])}, None, {"rewards": torch.tensor([math.nan]), "r": [1.0, math.inf]}]
    assert nonfinite_values(items) == ["[2].rewards (1 NaN)", "[2].r[1] (inf)"]  # AReaL's trajectories
    odd = {
        "complex": torch.tensor([1 + 1j, complex(math.nan, 0)]),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.tensor([math.inf])], layout=torch.jagged),
        "big_endian": np.array([1.0, np.inf], dtype=">f8"),
        "objects": np.array([1.0, "text", np.nan], dtype=object),
        "half": np.array([np.nan], dtype=np.float16),
    }
    assert nonfinite_values(odd) == ["complex (1 NaN)", "nested (1 inf)", "big_endian (1 inf)", "objects[2] (nan)"]
    clean = {"x": torch.randn(64, 64), "y": np.zeros(3), "tokens": [[1, 2], [3]], "empty": torch.empty(0)}
    assert nonfinite_values(clean) == []


@pytest.mark.verl
def test_scan_walks_a_dataproto() -> None:
    from verl.protocol import DataProto

    batch = DataProto.from_dict(
        tensors={"old_log_probs": torch.tensor([[0.1, math.nan]]), "input_ids": torch.ones(1, 2, dtype=torch.long)},
        non_tensors={"score": np.array([np.inf], dtype=object), "text": np.array(["a"], dtype=object)},
        meta_info={"global_step": 3},
    )
    assert nonfinite_values(batch) == ["batch.old_log_probs (1 NaN)", "non_tensor_batch.score[0] (inf)"]


# ----------------------------------------------------------------------------- robust z
def test_robust_z_scale_mad_then_mean_deviation_then_none() -> None:
    window = [1.0, 2.0, 3.0, 4.0, 5.0]  # median 3, MAD 1
    assert robust_z(3.0 + 1.4826 * 6, window) == pytest.approx(6.0)
    # more than half the values equal: MAD 0, the mean absolute deviation is the scale
    mostly_equal = [1.0] * 6 + [2.0] * 4
    assert robust_z(5.0, mostly_equal) == pytest.approx(4.0 / (1.2533 * 0.4))
    assert robust_z(5.0, [1.0] * 10) is None  # all equal: no scale, nothing is a jump
    assert robust_z(5.0, []) is None


def test_metric_watch_warmup_window_and_nan() -> None:
    watch = MetricWatch(keep_settings(metrics={"loss": {"z": 6, "window": 10, "warmup": 5}}))
    values = [1.0, 1.1, 0.9, 1.05, 0.95]
    for step, value in enumerate(values[:4]):
        assert watch.check(step, {"loss": value}) == []
    assert watch.check(4, {"loss": 100.0}) == []  # 4 values in the window: still warming up
    assert watch.check(5, {"loss": 1.0}) == []
    spike = watch.check(6, {"loss": 50.0})
    assert len(spike) == 1 and spike[0].startswith("metric loss = 50: ") and "(z > 6)" in spike[0]
    assert watch.check(7, {"loss": math.nan}) == ["metric loss = nan"]  # NaN: an anomaly, not in the window
    assert list(watch._series["loss"].window) == [1.0, 1.1, 0.9, 1.05, 100.0, 1.0, 50.0]
    assert watch.check(7, {"loss": math.inf}) == []  # the same step again counts once
    assert watch.check(8, {"loss": -math.inf, "reward": math.nan, "text": "n/a", "flag": True}) == [
        "metric loss = -inf", "metric reward = nan"]
    for step in range(9, 30):  # the window is bounded
        watch.check(step, {"loss": 1.0})
    assert len(watch._series["loss"].window) == 10


def test_metric_without_rule_is_checked_for_nan_only_and_nonfinite_can_be_off() -> None:
    watch = MetricWatch(keep_settings(metrics={"entropy": {"nonfinite": False}}))
    for step in range(30):
        assert watch.check(step, {"loss": 1.0 + step % 2 * 1e-3, "entropy": math.nan}) == []
    assert watch.check(30, {"loss": 1e9}) == []  # no z for loss: no spike
    assert watch.check(31, {"loss": torch.tensor(math.nan)}) == ["metric loss = nan"]  # 0-d tensors are numbers


# ----------------------------------------------------------------------------- the ring
def test_ring_keeps_the_newest_steps_plus_windows_and_pins() -> None:
    retention = Retention(keep_settings(last=4, before=2, after=1), pin_steps=[0])
    deleted = []
    for step in range(20):
        plan = retention.written(step, 10)
        deleted += plan.delete
        if step == 10:
            plan = retention.anomaly(10, "loss = nan")
            assert plan.window == range(8, 12) and sorted(plan.annotate) == [8, 9, 10] and not plan.lost
    assert retention.ring == [16, 17, 18, 19]
    assert sorted(retention.kept()) == [0, 8, 9, 10, 11]
    assert retention.kept()[11] == ("window of step 10",)
    assert sorted(deleted) == [s for s in range(16) if s not in (0, 8, 9, 10, 11)]


def test_ring_bounded_in_bytes_keeps_at_least_the_newest_step() -> None:
    retention = Retention(keep_settings(last=10, max_bytes=250))
    for step in range(6):
        retention.written(step, 100)
    assert retention.ring == [4, 5]
    retention.written(6, 1000)  # larger than max_bytes alone: it stays, the others go
    assert retention.ring == [6]


def test_pin_of_a_deleted_step_is_lost_and_of_a_future_step_waits() -> None:
    retention = Retention(keep_settings(last=3, before=1, after=1))
    for step in range(10):
        retention.written(step, 1)
    late = retention.anomaly(5, "too late")
    assert late.lost == [4, 5, 6] and not late.annotate
    early = retention.anomaly(12, "ahead")
    assert early.lost == [] and not early.annotate  # not recorded yet
    for step in range(10, 20):
        plan = retention.written(step, 1)
        if step in (11, 12, 13):
            assert step in plan.annotate
    assert sorted(retention.kept()) == [11, 12, 13]


def test_detected_anomalies_are_capped_but_explicit_pins_are_not() -> None:
    retention = Retention(keep_settings(last=2, max_anomalies=2))
    for step in range(10):
        retention.written(step, 1)
        assert retention.anomaly(step, "nan").capped is (step >= 2)
    assert retention.anomaly(1, "nan again").capped is False  # already an anomaly: not one more
    assert not retention.anomaly(9, "by hand", detected=False).capped
    for step in range(10, 14):
        retention.written(step, 1)
    assert retention.kept() == {0: ("nan",), 1: ("nan", "nan again"), 9: ("by hand",)}


def test_existing_steps_join_the_ring_and_keep_their_pins() -> None:
    existing = [(step, 1, ["old reason"] if step == 2 else None) for step in range(8)]
    retention = Retention(keep_settings(last=3), existing=existing)
    plan = retention.written(8, 1)  # the first new step carries out what the old ones need
    assert sorted(plan.delete) == [0, 1, 3, 4, 5] and not plan.annotate
    assert retention.kept() == {2: ("old reason",)}


# ----------------------------------------------------------------------------- the index
def test_pin_field_is_validated_on_read() -> None:
    base = {"file": "train/step_000001.pkl", "size": 1, "checksum": "crc32:00000000"}
    assert StepEntry.from_json({**base, "pin": ["nan in loss"]}, where="w").pin == ["nan in loss"]
    assert "pin" not in StepEntry.from_json(base, where="w").to_json()  # unpinned entries are as before
    for bad in ("a reason", [], [1], ["x"] * 9, ["x" * (MAX_PIN_CHARS + 1)], ["\x1b[31mred"], ["a\nb"], [None]):
        with pytest.raises(ManifestError, match="pin .* is not a list of at most 8 reasons"):
            StepEntry.from_json({**base, "pin": bad}, where="w")


def test_store_pins_a_written_step_and_deletes_in_one_batch(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "d")
    for step in range(5):
        batch = {"x": torch.full((2,), float(step))}
        store.save(TRAIN, step, batch, BatchInfo.of(batch))
    entry = store.pin(TRAIN, 2, ["loss\x1b = nan\n", "y" * 500])
    assert entry is not None and entry.pin == ["loss = nan", "y" * (MAX_PIN_CHARS - 1) + "…"]
    assert store.pin(TRAIN, 42, ["absent"]) is None
    removed: list[list[str]] = []
    real_remove = store.backend.remove
    store.backend.remove = lambda rels: (removed.append(list(rels)), real_remove(rels))[1]  # type: ignore[method-assign]
    store.delete_many(TRAIN, [0, 1, 3, 99])
    assert removed == [[f"train/.index/step_00000{s}.json" for s in (0, 1, 3)],
                       [f"train/step_00000{s}.pkl" for s in (0, 1, 3)]]
    store.close()
    assert kept(tmp_path / "d") == {2: ["loss = nan", "y" * (MAX_PIN_CHARS - 1) + "…"], 4: None}


# ----------------------------------------------------------------------------- end to end (small)
def test_nan_in_a_batch_keeps_its_window_with_the_reason(tmp_path: Path) -> None:
    record(tmp_path / "d", range(30), nan_at=(12,), keep={"last": 4, "before": 2, "after": 3})
    reason = "NaN/inf in the batch: x (1 NaN)"
    window = "window of step 12"
    assert kept(tmp_path / "d") == {10: [window], 11: [window], 12: [reason], 13: [window], 14: [window],
                                    15: [window], 26: None, 27: None, 28: None, 29: None}


def test_legacy_max_keep_and_pin_steps_mark_the_index(tmp_path: Path) -> None:
    record(tmp_path / "d", range(6), max_keep=2, pin_steps=[0])
    assert kept(tmp_path / "d") == {0: ["pin_steps"], 4: None, 5: None}


def test_without_keep_nothing_is_deleted_but_pins_are_written(tmp_path: Path) -> None:
    with MockScheduler(Steps(nan_at=(1,)), cfg(tmp_path / "d")) as sched:
        for step in range(4):
            sched.get_batch(None, global_step=step)
        assert sched.observe(2, {"loss": math.nan}) == []  # no keep: nothing is watched
        assert sched.pin(3, "looked odd")
    assert kept(tmp_path / "d") == {0: None, 1: None, 2: None, 3: ["looked odd"]}


def test_pin_of_an_already_written_step_and_of_a_deleted_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with MockScheduler(Steps(), cfg(tmp_path / "d", keep={"last": 3})) as sched:
        for step in range(10):
            sched.get_batch(None, global_step=step)
        sched.flush()  # every step is on disk: pinning rewrites the entry of a written step
        assert sched.pin(8, "reward collapsed")
        with caplog.at_level(logging.WARNING, logger="rollout_mock"):
            assert not sched.pin(2, "too late")
        for step in range(10, 15):
            sched.get_batch(None, global_step=step)
    message = " ".join(r.getMessage() for r in caplog.records if "already deleted" in r.getMessage())
    assert "step 2 of train (the pinned step) was already deleted by the ring (newest recorded step 9)" in message
    assert "raise keep.last (now 3) to at least 8" in message
    assert kept(tmp_path / "d") == {8: ["reward collapsed"], 12: None, 13: None, 14: None}


def test_observe_through_the_scheduler_the_metrics_writer_and_the_module(tmp_path: Path) -> None:
    keep = {"last": 2, "after": 1, "metrics": {"loss": {"z": 5, "warmup": 5}}}
    with MockScheduler(Steps(), cfg(tmp_path / "d", keep=keep)) as sched, \
            MetricsWriter(tmp_path / "m.jsonl", expected=sched) as log:
        for step in range(20):
            sched.get_batch(None, global_step=step)
            if step == 8:
                assert rollout_mock.observe(step, {"grad_norm": math.inf}) == ["metric grad_norm = inf"]
            elif step == 15:
                assert rollout_mock.pin(step, "by hand")
            log.log(step, {"loss": 1.0 + 0.01 * (step % 3) + (9.0 if step == 12 else 0.0)})
        assert sched.observe(19, {"loss": math.nan}) == []  # logged for step 19 already: counted once
        assert sched.observe(19, {"kl": math.nan}) == ["metric kl = nan"]
    assert rollout_mock.observe(3, {"loss": math.nan}) == [] and not rollout_mock.pin(3, "closed")
    pins = kept(tmp_path / "d")
    assert sorted(pins) == [8, 9, 12, 13, 15, 16, 18, 19]
    assert pins[12] is not None and pins[12][0].startswith("metric loss = 10: ")
    assert pins[19] == ["metric kl = nan"] and pins[8] == ["metric grad_norm = inf"]
    assert pins[16] == ["window of step 15"] and pins[18] is None


def test_mock_mode_observe_and_pin_do_nothing(tmp_path: Path) -> None:
    record(tmp_path / "d", range(3), keep={"last": 2})
    with MockScheduler(None, cfg(tmp_path / "d", "mock"), spec=Steps) as mock:
        mock.get_batch(None, global_step=1)
        assert mock.observe(1, {"loss": math.nan}) == [] and not mock.pin(1, "x")
        assert active_recorders() == []
    assert kept(tmp_path / "d") == {1: None, 2: None}


def test_a_resumed_dump_keeps_the_steps_pinned_before(tmp_path: Path) -> None:
    record(tmp_path / "d", range(10), nan_at=(4,), keep={"last": 3})
    record(tmp_path / "d", range(10, 20), keep={"last": 3})
    assert kept(tmp_path / "d") == {4: ["NaN/inf in the batch: x (1 NaN)"], 17: None, 18: None, 19: None}


def test_ls_shows_pinned_steps_with_their_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path / "d", range(8), nan_at=(3,), keep={"last": 2, "after": 1}, pin_steps=[0])
    assert cli_main(["ls", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "train: steps 0, 3-4, 6-7 (5 files" in out and "; pinned: 0, 3-4" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip().startswith("step ")}
    assert lines["0"].endswith("PINNED: pin_steps")
    assert lines["3"].endswith("PINNED: NaN/inf in the batch: x (1 NaN)")
    assert lines["4"].endswith("PINNED: window of step 3")
    assert "PINNED" not in lines["6"]
    assert cli_main(["ls", str(tmp_path / "d"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pinned"] == {"train": {"0": ["pin_steps"], "3": ["NaN/inf in the batch: x (1 NaN)"],
                                        "4": ["window of step 3"]}}
    assert data["streams"]["train"]["steps"]["3"]["pin"] == ["NaN/inf in the batch: x (1 NaN)"]
    assert "pin" not in data["streams"]["train"]["steps"]["6"]


def test_ls_refuses_a_forged_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path / "d", range(2))
    manifest = tmp_path / "d" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["streams"]["train"]["steps"]["1"]["pin"] = ["x" * 100_000]
    manifest.write_text(json.dumps(data))
    assert cli_main(["ls", str(tmp_path / "d")]) == 2
    assert "pin" in capsys.readouterr().err


def test_a_batch_the_scan_cannot_read_is_recorded_anyway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import rollout_mock.wrap.recording as recording

    def broken(batch: Any) -> list[str]:
        raise RuntimeError("odd tensor subclass")

    monkeypatch.setattr(recording, "nonfinite_values", broken)
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        record(tmp_path / "d", range(4), keep={"last": 2})
    assert kept(tmp_path / "d") == {2: None, 3: None}
    said = [r.getMessage() for r in caplog.records if "could not scan" in r.getMessage()]
    assert len(said) == 1 and "step 0 of train for NaN/inf (RuntimeError: odd tensor subclass)" in said[0]


_CAPTURED_CASES = {
    "tensors and a body list": {"logprobs": torch.tensor([[0.5, math.nan]]), "ids": torch.arange(2),
                                "meta": {"t": [1.0, math.inf]}},
    "header float": {"x": torch.zeros(3), "meta": {"temperature": math.nan, "prompts": ["a", "b"]}},
    "body tensors": {"y": [torch.randn(7) for _ in range(5)] + [torch.tensor([0.0, -math.inf])]},
    "odd values": {
        "complex": torch.tensor([1 + 1j, complex(math.nan, 0)]),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.tensor([math.inf])], layout=torch.jagged),
        "big_endian": np.array([1.0, np.inf], dtype=">f8"),
        "objects": np.array([1.0, "text", np.nan], dtype=object),
    },
    "float32 array in a list": [{"r": np.array([1.0, np.nan], dtype=np.float32)}, {"r": np.zeros(2)}],
    "a sample's float": [{"tokens": list(range(8)), "reward": 0.5}, {"tokens": [1], "reward": math.nan}],
    "float64 scalar": {"meta": {"score": np.float64("inf")}},
    "float16 column": {"h": torch.tensor([1.0, math.nan], dtype=torch.float16), "i": torch.arange(3)},
    "a body of several chunks": {"r": [0.5] * 10 + [-math.inf] + [0.25] * 600_000},
}


@pytest.mark.parametrize("name", list(_CAPTURED_CASES))
def test_the_writer_thread_scans_what_the_codec_captured(name: str) -> None:
    """The background writer hands the recorder the codec's capture of a batch, not the batch:
    its NaN/inf are found all the same, named as the walk of the batch names them."""
    import rollout_mock.codec as codec

    batch = _CAPTURED_CASES[name]
    captured = codec.capture(batch, pool=codec.BufferPool())
    try:
        assert nonfinite_values(captured) == nonfinite_values(batch) != []
        assert not captured.floats_finite() or any(
            _suspect(value) for _, value in captured.tensors())  # the in-place look saw it
    finally:
        captured.release()


def _suspect(value: Any) -> bool:
    values = torch.as_tensor(value) if isinstance(value, np.ndarray) and value.dtype.isnative else value
    if isinstance(values, np.ndarray):
        return not bool(np.isfinite(values).all())
    return (values.is_floating_point() or values.is_complex()) and not bool(torch.isfinite(values).all())


@pytest.mark.parametrize("batch", [
    {"x": torch.randn(64, 1 << 12), "ids": torch.arange(10**5), "y": [torch.randn(7) for _ in range(30)],
     "text": ["a prompt"] * 50, "meta": {"t": [1.0, 2.5], "lr": 1e-5, "big": 1e308, "tiny": -5e-324}},
    [{"tokens": list(range(64)), "reward": float(i) / 3, "logprobs": [-0.5] * 64} for i in range(64)],
    {"values": np.random.default_rng(0).standard_normal(10_000), "objects": np.array([1.0, "a", None], dtype=object),
     "ints": list(range(-300, 70_000, 7)), "raw": bytes(range(256)) * 4},
])
def test_a_clean_capture_is_scanned_in_place(batch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean step (the common case) is read where the capture holds it: neither rebuilt
    (view_capture) nor decoded nor encoded again; the Python floats by a byte search only."""
    import rollout_mock.codec as codec
    import rollout_mock.codec.scan as scan

    captured = codec.capture(batch, pool=codec.BufferPool())

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the scan of a clean capture rebuilt, decoded or encoded it")

    monkeypatch.setattr(scan, "view_capture", refused)
    for module, name in [(codec, "decode"), (codec, "open_step"), (codec, "encode"), (codec, "capture")]:
        monkeypatch.setattr(module, name, refused)
    try:
        assert captured.floats_finite()
        assert nonfinite_values(captured) == []
    finally:
        captured.release()


def test_bytes_that_look_like_a_nonfinite_float_are_looked_at_closer() -> None:
    """The byte search of the body may raise a false alarm (a bytes value holding the pattern of
    a float64 inf): the scan then names the places exactly, here none."""
    import rollout_mock.codec as codec

    batch = {"raw": [b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"], "ok": [1.5]}
    captured = codec.capture(batch)
    try:
        assert not captured.floats_finite()
        assert nonfinite_values(captured) == []
    finally:
        captured.release()


def test_the_capture_is_scanned_over_its_own_memory_without_a_copy() -> None:
    """view_capture rebuilds the batch over the capture's buffers: a multi-chunk tensor is a view
    of the pooled buffer it was copied into (no second encode, no decode of a copy), every value
    equal; the live batch changed after the capture does not reach the scan."""
    import numpy as np

    import rollout_mock.codec as codec

    batch = {"x": torch.randn(8, 1 << 20), "ids": torch.arange(10**5), "y": [torch.randn(7) for _ in range(300)],
             "text": ["a prompt"] * 50, "meta": {"t": [1.0, 2.5]}}
    batch["y"][200][3] = math.inf
    expected = {"x": batch["x"].clone(), "y": [t.clone() for t in batch["y"]]}
    captured = codec.capture(batch, pool=codec.BufferPool())
    batch["x"][0, 0] = math.nan  # after the capture: not in the recording
    try:
        view = codec.view_capture(captured)
        starts = [int(np.frombuffer(chunk, np.uint8).ctypes.data) for chunk, _ in captured.chunks]
        assert any(start <= view["x"].data_ptr() < start + chunk.nbytes
                   for start, (chunk, _) in zip(starts, captured.chunks))  # over the capture's memory
        assert len(captured.chunks) > 8  # x alone spans 8 chunks of 4 MiB: one view over all of them
        assert torch.equal(view["x"], expected["x"]) and torch.equal(view["ids"], batch["ids"])
        assert all(torch.equal(a, b) for a, b in zip(view["y"], expected["y"], strict=True))
        assert view["text"] == batch["text"] and view["meta"] == batch["meta"]
        assert nonfinite_values(view) == ["y[200] (1 inf)"]
    finally:
        captured.release()


def test_the_report_marks_the_kept_steps_on_every_chart_with_their_reasons(tmp_path: Path) -> None:
    """The flight recorder's anomalies and pins: a quiet mark on every chart of the page (its
    reasons shown in the chart's tooltip on hover), for the charts whose steps include it."""
    import json
    import re

    from rollout_mock import MetricsWriter
    from rollout_mock.debug import write_report

    with MockScheduler(Steps((12,)), cfg(tmp_path / "d", keep={"last": 4, "before": 2, "after": 3})) as sched, \
            MetricsWriter(tmp_path / "m.jsonl", expected=sched) as log:
        for step in range(30):
            sched.get_batch(None, global_step=step)
            log.log(step, {"loss": 1.0 / (step + 1)})  # the report charts the dump run's metrics
    html = write_report(tmp_path / "d", tmp_path / "r.html").read_text()
    data = json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))
    charted = [c for c in data["charts"] if c["x"]]
    assert charted
    for chart in charted:
        quiet = {m["x"]: m["label"] for m in chart["marks"] if m.get("quiet")}
        assert quiet[12] == "kept: NaN/inf in the batch: x (1 NaN)", chart["title"]
        assert quiet[10] == "kept: window of step 12" and 26 not in quiet, chart["title"]
    js = (Path(__file__).parents[2] / "rollout_mock" / "debug" / "assets" / "report.js").read_text()
    assert "if (m.x === spec.x[i]) text.push(" in js  # the reasons go into the chart's tooltip
