"""Every call, not only every step: several calls of one step recorded under (stream, step, call)
and replayed by their requests, in recorded order for equal requests (issue 34 items 1-3)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

import rollout_mock.codec as codec
from rollout_mock import MockScheduler
from rollout_mock.errors import CorruptStepError, ReplayMismatchError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import DirectoryStore

TRAIN = StreamId("train")


def _cfg(d: Path, mode: str, **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(d), **extra}


class Validation:
    """verl's V0 `_validate` in several batches: the same step, one call per batch."""

    def generate_sequences(self, prompts: list[str], global_steps: int) -> dict[str, Any]:
        return {"responses": torch.tensor([len(p) for p in prompts]), "text": [p.upper() for p in prompts]}


def test_a_step_of_one_call_is_stored_as_before(tmp_path: Path) -> None:
    batch = {"ids": torch.arange(12).reshape(3, 4), "text": ["a", "b", "c"]}

    class One:
        def get_batch(self, n: int, global_step: int) -> dict[str, Any]:
            return batch

    with MockScheduler(One(), _cfg(tmp_path, "dump")) as s:
        s.get_batch(3, global_step=0)
        s.get_batch(3, global_step=1)
    assert (tmp_path / "train" / "step_000000.pkl").read_bytes() == codec.encode_bytes(batch)
    assert not (tmp_path / "train" / ".calls").exists()
    store = DirectoryStore(tmp_path)
    entry = store.entry(TRAIN, 0)
    assert entry is not None and entry.call is not None and "index" not in entry.call
    assert store.extra_calls(TRAIN) == {}


def test_validation_in_several_batches_records_and_replays_each_batch(tmp_path: Path) -> None:
    batches = [["p0", "p1"], ["p22", "p3"], ["p444"]]
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), split="val", methods=["generate_sequences"]) as s:
        dumped = [s.generate_sequences(b, global_steps=4) for b in batches]
    store = DirectoryStore(tmp_path)
    extra = store.extra_calls(StreamId("val"))
    assert sorted(extra) == [4] and [call.call for _, call in extra[4]] == [1, 2]
    with MockScheduler(None, _cfg(tmp_path, "mock"), split="val", methods=["generate_sequences"],
                       spec=Validation) as s:
        # another order than recorded: each call gets the record of its own request
        replayed = {i: s.generate_sequences(batches[i], global_steps=4) for i in (2, 0, 1)}
    for i, batch in enumerate(dumped):
        assert torch.equal(replayed[i]["responses"], batch["responses"]) and replayed[i]["text"] == batch["text"]


def test_more_calls_than_recorded_is_an_error_naming_the_step_and_both_counts(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        s.generate_sequences(["a"], global_steps=0)
        s.generate_sequences(["b"], global_steps=0)
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
        s.generate_sequences(["a"], global_steps=0)
        s.generate_sequences(["b"], global_steps=0)
        with pytest.raises(ReplayMismatchError) as caught:
            s.generate_sequences(["a"], global_steps=0)
    assert caught.value.step == 0 and caught.value.counts == (2, 3)
    assert "made 2 call(s) of generate_sequences" in str(caught.value) and "a 3rd" in str(caught.value)


def test_a_step_recorded_with_one_call_serves_each_matching_call_as_before(tmp_path: Path) -> None:
    """A step of one call is served, checked, to every call of the step (a resumed run asking for
    it again); another request is refused by request matching."""
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        s.generate_sequences(["a"], global_steps=0)
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
        assert s.generate_sequences(["a"], global_steps=0)["text"] == ["A"]
        assert s.generate_sequences(["a"], global_steps=0)["text"] == ["A"]
        with pytest.raises(ReplayMismatchError, match="prompts"):
            s.generate_sequences(["b"], global_steps=0)


def test_fewer_calls_than_recorded_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        for prompt in ("a", "b", "c"):
            s.generate_sequences([prompt], global_steps=0)
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
            s.generate_sequences(["a"], global_steps=0)
    assert "made 3 call(s) at this step, this run was served 1" in caplog.text


def test_a_call_equal_to_no_recorded_call_names_the_step_and_the_call(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        s.generate_sequences(["a"], global_steps=3)
        s.generate_sequences(["b"], global_steps=3)
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
        s.generate_sequences(["b"], global_steps=3)
        with pytest.raises(ReplayMismatchError) as caught:
            s.generate_sequences(["zz"], global_steps=3)
    assert caught.value.step == 3 and caught.value.call == 0
    assert "step 3, call 0" in str(caught.value) and "prompts" in str(caught.value)


def test_equal_requests_are_served_in_recorded_order(tmp_path: Path) -> None:
    count = iter(range(100))

    class Sampler:
        def generate(self, prompt: str) -> dict[str, Any]:
            return {"sample": torch.tensor([next(count)])}

    with MockScheduler(Sampler(), _cfg(tmp_path, "dump"), methods=["generate"]) as s:
        with s.at_step(0):
            dumped = [int(s.generate("same")["sample"]) for _ in range(4)]
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate"], spec=Sampler) as s:
        with s.at_step(0):
            replayed = [int(s.generate("same")["sample"]) for _ in range(4)]
    assert replayed == dumped == [0, 1, 2, 3]


def test_concurrent_calls_of_one_step_from_threads(tmp_path: Path) -> None:
    """Two threads with the same step at once: both recorded (one step file, one pack), none
    refused in the background; replayed by request whatever order the threads run in."""
    barrier = threading.Barrier(8)

    class Engine:
        def generate(self, prompt: str, global_step: int) -> dict[str, Any]:
            barrier.wait(timeout=HANG_S)
            return {"ids": torch.tensor([ord(c) for c in prompt]), "prompt": prompt}

    prompts = [f"prompt {i}" * (i + 1) for i in range(8)]

    def run(s: Any) -> dict[str, Any]:
        results: dict[str, Any] = {}
        order = list(prompts)
        random.Random(len(str(s))).shuffle(order)
        threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, s.generate(p, global_step=7)))
                   for p in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=HANG_S)
        return results

    with MockScheduler(Engine(), _cfg(tmp_path, "dump"), methods=["generate"]) as s:
        dumped = run(s)
    store = DirectoryStore(tmp_path)
    assert store.steps(TRAIN) == [7] and len(store.extra_calls(TRAIN)[7]) == 7
    barrier = threading.Barrier(1)  # mock mode never runs the engine
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate"], spec=Engine) as s:
        replayed = run(s)
    assert {p: r["prompt"] for p, r in replayed.items()} == {p: p for p in prompts}
    assert all(torch.equal(replayed[p]["ids"], dumped[p]["ids"]) for p in prompts)


class Agent:
    """An agent loop's engine: responses arrive in a random order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    async def generate(self, messages: list[str]) -> dict[str, Any]:
        await asyncio.sleep(self.rng.random() / 500)
        reply = f"reply{self.rng.randrange(10**6)}"
        return {"text": reply, "logprobs": torch.randn(len(reply), generator=torch.Generator().manual_seed(len(reply)))}


async def _episodes(s: Any, step: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)

    async def episode(i: int) -> list[str]:
        messages = [f"task {step}.{i}"]
        for _ in range(3):
            await asyncio.sleep(rng.random() / 500)
            messages.append((await s.generate(list(messages)))["text"])
        return messages

    with s.at_step(step):
        return list(await asyncio.gather(*(episode(i) for i in range(8))))


def test_asyncio_agent_loop_8_episodes_3_turns_random_order(tmp_path: Path) -> None:
    async def run(mode: str, seed: int) -> list[Any]:
        engine = Agent(seed) if mode == "dump" else None
        with MockScheduler(engine, _cfg(tmp_path, mode), methods=["generate"], spec=Agent) as s:
            return [await _episodes(s, step, seed + step) for step in range(3)]

    dumped = asyncio.run(run("dump", 1))
    replayed = asyncio.run(run("mock", 99))  # other timings: the calls finish in another order
    assert replayed == dumped
    assert all(len(calls) == 23 for calls in DirectoryStore(tmp_path).extra_calls(TRAIN).values())


def test_the_counter_continues_after_at_step(tmp_path: Path) -> None:
    class Counter:
        def get_batch(self) -> dict[str, Any]:
            return {"x": torch.zeros(1)}

    with MockScheduler(Counter(), _cfg(tmp_path, "dump")) as s:
        with s.at_step(5):
            s.get_batch()
            s.get_batch()
        s.get_batch()
    store = DirectoryStore(tmp_path)
    assert list(store.steps(TRAIN)) == [5, 6] and len(store.extra_calls(TRAIN)[5]) == 1


def test_provenance_is_recorded_with_each_call(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"],
                       provenance=lambda batch: {"versions": [int(batch["responses"][0])]}) as s:
        s.generate_sequences(["a"], global_steps=0)
        s.generate_sequences(["bbb"], global_steps=0)
    store = DirectoryStore(tmp_path)
    entry = store.entry(TRAIN, 0)
    assert entry is not None and entry.call is not None and entry.call["provenance"] == {"versions": [1]}
    assert [c.provenance for _, c in store.extra_calls(TRAIN)[0]] == [{"versions": [3]}]


def test_overwrite_drops_the_extra_calls_of_an_earlier_run(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        for prompt in ("a", "b", "c"):
            s.generate_sequences([prompt], global_steps=0)
    with MockScheduler(Validation(), _cfg(tmp_path, "dump", overwrite=True), methods=["generate_sequences"]) as s:
        s.generate_sequences(["x"], global_steps=0)
    assert DirectoryStore(tmp_path).extra_calls(TRAIN) == {}
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
        assert s.generate_sequences(["x"], global_steps=0)["text"] == ["X"]


def test_a_damaged_pack_is_refused_naming_the_file_and_the_call(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        s.generate_sequences(["a"], global_steps=0)
        s.generate_sequences(["b"], global_steps=0)
    pack = tmp_path / "train" / ".calls" / "pack_000000.pkl"
    data = bytearray(pack.read_bytes())
    data[len(data) // 3] ^= 0xFF
    pack.write_bytes(bytes(data))
    with MockScheduler(None, _cfg(tmp_path, "mock"), methods=["generate_sequences"], spec=Validation) as s:
        s.generate_sequences(["a"], global_steps=0)
        with pytest.raises(CorruptStepError, match="pack_000000.pkl"):
            s.generate_sequences(["b"], global_steps=0)


def test_a_pack_signed_with_hmac_cannot_be_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_TEST_KEY", "k" * 32)
    monkeypatch.setenv("RM_OTHER_KEY", "z" * 32)
    key = {"hmac_key_env": "RM_TEST_KEY"}
    with MockScheduler(Validation(), _cfg(tmp_path, "dump", **key), methods=["generate_sequences"]) as s:
        for prompt in ("a", "b"):
            s.generate_sequences([prompt], global_steps=0)
    record = tmp_path / "train" / ".calls" / "pack_000000.json"
    assert json.loads(record.read_text())["hmac"].startswith("hmac-sha256:")
    with MockScheduler(None, _cfg(tmp_path, "mock", **key), methods=["generate_sequences"],
                       spec=Validation) as s:
        s.generate_sequences(["a"], global_steps=0)
        assert s.generate_sequences(["b"], global_steps=0)["text"] == ["B"]
    with MockScheduler(None, _cfg(tmp_path, "mock", hmac_key_env="RM_OTHER_KEY"), methods=["generate_sequences"],
                       spec=Validation) as s:
        with pytest.raises(CorruptStepError):
            s.generate_sequences(["a"], global_steps=0)


@pytest.mark.parametrize("planted", [
    "[]", '{"format": "rollout_mock.calls"}', "not json", '{"format":"rollout_mock.calls","stream":"train",'
    '"seq":0,"file":"train/.calls/pack_000000.pkl","size":10,"checksum":"crc32:00000000",'
    '"calls":[[0,1,"m",5,999999,"crc32:00000000",null,null,null]]}',
])
def test_a_planted_pack_record_is_ignored_with_a_warning(tmp_path: Path, planted: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"]) as s:
        s.generate_sequences(["a"], global_steps=0)
    (tmp_path / "train" / ".calls").mkdir()
    (tmp_path / "train" / ".calls" / "pack_000000.json").write_text(planted)
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        assert DirectoryStore(tmp_path).extra_calls(TRAIN) == {}
    assert "pack_000000.json" in caplog.text


def test_open_dump_lists_and_loads_every_call(tmp_path: Path) -> None:
    from rollout_mock import open_dump
    from rollout_mock.errors import StepNotFoundError

    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), methods=["generate_sequences"],
                       provenance=lambda batch: {"n": len(batch["text"])}) as s:
        s.generate_sequences(["a"], global_steps=2)
        s.generate_sequences(["b", "c"], global_steps=2)
    dump = open_dump(tmp_path)
    calls = dump.calls(2)
    assert [(c.call, c.method, c.provenance) for c in calls] == [(0, "generate_sequences", {"n": 1}),
                                                                 (1, "generate_sequences", {"n": 2})]
    assert dump.load_call(2, 1)["text"] == ["B", "C"] and dump.load_call(2, 0)["text"] == ["A"]
    with pytest.raises(StepNotFoundError, match="no call 5"):
        dump.load_call(2, 5)


def test_the_further_calls_are_one_list_written_as_the_lists_encode(tmp_path: Path) -> None:
    """The calls beyond a step's first are captured into one list as they come (on the calling
    thread) and written as captured: the pack's member is the bytes of the list's encode (what
    packs held when the writer thread rebuilt and encoded the list), each call at its item."""
    batches = [["p0", "p1"], ["p22", "p3"], ["p444"], ["p5"]]
    with MockScheduler(Validation(), _cfg(tmp_path, "dump"), split="val", methods=["generate_sequences"]) as s:
        dumped = [s.generate_sequences(b, global_steps=4) for b in batches]
    store = DirectoryStore(tmp_path)
    ((pack, _),) = {(pack.seq, pack.file): (pack, call) for pack, call in store.extra_calls(StreamId("val"))[4]
                    }.values()
    assert [(c.call, c.item) for c in pack.calls] == [(1, 0), (2, 1), (3, 2)]
    assert len({(c.offset, c.size) for c in pack.calls}) == 1
    first = pack.calls[0]
    data = (tmp_path / pack.file).read_bytes()[first.offset:first.offset + first.size]
    assert data == codec.encode_bytes(dumped[1:])
    summaries = store.pack_meta(StreamId("val"), pack)
    assert len(summaries) == 3 and all(isinstance(call, dict) and "args" in call for call in summaries)


def test_the_ring_removes_packs_whose_steps_are_all_deleted(tmp_path: Path) -> None:
    with MockScheduler(Validation(), _cfg(tmp_path, "dump", max_keep=2), methods=["generate_sequences"]) as s:
        for step in range(6):
            s.generate_sequences(["a"], global_steps=step)
            s.generate_sequences(["bb"], global_steps=step)
            s.flush()
    store = DirectoryStore(tmp_path)
    assert list(store.steps(TRAIN)) == [4, 5]
    assert sorted(store.extra_calls(TRAIN)) == [4, 5]
    assert {c.step for p in store.packs(TRAIN) for c in p.calls} == {4, 5}


def test_calls_held_back_for_a_pack_are_written_at_flush_and_at_exit(tmp_path: Path) -> None:
    """Further calls are handed to the writer many at a time (a new step, 256 calls, flush,
    close); nothing queued is lost at flush or at interpreter exit without a close."""
    import subprocess
    import sys
    import textwrap

    with MockScheduler(Validation(), _cfg(tmp_path / "a", "dump"), methods=["generate_sequences"]) as s:
        for prompt in ("a", "b", "c"):
            s.generate_sequences([prompt], global_steps=0)
        s.flush()
        assert len(DirectoryStore(tmp_path / "a").extra_calls(TRAIN)[0]) == 2  # another handle sees them
    script = textwrap.dedent(f'''
        import torch
        from rollout_mock import MockScheduler
        class V:
            def generate_sequences(self, prompts, global_steps):
                return {{"r": torch.tensor([len(p) for p in prompts])}}
        s = MockScheduler(V(), {{"enable": True, "mode": "dump", "dump_dir": {str(tmp_path / "b")!r}}},
                          methods=["generate_sequences"])
        for prompt in ("a", "bb", "ccc"):
            s.generate_sequences([prompt], global_steps=0)
        # no close: the exit hook writes what is queued
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with MockScheduler(None, _cfg(tmp_path / "b", "mock"), methods=["generate_sequences"], spec=Validation) as s:
        assert [s.generate_sequences([p], global_steps=0)["r"].tolist() for p in ("ccc", "a", "bb")] == [[3], [1], [2]]
