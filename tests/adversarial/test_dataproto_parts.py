"""A DataProto whose parts are not mappings (issue 28, round 3 still failing): a hostile step whose
DataProto ``batch`` or ``non_tensor_batch`` is a string, a list or a number made ``show``,
``report`` and ``cut`` fail with ``'str' object has no attribute 'items'`` (or ``.values``).

The batch model decides what is DataProto-like (:func:`rollout_mock.batch.dataproto_fields`): a
part that is not ``None`` or mapping-like makes the object an opaque value, so every command ends
with a clean error (exit 2, one line) or shows what it can.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_numbers import bounded, run

import rollout_mock.codec.classes as codec_batches
from rollout_mock import MockScheduler
from rollout_mock.batch import count_samples, dataproto_fields


class Forged:
    """Written as a DataProto node with whatever parts it holds (see ``_forge``)."""

    def __init__(self, batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


#: name -> (batch, non_tensor_batch, meta_info) of the forged DataProto
PARTS: dict[str, tuple[Any, Any, Any]] = {
    "batch_str": ("x" * 10, {"a": np.array([1, 2])}, {"k": 1}),
    "batch_list": ([1, 2], {}, {}),
    "batch_int": (5, {}, {}),
    "non_tensor_str": (None, "SECRET", {"k": 1}),
    "non_tensor_list": (None, [1, 2, 3], {"k": 1}),
    "every_part_str": ("a", "b", "c"),
    "meta_str": ({"input_ids": torch.ones(2, 3)}, {"a": np.array([1, 2])}, "meta"),
}


def _forge(path: Path, parts: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dump whose steps hold DataProto nodes with these parts (what a hostile writer can put
    in a file: the encoder is told the object is DataProto-like), read back where the writer's
    class does not exist (the codec's stand-in ``Batch``)."""
    real_fields, real_items = codec_batches.dataproto_fields, codec_batches._plain_items
    with monkeypatch.context() as patch:
        patch.setattr(codec_batches, "dataproto_fields",
                      lambda obj: ("public", vars(obj)) if isinstance(obj, Forged) else real_fields(obj))
        patch.setattr(codec_batches, "_plain_items", lambda m: real_items(m) if hasattr(m, "keys") else m)

        class Source:
            def get_batch(self, data: Any, global_step: int) -> Any:
                return Forged(*parts)

        config = {"enable": True, "mode": "dump", "dump_dir": str(path), "background": False}
        with MockScheduler(Source(), config) as mock:
            for step in range(2):
                mock.get_batch(None, step)
    # the class is gone when the dump is read, as in another process
    monkeypatch.setattr(sys.modules[__name__], "Forged", None)
    return path


@pytest.mark.parametrize("case", sorted(PARTS))
def test_every_command_on_a_dataproto_with_non_mapping_parts(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    dump = _forge(tmp_path / "d", PARTS[case], monkeypatch)
    other = tmp_path / "other"
    with MockScheduler(type("S", (), {"get_batch": lambda self, d, global_step: {"input_ids": torch.ones(2, 3)}})(),
                       {"enable": True, "mode": "dump", "dump_dir": str(other)}) as mock:
        for step in range(2):
            mock.get_batch(None, step)
    for argv in (["ls", dump, "--keys"], ["show", dump], ["report", dump, "-o", tmp_path / "r.html"],
                 ["cut", dump, tmp_path / "c1", "--steps", "0"],
                 ["cut", dump, tmp_path / "c2", "--steps", "0", "--redact"],
                 ["cut", dump, tmp_path / "c3", "--steps", "0", "--samples", "0"],
                 ["cut", dump, tmp_path / "c4", "--steps", "0", "--keys", "a"],
                 ["diff", dump, other, "--no-progress"],
                 ["report", dump, "--against", other, "-o", tmp_path / "a.html"]):
        bounded(*run(*argv, capsys=capsys))


def test_the_batch_model_refuses_non_mapping_parts() -> None:
    assert dataproto_fields(Forged("x", {}, {})) is None
    assert dataproto_fields(Forged(None, [1, 2], {})) is None
    assert dataproto_fields(Forged(None, "abc", {})) is None
    assert dataproto_fields(Forged({"a": torch.ones(2)}, {}, [])) is None
    good = Forged({"a": torch.ones(2)}, {"b": np.array([1, 2])}, {})
    assert dataproto_fields(good) is not None and count_samples(good) == 2
