"""``ls`` of a stream whose steps interleave across index segments (issue 37, round 4's leftover 4).

Before: the manifest kept the last 8 segments read, first in first out; a stream whose runs
interleave across 9 segments (steps written out of order: segment k holds the steps equal to k
modulo 9) re-read and re-parsed a segment for every step, so ``ls`` of 18,000 steps ran past 20 s
against 4 s for the same steps in sequential segments. The cache is now least-recently-used and
bounded by the entries it holds, not by a count of segments: each segment is read once. The test
counts segment reads (no clock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_numbers import run

import rollout_mock.storage.index as index_module
from rollout_mock import MockScheduler, open_dump
from rollout_mock.storage.index import StreamIndex

SEGMENTS = 9
PER_SEGMENT = 20


class Source:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"input_ids": torch.full((1, 2), global_step)}


def interleaved_dump(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(StreamIndex, "segment_steps", PER_SEGMENT)
    monkeypatch.setattr(StreamIndex, "inline_steps", 4)
    with MockScheduler(Source(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as mock:
        for k in range(SEGMENTS):  # segment k: the steps equal to k modulo 9
            for j in range(PER_SEGMENT):
                mock.get_batch(None, global_step=j * SEGMENTS + k)
    return path


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real = index_module.read_segment

    def counted(backend: Any, stream: Any, seq: int) -> Any:
        reads.append(seq)
        return real(backend, stream, seq)

    monkeypatch.setattr(index_module, "read_segment", counted)
    return reads


def test_the_dump_interleaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = interleaved_dump(tmp_path / "d", monkeypatch)
    manifest = json.loads((dump / "manifest.json").read_text())
    refs = manifest["streams"]["train"]["segments"]
    assert len(refs) == SEGMENTS and refs[1]["steps"][:2] == [[1, 1], [10, 10]]


def test_ls_reads_each_segment_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    dump = interleaved_dump(tmp_path / "d", monkeypatch)
    reads = count_reads(monkeypatch)
    code, out, err = run("ls", dump, capsys=capsys)
    assert code == 0, err
    assert f"{SEGMENTS * PER_SEGMENT} steps" in out or str(SEGMENTS * PER_SEGMENT) in out
    assert len(reads) <= 2 * SEGMENTS, f"{len(reads)} segment reads for {SEGMENTS} segments"


def test_loading_every_step_reads_each_segment_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = open_dump(interleaved_dump(tmp_path / "d", monkeypatch))
    reads = count_reads(monkeypatch)
    for step in range(SEGMENTS * PER_SEGMENT):
        assert int(dump.load(step)["input_ids"][0, 0]) == step
    assert len(reads) == SEGMENTS


def test_the_cache_is_bounded_by_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded memory: past the entry budget the least recently used segment goes."""
    import rollout_mock.storage.manifest as manifest_module

    dump = open_dump(interleaved_dump(tmp_path / "d", monkeypatch))
    monkeypatch.setattr(manifest_module, "SEGMENT_CACHE_ENTRIES", 2 * PER_SEGMENT)
    reads = count_reads(monkeypatch)
    for step in range(SEGMENTS * PER_SEGMENT):
        dump.entry(dump.streams()[0], step)
        assert sum(map(len, dump.manifest._segments.values())) <= 2 * PER_SEGMENT
    assert len(reads) == SEGMENTS * PER_SEGMENT  # each step's segment was evicted before its next use
