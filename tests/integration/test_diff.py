"""``rollout-mock diff``: two dumps compared per stream, step and key, on real dump directories."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S, restored_process_state
from tensordict import TensorDict

from rollout_mock import DirectoryStore, MockScheduler, cli, compare_batches, diff_dumps
from rollout_mock.compare.diff import format_diff, parse_steps
from rollout_mock.demo import RolloutBatch, StepRequest, ToyRolloutScheduler, run_pipeline
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId
from rollout_mock.text import progress_bar


@pytest.fixture(scope="module", autouse=True)
def _restore_process_state() -> Iterator[None]:
    """run_pipeline() makes the process deterministic: undo that after this module."""
    with restored_process_state():
        yield


def write_dump(path: Path, steps: dict[int, Any], split: str = "train", name: str | None = None) -> Path:
    store = DirectoryStore(path)
    stream = StreamId(split, name)
    store.open_writer(stream)
    try:
        for step, batch in steps.items():
            store.save(stream, step, batch, BatchInfo.of(batch))
    finally:
        store.close()
    return path


def make_batch(step: int, n: int = 8) -> RolloutBatch:
    g = torch.Generator().manual_seed(step)
    return RolloutBatch(
        batch={
            "input_ids": torch.randint(0, 16, (n, 6), generator=g),
            "old_log_probs": torch.randn(n, 4, generator=g),
            "rewards": torch.rand(n, generator=g),
        },
        non_tensor_batch={"uid": np.array([f"p{i // 2}" for i in range(n)], dtype=object)},
        meta_info={"global_step": step, "temperature": 1.0},
    )


def run_diff(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["diff", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_dump(tmp_path / "a", {s: make_batch(s) for s in range(4)})


# ------------------------------------------------------------------------------ identical


def test_identical_dumps_fast_path_loads_nothing(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = write_dump(tmp_path / "b", {s: make_batch(s) for s in range(4)})

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fast path must not unpickle anything")

    monkeypatch.setattr("rollout_mock.storage.reader.Dump.load", refuse)
    monkeypatch.setattr("rollout_mock.codec.safe.StepView.load", refuse)
    code, out, err = run_diff([str(base), str(other)], capsys)
    assert code == 0, out + err
    assert "rollout-mock diff: IDENTICAL" in out
    assert "nothing unpickled" in out
    assert "4 identical by checksum (not loaded)" in out
    report = diff_dumps(base, other)
    assert report.ok and report.identical and report.loaded_steps == 0


def test_same_content_different_bytes_is_equal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x, y = torch.arange(6.0), np.arange(3)
    a = write_dump(tmp_path / "a", {0: {"x": x, "y": y}})
    b = write_dump(tmp_path / "b", {0: {"y": y, "x": x}})  # other key order: other pickle bytes
    code, out, _ = run_diff([str(a), str(b)], capsys)
    assert code == 0, out
    assert "1 equal after loading" in out
    report = diff_dumps(a, b)
    assert report.streams[0].steps[0].status == "equal" and report.streams[0].steps[0].loaded


# ------------------------------------------------------------------------------ differences


def test_difference_at_known_step_key_and_sample(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = {s: make_batch(s) for s in range(4)}
    logp = changed[2].batch["old_log_probs"]
    logp[5, 3] = logp[5, 3] + 0.25
    logp[7, 0] = logp[7, 0] - 0.125
    b = write_dump(tmp_path / "b", changed)

    code, out, _ = run_diff([str(base), str(b)], capsys)
    assert code == 1
    assert "rollout-mock diff: DIFFERENT (1 of 4 steps differ)" in out
    assert "3 identical by checksum (not loaded)" in out
    assert "step 2: 1 of 6 keys differ, first differing sample 5" in out
    line = next(line for line in out.splitlines() if "batch.old_log_probs" in line)
    assert "float32 [8, 4]" in line and "max abs diff 0.25" in line
    assert "2 of 8 samples differ, first at sample 5 ([5, 3]:" in line

    code, out, _ = run_diff([str(base), str(b), "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["loaded_steps"] == 1
    assert data["first_difference"] == {"stream": "train", "step": 2}
    step = data["streams"][0]["steps"][2]
    (key,) = step["keys"]
    assert key["key"] == "batch.old_log_probs"
    assert key["first_index"] == 5 and key["first_element"] == [5, 3]
    assert key["samples_differ"] == 2 and key["elements_differ"] == 2
    assert key["max_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    assert step["first_differing_sample"] == 5

    # --steps excluding step 2: identical
    code, out, _ = run_diff([str(base), str(b), "--steps", "0-1,3"], capsys)
    assert code == 0, out


def test_tolerance_makes_small_differences_close(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.linspace(0, 1, 10, dtype=torch.float64)
    a = write_dump(tmp_path / "a", {0: {"x": x}})
    b = write_dump(tmp_path / "b", {0: {"x": x + 1e-9}})
    assert run_diff([str(a), str(b)], capsys)[0] == 1
    code, out, _ = run_diff([str(a), str(b), "--atol", "1e-6"], capsys)
    assert code == 0, out
    assert "WITHIN TOLERANCE" in out and "within tolerance" in out
    code, out, _ = run_diff([str(a), str(b), "--atol", "-1"], capsys)
    assert code == 2


def test_shape_and_dtype_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_dump(tmp_path / "a", {0: {"ids": torch.zeros(4, 5, dtype=torch.int64), "p": torch.ones(4)}})
    b = write_dump(tmp_path / "b", {0: {"ids": torch.zeros(4, 6, dtype=torch.int64), "p": torch.ones(4, dtype=torch.float64)}})
    code, out, _ = run_diff([str(a), str(b)], capsys)
    assert code == 1
    assert "ids: shape [4, 5] vs [4, 6]" in out
    assert "p: dtype float32 vs float64" in out and "values equal" in out
    code, out, _ = run_diff([str(a), str(b), "--quick"], capsys)
    assert code == 1 and "checksums differ" in out and "ids: shape [4, 5] vs [4, 6] (from manifest.json)" in out


def test_missing_steps_streams_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_dump(tmp_path / "a", {0: {"x": torch.ones(2)}, 1: {"x": torch.ones(2)}, 2: {"x": torch.ones(2)}})
    write_dump(tmp_path / "a", {0: {"x": torch.ones(2)}}, split="val")
    b = write_dump(tmp_path / "b", {0: {"x": torch.ones(2), "extra": torch.zeros(2)}, 1: {"x": torch.ones(2)}, 5: {"x": torch.ones(2)}})
    code, out, _ = run_diff([str(a), str(b)], capsys)
    assert code == 1
    assert "extra: only in B (tensor float32 [2])" in out
    assert "steps only in A: 2" in out and "steps only in B: 5" in out
    assert "stream val: only in A (1 steps)" in out
    code, out, _ = run_diff([str(a), str(b), "--split", "val"], capsys)
    assert code == 1 and "stream train" not in out
    code, out, err = run_diff([str(a), str(b), "--split", "test"], capsys)
    assert code == 2 and "neither dump has a stream of that split" in err
    code, out, err = run_diff([str(a), str(b), "--steps", "0-x"], capsys)
    assert code == 2 and "--steps" in err
    code, out, err = run_diff([str(a), str(b), "--steps", "100-"], capsys)
    assert code == 2 and "no selected step" in err


def test_nan_aware_bitwise_equality() -> None:
    nan = torch.tensor([1.0, math.nan, 3.0])
    keys, compared = compare_batches({"x": nan}, {"x": nan.clone()})
    assert keys == [] and compared == 1  # identical NaN bit patterns are equal

    (key,) = compare_batches({"x": nan}, {"x": torch.tensor([1.0, 2.0, 3.0])})[0]
    assert key.status == "different" and math.isnan(key.max_abs_diff) and key.first_index == 1

    (key,) = compare_batches({"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])})[0]
    assert key.max_abs_diff == 0.0 and "signed zeros" in key.note

    arr = np.array([[np.nan, 1.0], [2.0, 3.0]])
    assert compare_batches({"y": arr}, {"y": arr.copy()})[0] == []
    assert compare_batches({"v": math.nan}, {"v": math.nan})[0] == []  # plain floats by bit pattern
    assert compare_batches({"v": 0.0}, {"v": -0.0})[0][0].status == "different"
    # tolerance: NaN faces NaN with another payload -> close; NaN vs number never close
    other_nan = torch.tensor([1.0, -math.nan, 3.0])
    assert compare_batches({"x": nan}, {"x": other_nan})[0][0].status == "different"
    assert compare_batches({"x": nan}, {"x": other_nan}, atol=1e-3)[0][0].status == "close"
    assert compare_batches({"x": nan}, {"x": torch.tensor([1.0, 2.0, 3.0])}, atol=1e9)[0][0].status == "different"


def test_object_arrays_nested_structures_and_meta_info() -> None:
    a = {
        "traj": [
            {"ids": torch.arange(3), "text": "a"},
            None,
            {"ids": torch.arange(4), "text": "b"},
        ],
        "meta": {"nested": {"lr": 0.1, "tags": ["x", "y", "z"]}},
        "td": TensorDict({"obs": torch.zeros(2, 3), "inner": TensorDict({"r": torch.ones(2)}, batch_size=[2])}, batch_size=[2]),
        "names": np.array(["u", "v", "w", "x"], dtype=object),
    }
    b = {
        "traj": [
            {"ids": torch.arange(3), "text": "a"},
            {"ids": torch.arange(2), "text": "c"},  # rejected in A, kept in B
            {"ids": torch.arange(4), "text": "B"},
        ],
        "meta": {"nested": {"lr": 0.1, "tags": ["x", "q", "z"]}},
        "td": TensorDict({"obs": torch.zeros(2, 3), "inner": TensorDict({"r": torch.tensor([1.0, 2.0])}, batch_size=[2])}, batch_size=[2]),
        "names": np.array(["u", "v", "W", "x"], dtype=object),
    }
    keys, compared = compare_batches(a, b)
    by_key = {k.key: k for k in keys}
    assert by_key["traj[1]"].kind == "type" and by_key["traj[1]"].a == "None"
    assert by_key["traj[2].text"].a == "'b'" and by_key["traj[2].text"].b == "'B'"
    assert by_key["meta.nested.tags"].first_index == 1
    assert by_key["td.inner.r"].first_index == 1 and by_key["td.inner.r"].max_abs_diff == 1.0
    names = by_key["names"]
    assert names.kind == "object_array" and names.first_index == 2
    assert (names.first_a, names.first_b) == ("'w'", "'W'")
    assert set(by_key) == {"traj[1]", "traj[2].text", "meta.nested.tags", "td.inner.r", "names"}
    assert compared >= 8


def test_dataproto_like_batches_with_meta_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = make_batch(0), make_batch(0)
    two.meta_info["temperature"] = 0.7
    two.non_tensor_batch["uid"][3] = "other"
    a = write_dump(tmp_path / "a", {0: one})
    b = write_dump(tmp_path / "b", {0: two})
    code, out, _ = run_diff([str(a), str(b)], capsys)
    assert code == 1
    assert "meta_info.temperature: 1.0 vs 0.7" in out
    assert "non_tensor_batch.uid: object [8], 1 of 8 samples differ, first at sample 3 ([3]: 'p1' vs 'other')" in out


def test_real_verl_dataproto(tmp_path: Path) -> None:
    protocol = pytest.importorskip("verl.protocol")
    x = torch.arange(12.0).view(4, 3)
    one = protocol.DataProto.from_dict(tensors={"x": x}, non_tensors={"t": np.array(list("abcd"), dtype=object)}, meta_info={"k": 1})
    y = x.clone()
    y[2, 1] = 100.0
    two = protocol.DataProto.from_dict(tensors={"x": y}, non_tensors={"t": np.array(list("abcd"), dtype=object)}, meta_info={"k": 1})
    report = diff_dumps(write_dump(tmp_path / "a", {0: one}), write_dump(tmp_path / "b", {0: two}))
    (key,) = report.streams[0].steps[0].keys
    assert key.key == "batch.x" and key.first_index == 2 and key.max_abs_diff == 93.0


# ------------------------------------------------------------------------------ bad input


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "manifest.json").write_text('{"format": "rollout_mock.dump", "streams": ')
    for other, message in [
        (tmp_path / "missing", "dump directory not found"),
        (tmp_path / "empty", "no manifest.json"),
        (tmp_path / "file.txt", "dump directory not found"),
        (corrupt, "unreadable manifest"),
    ]:
        code, out, err = run_diff([str(base), str(other)], capsys)
        assert code == 2, (other, out, err)
        assert out == "" and message in err and "Traceback" not in err
        assert err.count("\n") == 1, err


def test_corrupt_step_and_unsafe_pickle_exit_2(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = write_dump(tmp_path / "b", {s: make_batch(s + 10) for s in range(4)})
    step_file = b / "train" / "step_000001.pkl"
    data = bytearray(step_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    step_file.write_bytes(bytes(data))
    code, _, err = run_diff([str(base), str(b), "--steps", "1"], capsys)
    assert code == 2 and "corrupt" in err and "Traceback" not in err

    class Custom:  # not allowed by the safe loader
        def __init__(self) -> None:
            self.x = torch.ones(2)

    c = write_dump(tmp_path / "c", {0: Custom()})
    d = write_dump(tmp_path / "d", {0: {"x": torch.zeros(2)}})
    code, _, err = run_diff([str(c), str(d)], capsys)
    assert code == 2 and "--trust" in err


def test_cli_subprocess_no_traceback(tmp_path: Path, base: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_mock", "diff", str(base), str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=HANG_S,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.startswith("rollout-mock diff: error:")
    result = subprocess.run(
        [sys.executable, "-m", "rollout_mock", "diff", str(base), str(base)],
        capture_output=True, text=True, timeout=HANG_S,
    )
    assert result.returncode == 0 and "IDENTICAL" in result.stdout
    assert result.stderr == ""  # no progress bar when stderr is not a TTY


# ------------------------------------------------------------------------------ helpers


def test_parse_steps() -> None:
    assert parse_steps("0-9") == [(0, 9)]
    assert parse_steps("3, 5-6,10-") == [(3, 3), (5, 6), (10, None)]
    for bad in ("", "a", "5-3", "-1"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    with progress_bar(100, stream=buf, enabled=True, unit="B") as bar:
        bar.mininterval = 0
        bar.delay = 0
        bar.set_description("train step 3", refresh=False)
        bar.update(50)
        bar.refresh()
        bar.update(50)
    text = buf.getvalue()
    assert "train step 3" in text and "50" in text
    quiet = io.StringIO()  # not a TTY: disabled by default
    with progress_bar(100, stream=quiet) as bar:
        bar.update(100)
    assert quiet.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("CI", "true")  # a terminal under CI: still quiet
    tty = Tty()
    with progress_bar(100, stream=tty) as bar:
        bar.update(100)
    assert tty.getvalue() == ""


def test_mock_run_is_served_exactly_the_recorded_data(tmp_path: Path) -> None:
    """A dump-mode MockScheduler wrapped around a mock-mode one re-records what the mock served."""
    recorded = tmp_path / "recorded"
    run_pipeline("dump", recorded, tmp_path / "metrics.jsonl", steps=3, batch_size=16)
    served = tmp_path / "served"
    mock = MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(recorded)}, spec=ToyRolloutScheduler)
    tee = MockScheduler(mock, {"enable": True, "mode": "dump", "dump_dir": str(served)})
    with mock, tee:
        for step in range(3):
            tee.get_batch(StepRequest({"global_step": step}), 16)
    report = diff_dumps(recorded, served)
    assert report.identical, format_diff(report)


def test_loads_one_step_pair_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weakref

    from rollout_mock.storage.reader import Dump

    a = write_dump(tmp_path / "a", {s: {"x": torch.full((64,), float(s))} for s in range(6)})
    b = write_dump(tmp_path / "b", {s: {"x": torch.full((64,), float(s) + (s == 4)), "y": s} for s in range(6)})
    original = Dump.load
    alive: list[weakref.ref[torch.Tensor]] = []
    peak = [0]

    def tracking_load(self: Dump, step: int, stream: Any = "train", *, trusted: bool = False,
                      mapped: bool = False) -> Any:
        peak[0] = max(peak[0], sum(ref() is not None for ref in alive))
        batch = original(self, step, stream, trusted=trusted, mapped=mapped)
        alive.append(weakref.ref(batch["x"]))
        return batch

    monkeypatch.setattr(Dump, "load", tracking_load)
    report = diff_dumps(a, b)
    assert len(alive) == 12 and peak[0] <= 1  # at most A's batch is alive while B's step loads
    (stream,) = report.streams
    assert [s.step for s in stream.steps if any(k.key == "x" for k in s.keys)] == [4]
