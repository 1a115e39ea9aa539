"""slime's samples as readable traces (show, report): one trace per sample, its prompt and
response as messages, its reward, and its GRPO group (found by the report helper's review)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rollout_mock.compare.traces import batch_traces, count_traces
from rollout_mock.storage import BatchInfo, DirectoryStore
from rollout_mock.storage.manifest import StreamId


def sample(i: int, reward: Any = 0.5, status: str = "completed") -> dict[str, Any]:
    return {"index": i, "prompt": f"question {i}", "tokens": [1, 2, 3, 4, 5], "response_length": 2,
            "response": f"answer {i}", "reward": reward, "loss_mask": [1, 1], "status": status,
            "rollout_log_probs": [-0.1, -0.2], "metadata": {}}


def test_flat_samples_are_one_trace_each() -> None:
    batch = [sample(0), sample(1, reward={"score": 1.0}), sample(2, status="aborted")]
    traces = batch_traces(batch)
    assert count_traces(batch) == 3 and len(traces) == 3
    assert [t.reward for t in traces] == [0.5, 1.0, None] and [t.status for t in traces] == ["ok", "ok", "rejected"]
    assert traces[0].messages[0]["content"] == "question 0" and traces[0].messages[1]["content"] == "answer 0"


def test_a_recorded_rollout_keeps_its_groups() -> None:
    record = {"format": "rollout_mock.slime", "kind": "train", "metrics": None,
              "samples": [[sample(0), sample(1)], [sample(2), sample(3, reward=0.0)]]}
    traces = batch_traces(record, max_traces=3)
    assert count_traces(record) == 4 and len(traces) == 3
    assert [t.metadata["uid"] for t in traces] == [0, 0, 1]


def test_response_from_tokens_when_there_is_no_text() -> None:
    s = sample(0)
    del s["response"]
    (trace,) = batch_traces([s])
    assert trace.messages[-1]["role"] == "assistant" and trace.messages[-1]["tokens"] == [4, 5]


def test_report_of_a_slime_dump_shows_rewards_and_groups(tmp_path: Path) -> None:
    from rollout_mock.debug.report import write_report

    store = DirectoryStore(tmp_path / "d")
    for step in range(2):
        record = {"format": "rollout_mock.slime", "kind": "train", "metrics": None,
                  "samples": [[sample(4 * g + k, reward=float(k)) for k in range(2)] for g in range(2)]}
        store.save(StreamId("train"), step, record, BatchInfo.of(record))
    store.close()
    html = write_report(tmp_path / "d", tmp_path / "r.html").read_text()
    assert "no sample previews" not in html and "answer 5" in html
    match = re.search(r'id="rm-data">(.*?)</script>', html, re.S)
    assert match is not None
    step = json.loads(match.group(1))["steps"]["0"]
    assert step["groups"]["groups"] == 2 and sum(step["hist"]["reward"]["counts"]) == 4
