"""A health summary of every step: computed on the writer thread, kept when the batch is dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import MockScheduler, cli, open_dump
from rollout_mock.codec.scan import health_summary
from rollout_mock.storage.index import health_relpath
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.reader import flag_health
from rollout_mock.storage.store import MemoryStore


class Rollouts:
    """Clean steps, with a zero in the mask at 2, a huge scale at 4 and equal rewards at 6."""

    def get_batch(self, step: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(step)
        batch = {"rewards": torch.rand(8, generator=g), "mask": torch.ones(8), "scale": torch.ones(8),
                 "attention_mask": torch.tensor([[1] * (4 + i % 3) + [0] * (3 - i % 3) for i in range(8)]),
                 "responses": [[1, 2, 3][: 1 + i % 3] for i in range(8)]}
        if step == 2:
            batch["mask"][3] = 0.0
        if step == 4:
            batch["scale"][:] = 1e5
        if step == 6:
            batch["rewards"][:] = 0.25
        if step == 8:
            batch["rewards"][0] = math.nan
        return batch


def test_health_summary_of_one_batch() -> None:
    batch = {"a": torch.tensor([1.0, math.nan, 3.0, math.inf]), "ids": torch.tensor([[5, 7], [9, 1]]),
             "loss_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]), "tokens": [[1, 2], [3]],
             "np": np.array([0.5, 0.5], dtype=np.float32), "meta": {"lr": 0.1, "n": 3}}
    health = health_summary(batch)
    keys = health["keys"]
    assert keys["a"] == {"n": 4, "nf": 2, "lo": 1.0, "hi": 3.0, "mean": 2.0}
    assert keys["ids"] == {"n": 4, "lo": 1.0, "hi": 9.0}
    assert keys["loss_mask"]["len"] == [1, 2, 2, 1.5] and keys["tokens"]["len"] == [1, 2, 2, 1.5]
    assert keys["meta.lr"] == {"n": 1, "lo": 0.1, "hi": 0.1, "mean": 0.1}
    assert health["flags"] == ["nonfinite:a", "constant:np"]
    assert len(json.dumps(health, separators=(",", ":"))) < 400


def test_every_step_has_a_health_line_even_when_the_ring_drops_its_batch(tmp_path: Path) -> None:
    dump = tmp_path / "d"
    with MockScheduler(Rollouts(), cfg(dump, keep={"last": 2}), methods=["get_batch"]) as sched:
        for step in range(10):
            sched.get_batch(step)
    opened = open_dump(dump)
    assert list(opened.steps(opened.stream("train"))) == [8, 9]  # the ring kept the last two (and the NaN pin)
    lines = opened.health()
    assert [line["step"] for line in lines] == list(range(10))
    flagged = {line["step"]: line["anomalies"] for line in lines if line["anomalies"]}
    assert flagged == {2: ["zero:mask"], 4: ["beyond_fp16:scale", "outlier:scale"], 6: ["constant:rewards"],
                       8: ["nonfinite:rewards"]}
    assert max(len(line) for line in (dump / "train" / ".health" / "segment_000000.jsonl").read_bytes().splitlines()) < 700


def test_store_side_files_replace_a_rewritten_step_and_segment() -> None:
    store = MemoryStore()
    stream = StreamId("train", rank=1)
    for step in (5, 99, 100, 5):
        store.append_health(stream, step, {"keys": {}, "flags": [f"v{step}"]})
    assert [(line["step"], line["flags"]) for line in store.health(stream)] == [(5, ["v5"]), (99, ["v99"]),
                                                                                (100, ["v100"])]
    assert health_relpath(stream, 1) == "train/.health/segment_000001_rank1.jsonl"
    assert store.health(StreamId("train")) == [] and store.another().health(stream)[0]["step"] == 5


def test_flag_health_needs_the_run_to_set_a_norm() -> None:
    lines = [{"step": s, "keys": {"m": {"lo": 1.0, "hi": 1.0}}, "flags": ["constant:m"]} for s in range(5)]
    assert all(line["anomalies"] == [] for line in flag_health(lines))  # constant in every step: the norm


def test_ls_health(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "d"
    with MockScheduler(Rollouts(), cfg(dump), methods=["get_batch"]) as sched:
        for step in range(8):
            sched.get_batch(step)
    assert cli.main(["ls", str(dump), "--health"]) == 0
    out = capsys.readouterr().out
    assert "health: 8 step(s) summarised, 3 stand out: 2, 4, 6" in out
    assert "HEALTH: zero:mask" in out and "[constant:rewards]" in out and "attention_mask n=56 lo=0.0 hi=1.0" in out


def test_a_large_tensor_is_summarised_over_evenly_spaced_rows() -> None:
    from rollout_mock.codec.scan import HEALTH_SAMPLE

    big = torch.zeros(4096, 256)
    big[::2] = 1.0
    mask = torch.ones(4096, 256, dtype=torch.long)
    health = health_summary({"big": big, "attention_mask": mask})["keys"]
    assert health["big"]["n"] == 4096 * 256 and health["big"]["s"] == 0.0625  # every 16th row read
    assert 0 < HEALTH_SAMPLE < 4096 * 256 and health["attention_mask"]["len"] == [256, 256, 256, 256.0]


def test_python_samples_are_read_at_evenly_spaced_items_and_values() -> None:
    """A list of sample dicts (slime) and the float lists inside them are read as tensors are:
    evenly spaced, the counts scaled to the whole list, ``s`` saying what was read; the walk
    runs in the dump-mode call, so it must not visit every value."""
    from rollout_mock.codec.scan import HEALTH_ITEMS, HEALTH_LIST

    samples = [{"reward": float(i), "log_probs": [-0.5] * 1000 + [math.nan], "tokens": list(range(10)),
                "meta": {"tag": "x", "n": i}} for i in range(8 * HEALTH_ITEMS)]
    samples[0]["log_probs"][0] = math.inf  # read: the first value of a list is in its sample
    keys = health_summary(samples)["keys"]
    assert keys["[].reward"]["n"] == 8 * HEALTH_ITEMS and keys["[].reward"]["s"] == 0.125
    assert keys["[].reward"]["lo"] == 0.0 and keys["[].meta.n"]["n"] == 8 * HEALTH_ITEMS
    probs = keys["[].log_probs[]"]
    assert probs["n"] == 8 * HEALTH_ITEMS * 1001 and probs["nf"] == 1 and probs["hi"] == -0.5
    assert probs["s"] < 1 / 8 * (HEALTH_LIST + 1) / 1001 * 1.01
    assert keys["[].tokens"]["n"] == 8 * HEALTH_ITEMS * 10 and keys["[].tokens"]["len"] == [10, 10, 10, 10.0]


def test_an_object_column_is_read_as_a_list_is() -> None:
    """verl's column of per-row dicts (a numpy object array) is read at evenly spaced rows, its
    counts scaled to the column, as a list of samples is: not row by row in the dump-mode call."""
    import numpy as np

    from rollout_mock.codec.scan import HEALTH_ITEMS

    rows = 8 * HEALTH_ITEMS
    extra = np.array([{"index": i, "score": i / 2} for i in range(rows)], dtype=object)
    keys = health_summary({"extra_info": extra})["keys"]
    assert keys["extra_info[].index"]["n"] == rows and keys["extra_info[].score"]["s"] == 0.125
    assert keys["extra_info[].score"]["lo"] == 0.0


def test_a_list_of_floats_with_other_values_is_walked_item_by_item() -> None:
    keys = health_summary({"x": [1.0, "a", 3.0, None, math.nan]})["keys"]
    assert keys["x[]"] == {"n": 3, "nf": 1, "lo": 1.0, "hi": 3.0, "mean": 2.0}


def test_an_empty_list_has_a_health_line() -> None:
    """An empty batch, or a sample with an empty list in it, is summarised (no division by the
    zero items read: the whole line used to be lost, with a warning)."""
    assert health_summary([]) == {"keys": {}, "flags": []}
    keys = health_summary([{"tags": [], "reward": 1.0}, {"tags": [], "reward": 2.0}])["keys"]
    assert keys == {"[].reward": {"n": 2, "lo": 1.0, "hi": 2.0, "mean": 1.5}}
