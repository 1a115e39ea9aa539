"""Readable traces of recorded batches (rollout_mock.compare.traces) and ``rollout-mock show``."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import MockScheduler, TraceError, batch_traces, cli
from rollout_mock.compare.traces import Trace, count_traces, format_traces, traces_to_jsonl

# ------------------------------------------------------------------------------------------ data


def trajectory(group: int, runs: list[tuple[int, int]], *, pad: int = 0, reward: float = 1.0,
               first_id: int = 10) -> dict[str, torch.Tensor]:
    """An AReaL trajectory dict: ``group`` identical rows of loss-mask ``runs`` [(flag, length)],
    right-padded by ``pad`` tokens (attention_mask False, and loss_mask 1 there to prove that the
    attention mask decides the length); versions 7 on generated tokens, -1 elsewhere."""
    ids: list[int] = []
    loss: list[int] = []
    for flag, length in runs:
        ids += [first_id + len(ids) + k for k in range(length)]
        loss += [flag] * length
    row_ids = ids + [0] * pad
    row_loss = loss + [1] * pad
    loss_mask = torch.tensor([row_loss] * group, dtype=torch.int32)
    return {
        "input_ids": torch.tensor([row_ids] * group, dtype=torch.int32),
        "loss_mask": loss_mask,
        "attention_mask": torch.tensor([[True] * len(ids) + [False] * pad] * group),
        "logprobs": torch.zeros(group, len(row_ids)),
        "versions": torch.where(loss_mask.bool(), 7, -1).to(torch.int32),
        "rewards": torch.full((group,), reward),
    }


def multi_turn(group: int = 2, pad: int = 3, reward: float = 1.0) -> dict[str, torch.Tensor]:
    """user 4, assistant 3, tool 2, assistant 5 tokens."""
    return trajectory(group, [(0, 4), (1, 3), (0, 2), (1, 5)], pad=pad, reward=reward)


def areal_batch() -> list[dict[str, torch.Tensor] | None]:
    return [multi_turn(group=2, pad=3), None, trajectory(3, [(0, 6), (1, 1)], pad=0, reward=0.0), None]


class FakeTokenizer:
    def decode(self, ids: list[int]) -> str:
        assert isinstance(ids, list) and all(type(i) is int for i in ids)  # plain Python ints
        return " ".join(f"w{i}" for i in ids)


# ------------------------------------------------------------------------------------------ AReaL


def test_areal_roles_lengths_rewards_and_rejected() -> None:
    traces = batch_traces(areal_batch(), step=5)
    assert [t.status for t in traces] == ["ok", "ok", "rejected", "ok", "ok", "ok", "rejected"]
    assert [t.index for t in traces] == list(range(7))
    assert count_traces(areal_batch()) == 7
    first = traces[0]
    assert [(m["role"], m["tokens"]) for m in first.messages] == [
        ("user", 4), ("assistant", 3), ("tool", 2), ("assistant", 5)]
    assert first.messages[0]["content"] == "[10 11 12 13]"
    assert first.reward == 1.0 and first.step == 5
    assert first.metadata == {"trajectory": 0, "row": 0, "length": 14, "prompt_tokens": 4,
                              "completion_tokens": 8, "versions": [7, 7]}
    assert traces[1].metadata["row"] == 1
    assert traces[2].reward is None and traces[2].messages == [] and traces[2].metadata == {"trajectory": 1}
    short = traces[3]  # another B and L: 3 rows of 7 tokens, no padding
    assert [(m["role"], m["tokens"]) for m in short.messages] == [("user", 6), ("assistant", 1)]
    assert short.reward == 0.0 and short.metadata["trajectory"] == 2 and short.metadata["length"] == 7


def test_cap_counts_rejected_and_stops_mid_trajectory() -> None:
    traces = batch_traces(areal_batch(), max_traces=4)
    assert [(t.status, t.metadata.get("trajectory"), t.metadata.get("row")) for t in traces] == [
        ("ok", 0, 0), ("ok", 0, 1), ("rejected", 1, None), ("ok", 2, 0)]
    assert batch_traces(areal_batch(), max_traces=0) == []
    assert len(batch_traces([None] * 50)) == 32  # default cap
    assert batch_traces([]) == []
    with pytest.raises(TraceError):
        batch_traces(areal_batch(), max_traces=-1)


def test_long_content_is_truncated_with_a_count() -> None:
    traces = batch_traces([trajectory(1, [(0, 2), (1, 40)])])
    assert traces[0].messages[1]["content"].endswith(" ... +24 more]")
    assert traces[0].messages[1]["tokens"] == 40


def test_structured_messages_are_used_as_is() -> None:
    item = {
        "messages": [
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": [{"type": "text", "text": "4"}], "num_tokens": 1}],
            [{"role": "user", "content": "3+3?"}, {"role": "function", "content": "6"},
             {"role": "assistant", "content": [51, 52]}],
        ],
        "rewards": torch.tensor([1.0, 0.5]),
    }
    single = {"messages": [{"role": "user", "content": "hi"}], "rewards": torch.tensor([0.25])}
    traces = batch_traces([item, None, single])
    assert count_traces([item, None, single]) == 4
    assert [m["role"] for m in traces[0].messages] == ["system", "user", "assistant"]
    assert traces[0].messages[2] == {"role": "assistant", "content": "4", "tokens": 1}
    assert traces[0].messages[0]["tokens"] is None and traces[0].reward == 1.0
    assert [m["role"] for m in traces[1].messages] == ["user", "tool", "assistant"]
    assert traces[1].messages[2] == {"role": "assistant", "content": "[51 52]", "tokens": 2}
    assert traces[1].reward == 0.5 and traces[2].status == "rejected"
    assert traces[3].messages == [{"role": "user", "content": "hi", "tokens": None}] and traces[3].reward == 0.25


def test_dict_of_tensors_and_tokenizer_decoding() -> None:
    batch = multi_turn(group=2, pad=1)
    traces = batch_traces(batch, tokenizer=FakeTokenizer())
    assert len(traces) == 2 and "trajectory" not in traces[0].metadata
    assert traces[0].messages[0]["content"] == "w10 w11 w12 w13"
    assert traces[0].messages[2] == {"role": "tool", "content": "w17 w18", "tokens": 2}
    # verl without `prompts`: the prompt is input_ids before the response
    verl_like = {"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "responses": torch.tensor([[4, 5]]),
                 "rewards": torch.tensor([0.5]), "uid": ["u0"]}
    trace = batch_traces(verl_like)[0]
    assert [(m["role"], m["content"]) for m in trace.messages] == [("user", "[1 2 3]"), ("assistant", "[4 5]")]
    assert trace.reward == 0.5 and trace.metadata["fields"] == {"uid": "u0"}
    with pytest.raises(TraceError, match="cannot build traces"):
        batch_traces(object())
    with pytest.raises(TraceError, match="trajectory 1"):
        batch_traces([batch, "oops"])


def test_local_tokenizer_file_decodes(tmp_path: Path) -> None:
    tokenizer_dir = make_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    batch = {"input_ids": torch.tensor([[2, 3, 4, 5, 4, 6, 0]]), "loss_mask": torch.tensor([[0, 0, 0, 0, 0, 1, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 0]])}
    messages = batch_traces(batch, tokenizer=tokenizer)[0].messages
    assert [(m["role"], m["content"]) for m in messages] == [("user", "what is two plus two"), ("assistant", "four")]


# ------------------------------------------------------------------------------------------ verl


def verl_batch() -> Any:
    """A verl DataProto as the trainer builds it: left-padded prompts, right-padded responses; the
    second response has a tool turn (response_mask 0 inside the attention mask)."""
    data_proto = pytest.importorskip("verl.protocol").DataProto
    prompts = torch.tensor([[0, 0, 21, 22], [23, 24, 25, 26]])
    responses = torch.tensor([[31, 32, 2, 0, 0], [33, 34, 35, 36, 2]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]])
    scores = torch.zeros(2, 5)
    scores[0, 2], scores[1, 4] = 1.0, 0.5
    raw_prompt = np.empty(2, dtype=object)
    raw_prompt[0] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "question one"}]
    raw_prompt[1] = np.array([{"role": "user", "content": "question two"}], dtype=object)
    return data_proto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention_mask,
                 "response_mask": response_mask, "token_level_scores": scores,
                 "input_ids": torch.cat([prompts, responses], dim=1)},
        non_tensors={"raw_prompt": raw_prompt, "uid": np.array(["a", "b"], dtype=object),
                     "data_source": np.array(["gsm8k", "gsm8k"], dtype=object)},
        meta_info={"global_steps": 3},
    )


@pytest.mark.verl
def test_verl_dataproto() -> None:
    batch = verl_batch()
    traces = batch_traces(batch)
    assert count_traces(batch) == 2 and len(traces) == 2
    first, second = traces
    assert first.messages == [
        {"role": "system", "content": "sys", "tokens": None},
        {"role": "user", "content": "question one", "tokens": None},
        {"role": "assistant", "content": "[31 32 2]", "tokens": 3},
    ]
    assert first.reward == 1.0 and second.reward == 0.5
    assert first.metadata["prompt_tokens"] == 2 and first.metadata["length"] == 5
    assert first.metadata["fields"] == {"uid": "a", "data_source": "gsm8k"}
    assert [(m["role"], m["tokens"]) for m in second.messages] == [
        ("user", None), ("assistant", 1), ("tool", 2), ("assistant", 2)]
    assert second.messages[0]["content"] == "question two"


# ------------------------------------------------------------------------------------------ output


def test_format_and_jsonl() -> None:
    traces = batch_traces([multi_turn(group=1, reward=float("nan")), None], step=2)
    text = format_traces(traces)
    assert "--- step 2 | trace 0 | ok | reward nan | trajectory 0 row 0 | versions 7 | 14 tokens" in text
    assert "  [tool] (2 tokens)\n    [17 18]" in text
    assert "--- step 2 | trace 1 | rejected | trajectory 1" in text
    lines = traces_to_jsonl(traces, 9).splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON: NaN becomes a string
    assert records[0]["reward"] == "NaN" and records[0]["step"] == 9 and records[1]["status"] == "rejected"
    assert traces_to_jsonl([]) == "" and format_traces([]) == ""
    assert Trace(0, "ok", math.inf).to_json()["reward"] == "Infinity"


# ------------------------------------------------------------------------------------------ CLI


def make_tokenizer(tmp_path: Path) -> Path:
    """A tiny WordLevel tokenizer saved as a transformers tokenizer directory (no download)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<pad>", "<unk>", "what", "is", "two", "plus", "four"]
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    model.save(str(tmp_path / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                                pad_token="<pad>", unk_token="<unk>")
    out = tmp_path / "tokenizer"
    fast.save_pretrained(str(out))
    return out


class ArealEngine:
    """AReaL shape: rollout_batch returns a list of trajectory dicts, None for rejected ones."""

    def rollout_batch(self, data: Any) -> list[dict[str, torch.Tensor] | None]:
        return [trajectory(2, [(0, 3), (1, 2)], first_id=2), None]


@pytest.fixture
def areal_dump(dump_dir: Path) -> Path:
    with MockScheduler(ArealEngine(), cfg(dump_dir), methods=("rollout_batch",)) as engine:
        for _ in range(3):
            engine.rollout_batch(None)
    return dump_dir


def test_cli_show_text_and_default_step(areal_dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", str(areal_dump)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("=== train step 0: 3 of 3 traces shown (1 rejected)\n")
    assert "  [user] (3 tokens)\n    [2 3 4]" in out and "trace 2 | rejected" in out
    assert cli.main(["show", str(areal_dump), "--steps", "1-2", "--max", "1"]) == 0
    out = capsys.readouterr().out
    assert "step 1: 1 of 3 traces" in out and "step 2: 1 of 3 traces" in out and "step 0" not in out


def test_cli_show_jsonl_and_tokenizer(areal_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer_dir = make_tokenizer(tmp_path)
    assert cli.main(["show", str(areal_dump), "--step", "2", "--jsonl", "--tokenizer", str(tokenizer_dir)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["step"], r["index"], r["status"]) for r in records] == [(2, 0, "ok"), (2, 1, "ok"), (2, 2, "rejected")]
    assert [m["content"] for m in records[0]["messages"]] == ["what is two", "plus four"]


def test_cli_show_errors_are_one_line(areal_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    cases = [
        # without transformers the same option says which package it needs, still in one line
        (["--tokenizer", str(tmp_path / "empty")],
         "not a tokenizer directory" if importlib.util.find_spec("transformers") else "needs transformers"),
        (["--tokenizer", str(tmp_path / "nowhere")], "not a directory"),
        (["--step", "9"], "step 9 is not in"),
        (["--steps", "5-8"], "step 5 is not in"),
        (["--split", "val"], "no stream 'val'"),
        (["--max", "-1"], "--max -1"),
    ]
    for extra, message in cases:
        assert cli.main(["show", str(areal_dump), *extra]) == 2, extra
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("rollout-mock show: error: ") and message in captured.err, captured.err
        assert "Traceback" not in captured.err
        if extra[0] == "--tokenizer":
            assert len(captured.err.strip().splitlines()) == 1, captured.err


@pytest.mark.verl
def test_cli_show_verl_dump(dump_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Rollout:
        def generate_sequences(self, prompts: Any) -> Any:
            return verl_batch()

    with MockScheduler(Rollout(), cfg(dump_dir), methods=("generate_sequences",)) as rollout:
        rollout.generate_sequences(None)
    assert cli.main(["show", str(dump_dir)]) == 0  # DataProto loads with the safe loader
    out = capsys.readouterr().out
    assert "[system]\n    sys" in out and "uid: b" in out and "reward 0.5" in out


def test_trl_records_give_one_trace_per_completion_in_show_and_samples_in_ls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`show DUMP --step 0` printed "0 of 0 traces" for TRL dumps and `ls` samples=None."""
    from report_cases import framework_dump, trl_batch

    from rollout_mock.batch import count_samples, take_rows

    record = trl_batch(0, n=4)
    assert count_samples(record) == 4 and count_traces(record) == 4
    traces = batch_traces(record)
    assert [t.index for t in traces] == [0, 1, 2, 3]
    first = traces[0]
    assert [m["role"] for m in first.messages] == ["user", "assistant"]
    assert first.messages[0]["tokens"] == record["generate"]["output"][0][0]
    assert first.messages[1]["content"] == "completion 0 of step 0"
    assert first.reward == pytest.approx(float(record["rewards"]["rewards_per_func"][0].sum()))
    two = take_rows(record, [3, 1])
    assert count_samples(two) == 2 and two["generate"]["output"][3] == ["completion 3 of step 0", "completion 1 of step 0"]
    assert torch.equal(two["rewards"]["rewards_per_func"], record["rewards"]["rewards_per_func"][[3, 1]])

    dump = framework_dump(tmp_path / "trl", "trl", steps=2)
    assert cli.main(["show", str(dump), "--step", "0"]) == 0
    out = capsys.readouterr().out
    assert "16 of 16 traces" in out and "completion 0 of step 0" in out, out
    assert cli.main(["ls", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "samples=16" in out and "samples=None" not in out, out
