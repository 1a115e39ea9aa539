"""Row and key selection, redaction, and cut_dump over every batch shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cfg
from debug_helpers import object_column

from rollout_mock import MockScheduler, open_dump
from rollout_mock.debug import cut_dump, select_rows
from rollout_mock.debug import redact_batch as redact
from rollout_mock.debug.cut import select_keys
from rollout_mock.debug.redact import PLACEHOLDER
from rollout_mock.errors import DebugInputError


def _columns(n: int = 6) -> dict[str, object]:
    return {"input_ids": torch.arange(n * 3).view(n, 3), "rewards": torch.arange(n, dtype=torch.float32),
            "raw_prompt": object_column([f"secret prompt {i}" for i in range(n)]),
            "uid": object_column([f"g{i // 2}" for i in range(n)]), "note": "whole-batch value"}


def test_dict_rows_keys_and_redaction() -> None:
    batch = _columns()
    cut = select_rows(batch, [4, 1])
    assert cut["input_ids"].tolist() == [[12, 13, 14], [3, 4, 5]]
    assert list(cut["raw_prompt"]) == ["secret prompt 4", "secret prompt 1"]
    assert cut["note"] == "whole-batch value"
    assert batch["input_ids"].shape[0] == 6  # input untouched
    red, hit = redact(cut)
    assert hit == ["raw_prompt"] and list(red["raw_prompt"]) == [PLACEHOLDER] * 2
    assert red["raw_prompt"].dtype == object and list(red["uid"]) == ["g2", "g0"]  # ids kept
    assert sorted(select_keys(cut, ["input_ids", "uid"])) == ["input_ids", "uid"]
    with pytest.raises(DebugInputError, match="out of range"):
        select_rows(batch, [6])
    with pytest.raises(DebugInputError, match="nope not in the batch"):
        select_keys(batch, ["nope"])


def test_tensordict_rows() -> None:
    from tensordict import TensorDict

    td = TensorDict({"input_ids": torch.arange(8).view(4, 2)}, batch_size=[4])
    assert select_rows(td, [3, 0])["input_ids"].tolist() == [[6, 7], [0, 1]]


def test_real_verl_dataproto() -> None:
    protocol = pytest.importorskip("verl.protocol")
    batch = _columns()
    data = protocol.DataProto.from_dict(
        tensors={k: v for k, v in batch.items() if isinstance(v, torch.Tensor)},
        non_tensors={"raw_prompt": batch["raw_prompt"], "uid": batch["uid"]},
        meta_info={"global_steps": 3},
    )
    cut = select_rows(data, [5, 0])
    assert type(cut) is protocol.DataProto and len(cut) == 2
    assert cut.batch["input_ids"][0].tolist() == [15, 16, 17]
    assert list(cut.non_tensor_batch["uid"]) == ["g2", "g0"] and cut.meta_info == {"global_steps": 3}
    red, hit = redact(cut)
    assert hit == ["raw_prompt"] and list(red.non_tensor_batch["raw_prompt"]) == [PLACEHOLDER] * 2
    assert list(cut.non_tensor_batch["raw_prompt"]) == ["secret prompt 5", "secret prompt 0"]
    kept = select_keys(cut, ["input_ids", "uid"])
    assert list(kept.batch.keys()) == ["input_ids"] and list(kept.non_tensor_batch) == ["uid"]


def test_areal_list_and_slime_samples() -> None:
    trajectories = [{"input_ids": torch.ones(2, 3), "messages": [{"role": "user", "content": "hi there"}]},
                    None, {"input_ids": torch.zeros(1, 4)}]
    cut = select_rows(trajectories, [1, 2])
    assert cut[0] is None and cut[1]["input_ids"].shape == (1, 4)
    red, hit = redact(trajectories)
    assert hit == ["messages"] and red[0]["messages"] == [{"role": "user", "content": PLACEHOLDER}]
    slime = {"rollout_id": 3, "samples": [{"prompt": f"p{i}", "response": f"r{i}", "tokens": [1, 2], "index": i}
                                           for i in range(4)]}
    cut = select_rows(slime, [2])
    assert cut["rollout_id"] == 3 and [s["index"] for s in cut["samples"]] == [2]
    red, hit = redact(cut)
    assert hit == ["prompt", "response"] and red["samples"][0]["prompt"] == PLACEHOLDER
    assert red["samples"][0]["tokens"] == [1, 2]


def test_demo_batch_dataclass(tmp_path: Path) -> None:
    from rollout_mock.demo import RolloutBatch

    batch = RolloutBatch({"x": torch.arange(4)}, {"response_text": object_column(list("abcd"))}, {"group": 2})
    cut = select_rows(batch, [1, 3])
    assert isinstance(cut, RolloutBatch) and cut.batch["x"].tolist() == [1, 3]
    assert list(cut.non_tensor_batch["response_text"]) == ["b", "d"] and cut.meta_info == {"group": 2}


class Steps:
    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        return {**_columns(), "step": np.full(6, global_step)}


def test_cut_dump_writes_a_valid_dump(dump_dir: Path, tmp_path: Path) -> None:
    with MockScheduler(Steps(), cfg(dump_dir)) as mock:
        for step in range(4):
            mock.get_batch(None, step)
    with MockScheduler(Steps(), cfg(dump_dir), split="val") as mock:
        mock.get_batch(None, 3)
    dst = tmp_path / "cut"
    result = cut_dump(dump_dir, dst, steps="1,3", groups=[2], group_size=2, keys="input_ids,raw_prompt,uid",
                      redact=True)
    assert result.steps == {"train": [1, 3], "val": [3]}
    assert result.redacted == ["raw_prompt"]
    dump = open_dump(dst)
    assert [s.key for s in dump.streams()] == ["train", "val"]
    batch = dump.load(3, "train")  # checksums verified
    assert sorted(batch) == ["input_ids", "raw_prompt", "uid"]
    assert batch["input_ids"].tolist() == [[12, 13, 14], [15, 16, 17]]
    assert list(batch["raw_prompt"]) == [PLACEHOLDER] * 2
    assert dump.manifest.fingerprint == open_dump(dump_dir).manifest.fingerprint
    assert dump.manifest.methods(dump.stream("train")) == open_dump(dump_dir).manifest.methods(dump.stream("train"))
    provenance = json.loads((dst / "provenance.json").read_text())
    assert provenance["source"] == str(dump_dir.resolve()) and provenance["keys"] == ["input_ids", "raw_prompt", "uid"]
    with pytest.raises(DebugInputError, match="not a multiple"):
        cut_dump(dump_dir, tmp_path / "c2", steps=[1], groups=[0], group_size=4)
    assert not (tmp_path / "c2").exists()  # nothing half-written left behind
