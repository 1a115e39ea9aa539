"""MetricsWriter and the JSONL / CSV / TensorBoard readers."""

from __future__ import annotations

import json
import math
import struct
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_mock import (
    InvalidMetricError,
    MetricsFormatError,
    MetricsNotFoundError,
    MetricsWarning,
    MetricsWriter,
    MissingExtraError,
    RolloutMockError,
    read_metrics,
)
from rollout_mock.compare.metrics import MetricsTable, resolve_metrics_path


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def write_lines(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------
# Writer and encoding
# ------------------------------------------------------------------------------------------


def test_line_encoding_is_the_documented_one(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as w:
        w.log(3, {"pg_loss": -0.12, "grad_norm": 1.7, "n": 256})
        w.log(4, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": -0.0, "e": 0.1 + 0.2})
    assert path.read_text().splitlines() == [
        '{"step": 3, "pg_loss": -0.12, "grad_norm": 1.7, "n": 256}',
        '{"step": 4, "a": "NaN", "b": "Infinity", "c": "-Infinity", "d": -0.0, "e": 0.30000000000000004}',
    ]


def test_round_trip_special_values_bitwise(tmp_path: Path) -> None:
    values = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "nzero": -0.0, "zero": 0.0,
              "tiny": 5e-324, "big": 1.7976931348623157e308, "third": 1 / 3}
    with MetricsWriter(tmp_path / "m.jsonl") as w:
        w.log(0, values)
    table = read_metrics(tmp_path / "m.jsonl")
    assert table.format == "jsonl"
    assert math.isnan(table["nan"][0])
    for key, value in values.items():
        if key != "nan":
            assert bits(table[key][0]) == bits(value), key


def test_numpy_and_torch_scalars_are_accepted(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with MetricsWriter(tmp_path / "m.jsonl") as w:
        w.log(np.int64(7), {
            "np32": np.float32(0.1),
            "np64": np.float64(0.1),
            "np0d": np.array(2.5),
            "npint": np.int32(-4),
            "t0d": torch.tensor(1.25, dtype=torch.float64),
            "tbf16": torch.tensor(0.1, dtype=torch.bfloat16),
        })
    table = read_metrics(tmp_path / "m.jsonl")
    assert table["np32"][7] == float(np.float32(0.1)) != 0.1
    assert table["np64"][7] == 0.1
    assert table["np0d"][7] == 2.5
    assert table["npint"][7] == -4.0
    assert table["t0d"][7] == 1.25
    assert table["tbf16"][7] == torch.tensor(0.1, dtype=torch.bfloat16).item()


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("0.5", "metric 'loss': expected a float, int, numpy scalar or 0-d tensor, got str"),
        ([1.0], "metric 'loss': expected a float, int, numpy scalar or 0-d tensor, got list"),
        (None, "metric 'loss': expected a float, int, numpy scalar or 0-d tensor, got NoneType"),
        (True, "metric 'loss': bool True is not a metric value"),
        (2**53 + 1, "metric 'loss': integer 9007199254740993 is beyond 2**53"),
    ],
)
def test_invalid_values_are_rejected_naming_the_key(tmp_path: Path, value: object, fragment: str) -> None:
    path = tmp_path / "m.jsonl"
    with MetricsWriter(path) as w:
        w.log(0, {"ok": 1.0})
        with pytest.raises(InvalidMetricError) as info:
            w.log(1, {"fine": 2.0, "loss": value})
    assert fragment in str(info.value)
    assert isinstance(info.value, RolloutMockError)
    # Validation happens before writing: the rejected call wrote nothing, not even "fine".
    assert path.read_text() == '{"step": 0, "ok": 1.0}\n'


def test_non_scalar_tensor_is_rejected(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with MetricsWriter(tmp_path / "m.jsonl") as w, pytest.raises(InvalidMetricError) as info:
        w.log(0, {"loss": torch.tensor([1.0])})
    assert "metric 'loss': expected a scalar, got Tensor of shape (1,)" in str(info.value)


@pytest.mark.parametrize("step", [-1, 1.0, "3", True])
def test_bad_steps_are_rejected(tmp_path: Path, step: object) -> None:
    with MetricsWriter(tmp_path / "m.jsonl") as w, pytest.raises(InvalidMetricError, match="step must be"):
        w.log(step, {"a": 1.0})  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["step", ""])
def test_reserved_or_empty_names_are_rejected(tmp_path: Path, key: str) -> None:
    with MetricsWriter(tmp_path / "m.jsonl") as w, pytest.raises(InvalidMetricError, match="metric names"):
        w.log(0, {key: 1.0})


def test_writer_refuses_to_relog_a_step_metric(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path / "m.jsonl") as w:
        w.log(5, {"a": 1.0})
        w.log(5, {"b": 2.0})  # other metrics at the same step are fine
        with pytest.raises(InvalidMetricError, match="step 5 already logged metric\\(s\\) 'a'"):
            w.log(5, {"a": 1.0})
    assert read_metrics(tmp_path / "m.jsonl") == {"a": {5: 1.0}, "b": {5: 2.0}}


def test_close_is_idempotent_and_log_after_close_fails(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "sub" / "m.jsonl", fsync=True)
    w.log(0, {"a": 1.0})
    w.close()
    w.close()
    assert w.closed and "closed" in repr(w)
    with pytest.raises(RolloutMockError, match="MetricsWriter is closed"):
        w.log(1, {"a": 2.0})


def test_writer_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with MetricsWriter(path) as w:
        w.log(0, {"a": 1.0})
    with MetricsWriter(path) as w:
        w.log(1, {"a": 2.0})
    assert read_metrics(path)["a"] == {0: 1.0, 1: 2.0}


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    writers = [MetricsWriter(path) for _ in range(4)]

    def work(i: int) -> None:
        for step in range(200):
            writers[i].log(step, {f"w{i}": step + 0.5, f"id{i}": float(i)})

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    table = read_metrics(path)
    for i in range(4):
        assert table[f"w{i}"] == {s: s + 0.5 for s in range(200)}


def test_reopening_after_a_crash_drops_the_torn_tail(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 0, "a": 1.0}\n{"step": 1, "a": 2.')
    with pytest.warns(MetricsWarning, match="dropping an incomplete last line \\(19 bytes"):
        w = MetricsWriter(path)
    with w:
        w.log(1, {"a": 3.0})
    assert path.read_text() == '{"step": 0, "a": 1.0}\n{"step": 1, "a": 3.0}\n'


def test_the_dump_runs_metrics_are_appended_through_the_store(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The store hands out the dump's expected-metrics file as an append-only writer (no
    descriptor outside storage/): it drops a torn last line, writes the same bytes as the user's
    file, fsyncs each line when durable, and closes once."""
    import os

    from rollout_mock.storage.directory import AppendFile
    from rollout_mock.storage.store import DirectoryStore, expected_path

    dump = tmp_path / "dump"
    expected = expected_path(dump)
    expected.parent.mkdir(parents=True)
    expected.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a"')
    cfg = {"enable": True, "mode": "dump", "dump_dir": str(dump)}
    with pytest.warns(MetricsWarning, match="incomplete last line \\(15 bytes"), \
            MetricsWriter(tmp_path / "m.jsonl", expected=cfg) as writer:
        writer.log(1, {"a": 2.0, "b": 3})
    assert expected.read_bytes() == b'{"step": 0, "a": 1.0}\n' + (tmp_path / "m.jsonl").read_bytes()
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    appender = DirectoryStore(dump).open_expected(3, durable=True)
    assert isinstance(appender, AppendFile) and appender.drop_torn_tail() == 0
    appender.append(b'{"step": 2}\n')
    appender.close()
    appender.close()
    assert expected_path(dump, 3).read_bytes() == b'{"step": 2}\n' and len(synced) == 2
    with pytest.raises(ValueError, match="closed"):
        appender.append(b"x\n")


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k != "step"),
        st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
        min_size=1,
        max_size=6,
    ),
    st.integers(min_value=0, max_value=2**40),
)
def test_jsonl_round_trip_property(tmp_path_factory: pytest.TempPathFactory, values: dict[str, float], step: int) -> None:
    path = tmp_path_factory.mktemp("prop") / "m.jsonl"
    with MetricsWriter(path) as w:
        w.log(step, values)
    table = read_metrics(path)
    assert set(table) == set(values)
    for key, value in values.items():
        got = table[key][step]
        if math.isnan(value):
            assert math.isnan(got)  # the NaN payload/sign is not preserved (documented)
        else:
            assert bits(got) == bits(value)


# ------------------------------------------------------------------------------------------
# JSONL reader errors
# ------------------------------------------------------------------------------------------


def test_steps_spread_over_lines_are_merged(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 2, "a": 1}\n\n{"step": 1, "b": 2}\n{"step": 2, "b": 3}\n')
    table = read_metrics(path)
    assert table == {"a": {2: 1.0}, "b": {1: 2.0, 2: 3.0}}
    assert list(table["b"]) == [1, 2]
    assert table.steps == [1, 2]


def test_duplicate_step_in_file_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 1, "a": 2}\n')
    with pytest.raises(MetricsFormatError) as info:
        read_metrics(path)
    assert str(info.value).startswith(
        f"{path}: metric 'a' logged twice for step 1 (line 2 and line 3); a resumed run must not re-log"
    )
    assert info.value.step == 1 and info.value.path == str(path)


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 0, "a": 1.5}\n{"step": 1, "a": 2.2')
    with pytest.warns(MetricsWarning, match=f"{path}:2: skipping incomplete last line"):
        table = read_metrics(path)
    assert table == {"a": {0: 1.5}}


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 0, "a": 1.5}\n{"step": 1, "a": 2.5}')
    assert read_metrics(path) == {"a": {0: 1.5, 1: 2.5}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"step": 0, "a": 1}\n{"step": 1, "a": 2.\n{"step": 2, "a": 3}\n', ":2: malformed metrics line: "),
        ('{"step": 0, "a": 1}\ngarbage\n', ":2: malformed metrics line: Expecting value"),
        ('{"step": 0, "a": "fast"}\n', ':1: malformed metrics line: metric \'a\': expected a number or one of "NaN", "Infinity", "-Infinity", got "fast"'),
        ('{"step": 0, "a": null}\n', ":1: malformed metrics line: metric 'a': expected a number, got null"),
        ('{"a": 1}\n', ':1: malformed metrics line: missing "step"'),
        ('{"step": -1, "a": 1}\n', ':1: malformed metrics line: "step" must be a non-negative integer, got -1'),
        ('{"step": 1.0, "a": 1}\n', ':1: malformed metrics line: "step" must be a non-negative integer, got 1.0'),
        ('[1, 2]\n', ":1: malformed metrics line: expected a JSON object, got list"),
        ('{"step": 0, "a": 1, "a": 2}\n', ":1: malformed metrics line: key 'a' appears twice in one line"),
        ('{"step": 0}\n', ": contains no metrics"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write_lines(tmp_path / "m.jsonl", text)
    with pytest.raises(MetricsFormatError) as info:
        read_metrics(path)
    assert str(info.value).startswith(f"{path}{message}")


def test_bare_json_nonfinite_tokens_are_accepted(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", '{"step": 0, "a": NaN, "b": -Infinity}\n')
    table = read_metrics(path)
    assert math.isnan(table["a"][0]) and table["b"][0] == -math.inf


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(MetricsNotFoundError, match="no such metrics file or run directory") as info:
        read_metrics(tmp_path / "nope.jsonl")
    assert isinstance(info.value, FileNotFoundError)
    empty = write_lines(tmp_path / "empty.jsonl", "")
    with pytest.raises(MetricsFormatError, match=f"^{empty}: empty metrics file$"):
        read_metrics(empty)
    only_torn = write_lines(tmp_path / "torn.jsonl", '{"step": 0, "a')
    with pytest.warns(MetricsWarning), pytest.raises(MetricsFormatError, match="contains no metrics"):
        read_metrics(only_torn)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0, "a": 1}\n\xff\xfe\n')
    with pytest.raises(MetricsFormatError, match="not UTF-8"):
        read_metrics(path)


# ------------------------------------------------------------------------------------------
# CSV
# ------------------------------------------------------------------------------------------


def test_csv_reader(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "m.csv",
        "step,loss,kl\n0,0.5,NaN\n1,-0.0,\n2,Infinity,-inf\n3,0.30000000000000004,1e-300\n",
    )
    table = read_metrics(path)
    assert table.format == "csv"
    assert set(table) == {"loss", "kl"}
    assert bits(table["loss"][1]) == bits(-0.0)
    assert table["loss"][2] == math.inf and table["kl"][2] == -math.inf
    assert table["loss"][3] == 0.1 + 0.2
    assert 1 not in table["kl"]  # empty cell = not logged
    assert math.isnan(table["kl"][0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loss,kl\n1,2\n", ":1: CSV header has no 'step' column (columns: loss, kl)"),
        ("", ": empty metrics file"),
        ("step,loss\n0,abc\n1,2\n", ":2: malformed CSV row: column 'loss': not a number: 'abc'"),
        ("step,loss\nx,1\n", ":2: malformed CSV row: step must be a non-negative integer, got 'x'"),
        ("step,loss\n0,1,2\n", ":2: malformed CSV row: expected 2 cells, got 3"),
        ("step,loss,loss\n0,1,2\n", ":1: CSV header has empty or repeated column names"),
        ("step,loss\n0,1\n0,1\n", ": metric 'loss' logged twice for step 0 (line 2 and line 3)"),
    ],
)
def test_malformed_csv(tmp_path: Path, text: str, message: str) -> None:
    path = write_lines(tmp_path / "m.csv", text)
    with pytest.raises(MetricsFormatError) as info:
        read_metrics(path)
    assert str(info.value).startswith(f"{path}{message}")


def test_csv_torn_last_row_is_skipped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.csv", "step,a,b\n0,1,2\n1,3")
    with pytest.warns(MetricsWarning, match=":3: skipping incomplete last line"):
        assert read_metrics(path) == {"a": {0: 1.0}, "b": {0: 2.0}}


# ------------------------------------------------------------------------------------------
# Run directories and dispatch
# ------------------------------------------------------------------------------------------


def test_run_directory_prefers_metrics_jsonl(tmp_path: Path) -> None:
    write_lines(tmp_path / "metrics.jsonl", '{"step": 0, "a": 1}\n')
    write_lines(tmp_path / "other.csv", "step,b\n0,1\n")
    assert resolve_metrics_path(tmp_path) == (tmp_path / "metrics.jsonl", "jsonl")
    assert set(read_metrics(tmp_path)) == {"a"}


def test_run_directory_with_one_candidate(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.csv", "step,b\n0,1\n")
    (tmp_path / "notes.txt").write_text("hi")
    assert read_metrics(tmp_path) == {"b": {0: 1.0}}


def test_ambiguous_run_directory_lists_candidates(tmp_path: Path) -> None:
    write_lines(tmp_path / "a.jsonl", '{"step": 0, "a": 1}\n')
    write_lines(tmp_path / "b.csv", "step,b\n0,1\n")
    (tmp_path / "events.out.tfevents.123.host").write_bytes(b"")
    with pytest.raises(MetricsFormatError) as info:
        read_metrics(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: several metrics files, pass one explicitly: a.jsonl (jsonl), b.csv (csv), "
        "events.out.tfevents.* (tensorboard)"
    )


def test_empty_run_directory_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(MetricsNotFoundError, match="no metrics file in this directory"):
        read_metrics(tmp_path)
    odd = write_lines(tmp_path / "metrics.txt", "{}")
    with pytest.raises(MetricsFormatError, match="unknown metrics file type"):
        read_metrics(odd)


def test_table_is_a_read_only_mapping() -> None:
    table = MetricsTable({"b": {2: 1.0, 1: 0.0}, "a": {0: 3}}, source="x.jsonl", format="jsonl")
    assert list(table["b"]) == [1, 2]
    assert table["a"][0] == 3.0 and isinstance(table["a"][0], float)
    assert repr(table) == "MetricsTable(x.jsonl (jsonl, 2 metrics, steps 0..2))"


# ------------------------------------------------------------------------------------------
# TensorBoard
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("new_style", [False, True])
def test_tensorboard_reader(tmp_path: Path, new_style: bool) -> None:
    pytest.importorskip("tensorboard")
    tb = pytest.importorskip("torch.utils.tensorboard")
    writer = tb.SummaryWriter(log_dir=str(tmp_path))
    for step in range(5):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step, new_style=new_style)
        writer.add_scalar("grad_norm", float("nan") if step == 3 else step * 0.1, step, new_style=new_style)
    writer.close()
    table = read_metrics(tmp_path)  # the run directory resolves to the event files
    assert table.format == "tensorboard"
    assert set(table) == {"train/loss", "grad_norm"}
    assert sorted(table["train/loss"]) == [0, 1, 2, 3, 4]
    # Values are stored as float32.
    assert table["train/loss"][2] == struct.unpack("<f", struct.pack("<f", 1 / 3))[0]
    assert math.isnan(table["grad_norm"][3])
    event_file = next(tmp_path.glob("events.out.tfevents.*"))
    from_file = read_metrics(event_file)
    assert {k: {s: bits(v) for s, v in from_file[k].items()} for k in from_file} == {
        k: {s: bits(v) for s, v in table[k].items()} for k in table
    }


def test_tensorboard_missing_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing", None)
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    with pytest.raises(MissingExtraError, match=r"pip install rollout_mock\[tensorboard\]") as info:
        read_metrics(tmp_path)
    assert isinstance(info.value, ImportError)


def test_written_lines_are_strict_json(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path / "m.jsonl") as w:
        w.log(0, {"a": math.nan, "b": -math.inf})
    for line in (tmp_path / "m.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
