"""``compression:`` end to end (issue 27): a config key, the dump's step files compressed, replay
bit-identical without a setting, ``ls`` showing it, the entry validated, a missing package said
when the dump starts."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import ConfigError, MockScheduler, load_config
from rollout_mock.cli import main as cli
from rollout_mock.errors import ManifestError
from rollout_mock.storage.manifest import StepEntry

pytest.importorskip("zstandard", reason="the compress extra (zstandard) is not installed")
pytest.importorskip("lz4", reason="the compress extra (lz4) is not installed")


class Scheduler:
    """Compressible batches (token ids, masks, repeated text) and one of random floats."""

    def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(global_step)
        return {
            "input_ids": torch.randint(0, 50, (64, 512), generator=generator),
            "attention_mask": torch.ones(64, 512, dtype=torch.int64),
            "logprobs": torch.randn(64, 512, generator=generator),
            "prompts": ["What is 2 + 2? Answer with one number."] * 64,
        }


def _record(path: Path, compression: str | None, steps: int = 3, **extra: Any) -> None:
    config = {"enable": True, "mode": "dump", "dump_dir": str(path), **extra}
    if compression is not None:
        config["compression"] = compression
    with MockScheduler(Scheduler(), config) as mock:
        for step in range(steps):
            mock.get_batch(None, step)


def _sizes(path: Path) -> list[int]:
    return [p.stat().st_size for p in sorted((path / "train").glob("step_*.pkl"))]


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
@pytest.mark.parametrize("background", [True, False])
def test_a_compressed_dump_is_smaller_and_replays_bit_for_bit(tmp_path: Path, compression: str,
                                                             background: bool) -> None:
    _record(tmp_path / "raw", None, background=background)
    _record(tmp_path / "packed", compression, background=background)
    raw, packed = _sizes(tmp_path / "raw"), _sizes(tmp_path / "packed")
    assert all(p < 0.8 * r for p, r in zip(packed, raw, strict=True)), (packed, raw)

    with MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "packed")}) as mock:
        for step in range(3):
            served, live = mock.get_batch(None, step), Scheduler().get_batch(None, step)
            for key in ("input_ids", "attention_mask", "logprobs"):
                assert served[key].dtype == live[key].dtype and torch.equal(served[key], live[key])
                assert served[key].view(torch.uint8).flatten().tolist() == live[key].view(torch.uint8).flatten().tolist()
            assert served["prompts"] == live["prompts"]


def test_ls_shows_the_compression_per_step_and_per_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _record(tmp_path / "d", None, steps=1)
    _record(tmp_path / "d", "zstd", steps=3, overwrite=True)  # steps 0-2 rewritten compressed
    _record(tmp_path / "d", None, steps=1, overwrite=True)    # step 0 raw again
    assert cli(["ls", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "compression: zstd (steps 1-2)" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip().startswith("step ")}
    assert lines["1"].endswith("zstd") and lines["2"].endswith("zstd") and "zstd" not in lines["0"]
    assert cli(["ls", str(tmp_path / "d"), "--json"]) == 0
    assert '"compression": "zstd"' in capsys.readouterr().out


def test_the_key_is_validated_and_listed_with_its_choices() -> None:
    assert load_config({"rollout_mock": {"compression": "zstd"}}).compression.value == "zstd"
    assert load_config({"rollout_mock": {}}).compression.value == "none"
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {"compression": "gzip"}})
    message = str(info.value)
    assert "compression" in message and "zstd" in message and "lz4" in message


def test_a_missing_package_is_a_config_error_when_the_dump_starts(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_zstandard(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "zstandard":
            raise ImportError("No module named 'zstandard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zstandard)
    with pytest.raises(ConfigError) as info:
        _record(tmp_path / "d", "zstd", steps=1)
    message = str(info.value)
    assert "compression: zstd" in message and "dump mode" in message and "rollout_mock[compress]" in message
    assert "compression: none" in message
    assert not list((tmp_path / "d").glob("train/step_*.pkl"))  # refused before anything was written


@pytest.mark.parametrize("bad", ["gzip", 3, ["zstd"], "none"])
def test_an_entry_with_a_forged_compression_is_refused(bad: Any) -> None:
    entry = {"file": "train/step_000000.pkl", "size": 1, "checksum": "crc32:00000000", "compression": bad}
    with pytest.raises(ManifestError, match="compression"):
        StepEntry.from_json(json.loads(json.dumps(entry)), where="index")
