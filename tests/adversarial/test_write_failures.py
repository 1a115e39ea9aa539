"""A step that is not written never vanishes (issue 28, "audit every except on the write path").

The audit of ``wrap/recording.py``, ``storage/writer.py`` and the store's save path found no
swallowed failure outside the codec: a failed write raises (synchronous writer: from the call;
background writer: ``WriterError`` from the next call, ``flush`` or ``close``), except under the
explicit ``on_disk_full: skip`` policy, which logs an error and stops recording. These tests keep
it so, for batches and for the random number states of ``replay_rng``, on both writers.
"""

from __future__ import annotations

import contextlib
import errno
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import MockScheduler, RolloutMockError, open_dump
from rollout_mock.storage.store import Store


class Sampling:
    def get_batch(self, global_step: int) -> dict[str, Any]:
        return {"x": torch.rand(3), "p": random.random()}


def _failing_write(monkeypatch: pytest.MonkeyPatch, *, step: int, stream: str) -> None:
    real = Store._write_step

    def write(self: Store, rel: str, stream_id: Any, at: int, produce: Any) -> Any:
        if at == step and stream_id.key == stream:
            raise OSError(errno.EIO, "input/output error (injected)")
        return real(self, rel, stream_id, at, produce)

    monkeypatch.setattr(Store, "_write_step", write)


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("stream", ["train", "train/rng"])
def test_a_failed_write_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool,
                                  stream: str) -> None:
    _failing_write(monkeypatch, step=1, stream=stream)
    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d"), "background": background,
              "replay_rng": True}
    mock = MockScheduler(Sampling(), config)
    with pytest.raises((RolloutMockError, OSError), match="input/output error"):
        for step in range(3):
            mock.get_batch(global_step=step)
        mock.close()
    with contextlib.suppress(RolloutMockError):  # the background writer's close says it once more
        mock.close()
    dump = open_dump(tmp_path / "d")
    written = {s.key: list(dump.steps(s)) for s in dump.streams()}
    assert 1 not in written.get(stream, [])  # not written, and the caller was told
