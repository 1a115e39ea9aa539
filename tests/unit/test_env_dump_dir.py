"""``rollout-mock env --dump-dir`` reads the dump through its store (issue 27): a dump whose writer
died (no manifest.json yet, only its index files) and an fsspec URL are read like any other dump."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from rollout_mock import cli
from rollout_mock.determinism import fingerprint
from rollout_mock.storage import BatchInfo, DirectoryStore, FsspecStore, StreamId

BATCH = {"x": torch.arange(4)}


def test_a_dump_whose_writer_died(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = DirectoryStore(tmp_path / "d")
    store.set_fingerprint({**fingerprint(), "platform": "the recording host"})
    store.save(StreamId("train"), 0, BATCH, BatchInfo.of(BATCH))  # never closed: nothing compacted
    assert not (tmp_path / "d" / "manifest.json").exists()
    assert cli.main(["env", "--dump-dir", str(tmp_path / "d"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"field": "platform", "recorded": "the recording host", "current": fingerprint()["platform"],
            "numerics_relevant": False} in out["differences"]


def test_an_fsspec_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"memory://env-dump-dir/{uuid.uuid4().hex}"
    store = FsspecStore(url)
    recorded = fingerprint()
    recorded["env"]["NCCL_ALGO"] = "Tree"
    store.set_fingerprint(recorded)
    store.save(StreamId("train"), 0, BATCH, BatchInfo.of(BATCH))
    store.close()
    assert cli.main(["env", "--dump-dir", url]) == 1  # a numerics-relevant difference
    out = capsys.readouterr().out
    assert "env.NCCL_ALGO" in out and url in out


def test_a_hostile_fingerprint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = DirectoryStore(tmp_path / "d")
    store.set_fingerprint(fingerprint())
    store.save(StreamId("train"), 0, BATCH, BatchInfo.of(BATCH))
    store.close()
    manifest = tmp_path / "d" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"fingerprint":{', '"fingerprint":{"deep":' + "[" * 5000
                                                     + "]" * 5000 + ","))
    assert cli.main(["env", "--dump-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "unreadable manifest (nested more than" in err and len(err.splitlines()) == 1
