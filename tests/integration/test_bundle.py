"""One-file bundles end to end (issue 31, part 3): pack -> send -> unpack -> replay is
bit-identical, from the unpacked directory and from the ``.rmb`` read in place; signed steps keep
their HMAC; whatever the manifest and the entries record travels; the redacted bundle holds no
prompt/response text; ``pull`` reads only the chosen steps of an S3 dump (moto on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from debug_helpers import object_column
from storage_conformance import s3_server  # noqa: F401

from rollout_mock import CorruptStepError, DumpNotWritableError, MockScheduler, StepNotFoundError, open_dump
from rollout_mock.cli import build_parser
from rollout_mock.cli import main as cli_main
from rollout_mock.compare.expected import MetricsWriter
from rollout_mock.storage import FsspecBackend
from rollout_mock.storage.bundle import Bundle

SECRET = "SECRET-PROMPT-31c"


class Rollouts:
    """Batches drawn from an unseeded generator: a replay matches only by reading the dump."""

    def get_batch(self, data: Any, global_step: int, prompt: str | None = None) -> dict[str, Any]:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        return {"input_ids": torch.randint(0, 50_000, (4, 7), generator=g),
                "old_log_probs": torch.randn(4, 7, generator=g, dtype=torch.float64),
                "rewards": torch.randn(4, generator=g).to(torch.bfloat16),
                "raw_prompt": object_column([f"{SECRET} prompt {global_step}.{i}" for i in range(4)]),
                "responses_text": object_column([f"{SECRET} answer {global_step}.{i}" for i in range(4)]),
                "uid": object_column([f"g{i // 2}" for i in range(4)])}


def cfg(dump: Path | str, mode: str = "dump", **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(dump), **extra}


def metrics_of(batch: dict[str, Any]) -> dict[str, float]:
    return {"loss": float(batch["old_log_probs"].sum()), "reward": float(batch["rewards"][0])}


def record(dump: Path | str, steps: range, metrics: Path | None, **config: Any) -> dict[int, Any]:
    """Record ``steps``; with ``metrics``, their metrics go to the dump's expected values too."""
    out = {}
    with MockScheduler(Rollouts(), cfg(dump, **config)) as scheduler:
        log = None if metrics is None else MetricsWriter(metrics, expected=scheduler)
        for step in steps:
            out[step] = scheduler.get_batch(None, step, prompt=f"{SECRET} kwarg")
            if log is not None:
                log.log(step, metrics_of(out[step]))
        if log is not None:
            log.close()
    return out


def replay(dump: Path | str, steps: list[int], **config: Any) -> dict[int, Any]:
    with MockScheduler(None, cfg(dump, "mock", **config)) as scheduler:
        return {step: scheduler.get_batch(None, step, prompt=f"{SECRET} kwarg") for step in steps}


def assert_identical(got: dict[int, Any], want: dict[int, Any]) -> None:
    assert sorted(got) == sorted(want)
    for step, batch in want.items():
        assert sorted(got[step]) == sorted(batch)
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                assert got[step][key].dtype == value.dtype and torch.equal(got[step][key], value), (step, key)
                assert got[step][key].view(torch.uint8).numpy().tobytes() == value.view(torch.uint8).numpy().tobytes()
            else:
                assert isinstance(got[step][key], np.ndarray) and list(got[step][key]) == list(value), (step, key)


def test_pack_send_unpack_replay_is_bit_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "run" / "dump"
    original = record(dump, range(6), tmp_path / "run" / "metrics.jsonl")
    bundle = tmp_path / "outbox" / "bad-step.rmb"
    assert cli_main(["pack", str(dump), "--steps", "2,4", "-o", str(bundle), "--rtol", "1e-6",
                     "--atol", "loss=1e-9"]) == 0
    digest = capsys.readouterr().out.split("digest: ")[1].split()[0]
    # send: the file travels alone, the run and its dump are gone
    inbox = tmp_path / "inbox" / "bad-step.rmb"
    inbox.parent.mkdir()
    shutil.copyfile(bundle, inbox)
    shutil.rmtree(tmp_path / "run")
    shutil.rmtree(tmp_path / "outbox")
    unpacked = tmp_path / "unpacked"
    assert cli_main(["unpack", str(inbox), "-o", str(unpacked)]) == 0
    out = capsys.readouterr().out
    assert "--rtol 1e-06 --atol loss=1e-09" in out and f"digest {digest}" in out
    wanted = {step: original[step] for step in (2, 4)}
    assert_identical(replay(unpacked, [2, 4]), wanted)
    assert_identical(replay(inbox, [2, 4]), wanted)  # in place, nothing extracted
    assert sorted(p.name for p in inbox.parent.iterdir()) == ["bad-step.rmb"]
    with pytest.raises(StepNotFoundError, match=r"Recorded steps for train: 2, 4"):
        replay(inbox, [3])
    # the expected metrics of those steps, with the tolerances, and a verdict over them
    rows = [json.loads(line) for line in (unpacked / "expected" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [2, 4]
    assert rows[0]["loss"] == float(original[2]["old_log_probs"].sum())
    info = json.loads((unpacked / "bundle.json").read_text())
    assert info["digest"] == digest == Bundle.open(inbox).digest
    assert info["meta"]["tolerances"] == {"rtol": {"default": 1e-6}, "atol": {"default": 0.0, "loss": 1e-9}}
    assert info["meta"]["streams"] == {"train": [2, 4]} and info["meta"]["expected_rows"] == 2
    config = cfg(unpacked, "mock", verdict={"action": "fail"})
    with MockScheduler(None, config) as scheduler, MetricsWriter(tmp_path / "m.jsonl", expected=scheduler) as log:
        for step in (2, 4):
            log.log(step, metrics_of(scheduler.get_batch(None, step, prompt=f"{SECRET} kwarg")))
        assert log._expected is not None and log._expected.compared == 4 and log._expected.diverged == 0


def test_signed_steps_keep_their_mac_and_replay_from_the_bundle_checks_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_BUNDLE_KEY", "k" * 32)
    dump = tmp_path / "dump"
    original = record(dump, range(3), tmp_path / "metrics.jsonl", hmac_key_env="RM_BUNDLE_KEY")
    bundle = tmp_path / "signed.rmb"
    assert cli_main(["pack", str(dump), "--steps", "1", "-o", str(bundle)]) == 0
    entry = json.loads(Bundle.open(bundle).read("manifest.json") or b"")["streams"]["train"]["steps"]["1"]
    assert entry["hmac"] == json.loads((dump / "manifest.json").read_text())["streams"]["train"]["steps"]["1"]["hmac"]
    assert entry["hmac"].startswith("hmac-sha256:")
    assert_identical(replay(bundle, [1], hmac_key_env="RM_BUNDLE_KEY"), {1: original[1]})
    monkeypatch.setenv("RM_BUNDLE_KEY", "another key, not the one that signed")
    for where in (bundle, dump):  # the bundle checks the MAC exactly as the directory does
        with pytest.raises(CorruptStepError, match="HMAC signature does not match"):
            replay(where, [1], hmac_key_env="RM_BUNDLE_KEY")


def test_what_the_index_records_travels_whatever_its_fields(tmp_path: Path) -> None:
    """Rollout settings and request digests (fields this module does not know) are copied as
    recorded: top-level, per stream, per entry; other steps' entries stay behind."""
    dump = tmp_path / "dump"
    record(dump, range(4), tmp_path / "metrics.jsonl")
    manifest = json.loads((dump / "manifest.json").read_text())
    manifest["rollout_settings_v9"] = {"temperature": 0.7}
    manifest["streams"]["train"]["settings"] = {"get_batch": {"n": 8}}
    for step, entry in manifest["streams"]["train"]["steps"].items():
        entry["request"] = {"v": 1, "d": 1000 + int(step)}
    (dump / "manifest.json").write_text(json.dumps(manifest))
    bundle = tmp_path / "b.rmb"
    assert cli_main(["pack", str(dump), "--steps", "1-2", "-o", str(bundle)]) == 0
    packed = json.loads(Bundle.open(bundle).read("manifest.json") or b"")
    assert packed["rollout_settings_v9"] == {"temperature": 0.7}
    assert packed["fingerprint"] == manifest["fingerprint"] and packed["writer"] == manifest["writer"]
    stream = packed["streams"]["train"]
    assert stream["settings"] == {"get_batch": {"n": 8}} and stream["methods"] == manifest["streams"]["train"]["methods"]
    assert {k: v["request"] for k, v in stream["steps"].items()} == {"1": {"v": 1, "d": 1001}, "2": {"v": 1, "d": 1002}}
    assert stream["steps"]["1"]["call"] == manifest["streams"]["train"]["steps"]["1"]["call"]


def test_redacted_bundle_holds_no_prompt_or_response_text(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    original = record(dump, range(3), tmp_path / "metrics.jsonl")
    plain, redacted = tmp_path / "plain.rmb", tmp_path / "redacted.rmb"
    assert cli_main(["pack", str(dump), "--steps", "0,2", "-o", str(plain)]) == 0
    assert cli_main(["pack", str(dump), "--steps", "0,2", "-o", str(redacted), "--redact"]) == 0
    assert SECRET.encode() in plain.read_bytes()  # the grep can fail: nothing is compressed
    data = redacted.read_bytes()
    for text in (SECRET, "prompt 0.1", "answer 2.3"):
        assert text.encode() not in data and text.encode("utf-16-le") not in data
    # nor in any member, decompressed or decoded
    unpacked = tmp_path / "unpacked"
    assert cli_main(["unpack", str(redacted), "-o", str(unpacked)]) == 0
    for path in unpacked.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes()
    replayed = replay(redacted, [0, 2])
    for step, batch in replayed.items():
        assert SECRET not in repr({k: list(v) for k, v in batch.items() if isinstance(v, np.ndarray)})
        assert torch.equal(batch["input_ids"], original[step]["input_ids"])  # token ids are kept
        assert list(batch["uid"]) == list(original[step]["uid"])
    meta = json.loads((unpacked / "bundle.json").read_text())["meta"]
    assert meta["redacted"] == ["raw_prompt", "responses_text"]
    assert "provenance.json" not in {p.name for p in unpacked.iterdir()}  # no source path travels


def test_a_redacted_bundle_and_cut_keep_their_request_digests(tmp_path: Path) -> None:
    """Issue 35: ``--redact`` rewrote the keys of the index's call records (``"request":
    {"<redacted>0": ...}``), so a replay from a redacted bundle was served without matching."""
    from rollout_mock import ReplayMismatchError
    from rollout_mock.debug import cut_dump

    dump = tmp_path / "dump"
    record(dump, range(3), None)
    bundle = tmp_path / "redacted.rmb"
    assert cli_main(["pack", str(dump), "--steps", "0,2", "-o", str(bundle), "--redact"]) == 0
    cut = tmp_path / "cut"
    cut_dump(dump, cut, steps=[0, 2], redact=True)
    for source in (bundle, cut):
        store = open_dump(source)
        call = store.entry(store.stream("train"), 2).call
        assert set(call["request"]) == {"v", "d", "a", "n", "s"}, call["request"]  # "s": the structure mark
        assert call["request"] == {**call["request"], "d": open_dump(dump).entry(
            open_dump(dump).stream("train"), 2).call["request"]["d"]}
        assert SECRET not in json.dumps(call)
        replay(source, [0, 2])  # the same call: served
        with MockScheduler(None, cfg(source, "mock")) as scheduler, \
                pytest.raises(ReplayMismatchError, match="prompt") as info:
            scheduler.get_batch(None, 2, prompt="another prompt")
        assert info.value.step == 2


def test_bundle_in_place_is_read_only_and_lists_like_a_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "dump"
    original = record(dump, range(3), tmp_path / "metrics.jsonl")
    bundle = tmp_path / "b.rmb"
    assert cli_main(["pack", str(dump), "--steps", "1,2", "-o", str(bundle)]) == 0
    opened = open_dump(bundle)
    assert opened.steps(opened.stream("train")) == [1, 2]
    part = opened.load(2, keys=["input_ids"], rows=range(1, 3))
    assert torch.equal(part["input_ids"], original[2]["input_ids"][1:3])
    assert torch.equal(opened.open(1).load(keys=["old_log_probs"])["old_log_probs"], original[1]["old_log_probs"])
    capsys.readouterr()
    assert cli_main(["ls", str(bundle), "--verify"]) == 0
    assert "train: steps 1-2" in capsys.readouterr().out
    with pytest.raises(DumpNotWritableError, match=r"is a bundle, read-only.*rollout-mock unpack"):
        with MockScheduler(Rollouts(), cfg(bundle, overwrite=True)) as scheduler:
            scheduler.get_batch(None, 7)
    with pytest.raises(DumpNotWritableError, match="read-only"):
        opened.store.delete(opened.stream("train"), 1)
    assert Bundle.open(bundle).digest == Bundle.open(bundle).digest and open_dump(bundle).steps(opened.stream("train"))


def test_a_step_larger_than_one_read_replays_from_the_bundle_with_ranged_reads(tmp_path: Path) -> None:
    class Big:
        def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
            return {"x": torch.randn(5 << 20, dtype=torch.float32)}  # 20 MiB: ranged reads, not one

    dump = tmp_path / "dump"
    with MockScheduler(Big(), cfg(dump)) as scheduler:
        original = scheduler.get_batch(None, 0)
    bundle = tmp_path / "big.rmb"
    assert cli_main(["pack", str(dump), "--steps", "0", "-o", str(bundle)]) == 0
    with MockScheduler(None, cfg(bundle, "mock")) as scheduler:
        assert torch.equal(scheduler.get_batch(None, 0)["x"], original["x"])


def test_unpack_is_atomic_and_overwrites_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "dump"
    record(dump, range(2), tmp_path / "metrics.jsonl")
    bundle = tmp_path / "b.rmb"
    assert cli_main(["pack", str(dump), "--steps", "1", "-o", str(bundle)]) == 0
    assert cli_main(["pack", str(dump), "--steps", "0", "-o", str(bundle)]) == 2  # no silent replacement
    assert "exists" in capsys.readouterr().err
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert cli_main(["unpack", str(bundle), "-o", str(target)]) == 2
    assert "not empty" in capsys.readouterr().err and (target / "keep.txt").exists()
    assert cli_main(["unpack", str(bundle), "-o", str(target), "--overwrite"]) == 2  # not a dump: never replaced
    assert "not a dump" in capsys.readouterr().err and (target / "keep.txt").exists()
    (target / "keep.txt").unlink()
    assert cli_main(["unpack", str(bundle), "-o", str(target)]) == 0
    assert cli_main(["unpack", str(bundle), "-o", str(target), "--overwrite"]) == 0  # a dump: replaced
    assert open_dump(target).steps(open_dump(target).stream("train")) == [1]
    shutil.copyfile(bundle, target / "b.rmb")  # replacing the folder that holds the bundle: refused
    assert cli_main(["unpack", str(target / "b.rmb"), "-o", str(target), "--overwrite"]) == 2
    assert "holds the input" in capsys.readouterr().err and (target / "b.rmb").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["unpack", str(bundle), "-o", str(empty)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries left


def test_help_lists_the_commands_and_each_has_a_progress_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([]) == 0
    listing = capsys.readouterr().out
    assert all(f"    {name} " in listing for name in ("pack", "unpack", "pull"))
    parser = build_parser()
    for argv in (["pack", "d", "--steps", "1", "-o", "x.rmb"], ["unpack", "x.rmb", "-o", "d"],
                 ["pull", "s3://b/d", "--steps", "1", "-o", "d"]):
        assert parser.parse_args([*argv, "--no-progress"]).no_progress


def test_progress_bar_on_long_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal each command draws a bar (``progress=None``: TTY only); forced here."""
    import rollout_mock.storage.bundle as bundle_cli

    bars: list[tuple[str, float]] = []
    real = bundle_cli.progress_bar

    def spy(total: float, **kwargs: Any) -> Any:
        bars.append((kwargs.get("desc", ""), total))
        return real(total, **kwargs)

    monkeypatch.setattr(bundle_cli, "progress_bar", spy)
    dump = tmp_path / "dump"
    record(dump, range(2), tmp_path / "metrics.jsonl")
    assert cli_main(["pack", str(dump), "--steps", "0-1", "-o", str(tmp_path / "b.rmb")]) == 0
    assert cli_main(["unpack", str(tmp_path / "b.rmb"), "-o", str(tmp_path / "u")]) == 0
    assert cli_main(["pull", str(dump), "--steps", "1", "-o", str(tmp_path / "p")]) == 0
    assert [desc for desc, _ in bars] == ["pack", "unpack", "pull"] and all(total > 0 for _, total in bars)


# ------------------------------------------------------------------ pull from S3 (moto)
@pytest.fixture
def url(s3_server: dict[str, Any]) -> str:  # noqa: F811
    return f"s3://{s3_server['bucket']}/{uuid.uuid4().hex[:10]}/dump"


def test_pull_fetches_only_the_chosen_steps(url: str, s3_server: dict[str, Any], tmp_path: Path,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    options = s3_server["storage_options"]
    original = record(url, range(6), None, storage_options=options)
    lines = "".join(json.dumps({"step": step, **metrics_of(batch)}) + "\n" for step, batch in original.items())
    FsspecBackend(url, storage_options=options).replace("expected/metrics.jsonl", lines.encode())
    reads: list[tuple[str, int]] = []
    real_read = FsspecBackend.read

    def counting(self: FsspecBackend, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        data = real_read(self, rel, start, end)
        reads.append((rel, 0 if data is None else len(data)))
        return data

    monkeypatch.setattr(FsspecBackend, "read", counting)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    local = tmp_path / "local"
    assert cli_main(["pull", url, "--steps", "3", "-o", str(local), "--no-progress"]) == 0
    step_reads = {rel for rel, _ in reads if rel.endswith(".pkl")}
    assert step_reads == {"train/step_000003.pkl"}
    sizes = {s: e["size"] for s, e in json.loads((local / "manifest.json").read_text())["streams"]["train"]["steps"]
             .items()}
    assert list(sizes) == ["3"]
    step_bytes = sum(n for rel, n in reads if rel.endswith(".pkl"))
    assert step_bytes == sizes["3"]  # each byte of step 3 once, nothing of the five others
    assert_identical(replay(local, [3]), {3: original[3]})
    assert [json.loads(line)["step"] for line in (local / "expected" / "metrics.jsonl").read_text().splitlines()] == [3]
    # the same dump packed straight from S3, and a bundle on S3 opened in place (ranged reads)
    bundle = tmp_path / "from-s3.rmb"
    assert cli_main(["pack", url, "--steps", "4,5", "-o", str(bundle), "--no-progress"]) == 0
    remote = url.rsplit("/", 1)[0] + "/shared/bad-step.rmb"
    FsspecBackend(remote.rsplit("/", 1)[0], storage_options=options).replace("bad-step.rmb", bundle.read_bytes())
    reads.clear()
    assert_identical(replay(remote, [4, 5], storage_options=options), {4: original[4], 5: original[5]})
    assert reads and all(rel == "bad-step.rmb" for rel, _ in reads)
    assert cli_main(["unpack", remote, "-o", str(tmp_path / "from-remote"), "--no-progress"]) == 0
    assert_identical(replay(tmp_path / "from-remote", [5]), {5: original[5]})


def test_a_sliced_manifest_is_the_manifest_class_own_form(tmp_path: Path) -> None:
    """The slice's manifest.json is written by ``Manifest`` (one home for its form): its bytes are
    what the class writes of itself after a read, with the recorded fields (an unknown top-level
    one, the format version) and the features it uses (``call-packs``) kept, and the normal
    reader lists and loads its steps."""
    from rollout_mock.storage.manifest import StreamId, dumps_manifest, parse_manifest
    from rollout_mock.storage.store import DirectoryStore, open_store

    class Validation:
        def generate_sequences(self, prompts: list[str], global_steps: int) -> dict[str, Any]:
            return {"responses": torch.tensor([len(p) for p in prompts]), "text": [p.upper() for p in prompts]}

    dump, val = tmp_path / "dump", StreamId("val")
    with MockScheduler(Validation(), cfg(dump), split="val", methods=["generate_sequences"]) as scheduler:
        for step in range(3):
            for batch in (["p0", "p1"], ["p22"]):
                scheduler.generate_sequences(batch, global_steps=step)
    recorded = json.loads((dump / "manifest.json").read_text())
    assert recorded["requires"] == ["call-packs"]
    recorded.update(format_version=1, rollout_settings_v9={"temperature": 0.7})
    (dump / "manifest.json").write_text(json.dumps(recorded))
    DirectoryStore(dump).pack(tmp_path / "b.rmb", steps=[1, 2])
    body = Bundle.open(tmp_path / "b.rmb").read("manifest.json") or b""
    assert body == dumps_manifest(parse_manifest(body, "sliced")).encode("utf-8")
    sliced = json.loads(body)
    assert sliced["rollout_settings_v9"] == {"temperature": 0.7} and sliced["format_version"] == 1
    assert sliced["requires"] == ["call-packs"] and list(sliced["streams"]["val"]["steps"]) == ["1", "2"]
    bundled = open_store(tmp_path / "b.rmb")
    assert list(bundled.steps(val)) == [1, 2] and sorted(bundled.extra_calls(val)) == [1, 2]
    assert bundled.load(val, 2)["text"] == ["P0", "P1"]
