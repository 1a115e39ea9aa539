"""Framework layouts (issue 36): a framework's traces, log-prob sequences and report view are
registered by its adapter (:class:`rollout_mock.batch.Layout`), and compare/ and debug/ look them
up. A made-up framework, registered here, gets all three without a line of compare/ or debug/."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rollout_mock import batch as batch_model
from rollout_mock.batch import Layout, layout_of, layout_of_key, logprob_keys, register_layout
from rollout_mock.compare.trace_rows import Renderer
from rollout_mock.compare.traces import Trace, batch_traces, count_traces
from rollout_mock.debug.logprobs import logprob_consistency
from rollout_mock.debug.report_columns import numeric_columns, report_view
from rollout_mock.debug.sequences import Extraction, LogprobKeys, RecordedSequence, extract_sequences
from rollout_mock.errors import RolloutMockError

VOCAB = 8
#: What a uniform model gives every token (float32, as the recompute computes it).
UNIFORM = float(torch.log_softmax(torch.zeros(VOCAB), -1)[0])


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry as the adapters left it, restored after each test."""
    monkeypatch.setattr(batch_model, "_LAYOUTS", list(batch_model._LAYOUTS))
    yield


# --------------------------------------------------------------------------- a made-up framework
def episodes_batch() -> dict[str, Any]:
    """"toyrl" keeps its rollouts as ``{"toyrl": 1, "episodes": [...]}``: each episode its token
    ``ids``, the length ``n`` of its answer, the answer's log-probs ``lp`` and a ``score``."""
    return {"toyrl": 1, "episodes": [
        {"ids": [1, 2, 3, 4], "n": 2, "lp": [UNIFORM, UNIFORM], "answer": "four", "score": 1.0},
        {"ids": [5, 6, 7], "n": 1, "lp": [UNIFORM], "answer": "seven", "score": 0.0},
    ]}


def _is_toy(batch: Any) -> bool:
    return isinstance(batch, dict) and batch.get("toyrl") == 1


def _toy_traces(batch: Any, limit: int, renderer: Any) -> list[Any]:
    return [Trace(i, "ok", e["score"], [{"role": "user", "content": renderer.content(e["ids"][: -e["n"]]),
                                          "tokens": len(e["ids"]) - e["n"]},
                                         {"role": "assistant", "content": e["answer"], "tokens": e["n"]}],
                  {"completion_tokens": e["n"], "uid": "g0"})
            for i, e in enumerate(batch["episodes"][:limit])]


def _toy_sequences(batch: Any, keys: LogprobKeys) -> Extraction:
    out = Extraction("toyrl", {"logprobs": keys.logprobs or "lp", "tokens": keys.tokens or "ids"})
    for i, e in enumerate(batch["episodes"]):
        ids = torch.tensor(e["ids"])
        out.sequences.append(RecordedSequence(i, ids, torch.arange(len(ids) - e["n"], len(ids)),
                                              torch.tensor(e["lp"], dtype=torch.float64)))
    return out


def _toy_view(batch: Any) -> tuple[Any, list[str | None] | None]:
    rows = batch["episodes"]
    width = max(len(e["ids"]) for e in rows)
    columns = {"input_ids": torch.zeros(len(rows), width, dtype=torch.long),
               "toy_lp": torch.zeros(len(rows), width), "score": torch.tensor([e["score"] for e in rows])}
    for i, e in enumerate(rows):
        columns["input_ids"][i, : len(e["ids"])] = torch.tensor(e["ids"])
        columns["toy_lp"][i, len(e["ids"]) - e["n"]: len(e["ids"])] = torch.tensor(e["lp"])
    return columns, [e["answer"] for e in rows]


TOY = Layout("toyrl", logprob_keys=("toy_lp",), matches=_is_toy, traces=_toy_traces,
             count_traces=lambda b: len(b["episodes"]), sequences=_toy_sequences, view=_toy_view)


def uniform_model(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(torch.zeros(*input_ids.shape, VOCAB), -1)


def test_a_framework_unknown_to_compare_and_debug_is_read_once_registered() -> None:
    batch = episodes_batch()
    with pytest.raises(RolloutMockError):  # unregistered: neither traces nor the log-prob check can read it
        extract_sequences(batch)
    register_layout(TOY)
    assert layout_of(batch) is TOY
    traces = batch_traces(batch, step=3)
    assert count_traces(batch) == 2 and [t.reward for t in traces] == [1.0, 0.0]
    assert traces[0].messages[1]["content"] == "four" and traces[0].step == 3
    assert batch_traces(batch, max_traces=1)[0].messages[0]["content"] == "[1 2]"  # the renderer it was handed
    extraction = extract_sequences(batch)
    assert extraction.layout == "toyrl" and len(extraction.sequences) == 2
    report = logprob_consistency(batch, uniform_model)
    assert report.layout == "toyrl" and report.tokens == 3 and report.max_abs_diff < 1e-6
    view, texts = report_view(batch)
    assert texts == ["four", "seven"] and set(view) == {"input_ids", "toy_lp", "score"}


def test_a_registered_log_prob_column_is_found_and_named() -> None:
    columns = {"input_ids": torch.tensor([[1, 2, 3]]), "toy_lp": torch.tensor([[UNIFORM, UNIFORM]])}
    with pytest.raises(RolloutMockError, match="no log-prob key"):
        extract_sequences(columns)
    register_layout(Layout("toyrl", logprob_keys=("toy_lp",)))
    assert "toy_lp" in logprob_keys() and layout_of_key("toy_lp") is not None
    extraction = extract_sequences(columns)  # [1, L-1]: shifted, as the column width says
    assert extraction.layout == "toyrl" and extraction.keys["logprobs"] == "toy_lp"
    assert extraction.sequences[0].positions.tolist() == [1, 2]
    _, logprobs = numeric_columns(columns)  # the report's log-prob chart reads it too
    assert logprobs is not None and logprobs.tolist() == pytest.approx([UNIFORM, UNIFORM])


def test_registering_again_replaces_and_the_latest_is_asked_first() -> None:
    register_layout(TOY)
    other = TOY._replace(traces=lambda b, limit, renderer: [])
    register_layout(other)
    assert layout_of(episodes_batch()) is other and batch_traces(episodes_batch()) == []
    assert [known.name for known in batch_model._LAYOUTS].count("toyrl") == 1
    with pytest.raises(RolloutMockError, match="Layout"):
        register_layout({"name": "x"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the adapters' own
def test_the_adapters_register_every_framework_s_layout() -> None:
    names = {known.name for known in batch_model._LAYOUTS}
    assert {"verl", "roll", "areal", "slime", "trl"} <= names
    order = logprob_keys()
    assert order.index("rollout_log_probs") < order.index("infer_logprobs") < order.index("old_log_probs")
    assert [getattr(layout_of_key(k), "name", None) for k in ("rollout_log_probs", "infer_logprobs", "logprobs")] \
        == ["verl", "roll", "areal"]


def test_slime_sample_objects_are_read_without_running_their_code() -> None:
    """slime's ``Sample`` objects (not only their dicts): fields read from the instance state, so
    a property that raises is never run."""

    class Sample:
        def __init__(self, i: int) -> None:
            self.tokens, self.response_length, self.response, self.reward = [1, 2, 3], 1, f"answer {i}", 0.5
            self.prompt = f"question {i}"

        @property
        def status(self) -> str:
            raise AssertionError("a property of the sample ran")

    traces = batch_traces([Sample(0), Sample(1)])
    assert [t.messages[-1]["content"] for t in traces] == ["answer 0", "answer 1"]
    assert layout_of([Sample(0)]) is not None and layout_of([{"input_ids": [1]}]) is None


def test_a_list_of_tensordict_trajectories_is_no_framework_s_own_shape() -> None:
    """Asking whether it is (slime's samples) never calls a TensorDict's ``get``, which may raise."""
    tensordict = pytest.importorskip("tensordict")
    trajectory = tensordict.TensorDict({"input_ids": torch.ones(1, 3, dtype=torch.long)}, batch_size=[1])
    assert layout_of([trajectory]) is None and len(batch_traces([trajectory])) == 1


def test_renderer_is_what_a_reader_is_handed() -> None:
    renderer = Renderer(None)
    assert renderer.chat("hi") == [{"role": "user", "content": "hi", "tokens": None}]
    assert renderer.field("x" * 500).endswith("(+300 chars)") and renderer.content([1, 2]) == "[1 2]"
    assert renderer.chat([{"role": "bot", "content": "yes"}]) == [{"role": "assistant", "content": "yes",
                                                                     "tokens": None}]
