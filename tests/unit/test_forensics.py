"""The anomaly probe names the op and module that made a step non-finite (real NaNs, made on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rollout_mock
from rollout_mock.debug.forensics import AnomalyProbe, ExplainSpec, format_explain, install_from_env, read_explain
from rollout_mock.errors import DebugInputError
from rollout_mock.wrap import hooks


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))).squeeze(-1)


@pytest.fixture
def net() -> Net:
    torch.manual_seed(0)
    return Net()


X = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))


def test_log_of_zero_in_the_loss(net: Net) -> None:
    def step() -> None:
        p = torch.sigmoid(net(X)) * torch.tensor([1, 1, 0, 1, 1, 1.0])
        (-torch.log(p).mean()).backward()

    probe = rollout_mock.explain(step, model=net)
    first = probe.first
    assert first is not None and first.kind == "nonfinite" and first.op == "aten.log" and first.phase == "forward"
    assert first.module is None  # the loss code, outside any module
    assert first.inputs[0]["zeros"] == 1 and first.output is not None and first.output["inf"] == 1
    assert first.where is not None and "test_forensics.py" in first.where
    assert probe.report()["verdict"] == "anomaly"


def test_zero_variance_advantage(net: Net) -> None:
    def step() -> None:
        r = torch.full((6,), 0.5)
        adv = (r - r.mean()) / r.std()
        (net(X) * adv).mean().backward()

    probe = rollout_mock.explain(step, model=net, detect_anomaly=True)
    first = probe.first
    assert first is not None and first.op == "aten.div" and first.module is None
    assert first.inputs[1]["max"] == 0.0 and first.inputs[0]["std"] == 0.0  # 0 / 0: both sides of the div
    assert first.output is not None and first.output["nan"] == 6


def test_float16_overflow_in_a_layer_names_the_module(net: Net) -> None:
    half = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).half()
    with torch.no_grad():
        half[0].weight.fill_(300.0)
    wrapper = torch.nn.ModuleDict({"policy": net, "head16": half})

    def step() -> None:
        half(torch.full((2, 4), 100.0, dtype=torch.float16)).float().sum().backward()

    probe = rollout_mock.explain(step, model=wrapper)
    first = probe.first
    assert first is not None and first.op == "aten.addmm" and first.module == "model.head16.0"
    assert first.module_type == "Linear" and first.module_inputs[0]["max"] == 100.0
    assert first.output is not None and first.output["inf"] == 8


def test_without_a_model_modules_are_named_from_their_root(net: Net) -> None:
    with torch.no_grad():
        net.head.weight.fill_(3e38)
    with rollout_mock.anomaly_hooks() as probe:
        (net(X * 100) * 1e10).sum().backward()
    first = probe.first
    assert first is not None and first.module == "Net.head" and first.op == "aten.addmm"


def test_a_clean_step_and_a_threshold_jump(net: Net, tmp_path: Path) -> None:
    probe = rollout_mock.explain(lambda: net(X).sum().backward(), model=net)
    assert probe.first is None and probe.report()["verdict"] == "clean" and probe.ops > 5
    probe = rollout_mock.explain(lambda: (net(X) * 1e6).sum(), model=net, max_abs=1e4)
    assert probe.first is not None and probe.first.kind == "threshold" and probe.first.op == "aten.mul"
    path = probe.write(tmp_path / "r.json")
    report = read_explain(path)
    assert report["first"]["op"] == "aten.mul" and "jumped past the threshold" in format_explain(report)
    (tmp_path / "other.json").write_text(json.dumps({"kind": "x"}))
    with pytest.raises(DebugInputError, match="not an explain report"):
        read_explain(tmp_path / "other.json")


def test_weights_already_broken_are_named(net: Net) -> None:
    with torch.no_grad():
        net.body.weight[0, 0] = float("nan")
    probe = rollout_mock.explain(lambda: net(X).sum(), model=net)
    assert probe.first is not None and probe.first.kind == "nonfinite_param" and probe.first.module == "model.body"


def test_probe_is_not_reentrant(net: Net) -> None:
    probe = AnomalyProbe(net).start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            probe.start()
    finally:
        probe.stop()


def test_the_trigger_starts_at_step_n_and_stops_at_the_next_call(net: Net, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "_STEP_HOOKS", [])
    out = tmp_path / "explain.json"
    trigger = install_from_env({"ROLLOUT_MOCK_EXPLAIN": ExplainSpec(step=1, out=str(out), stop=True).to_env()})
    assert trigger is not None

    class Source:
        def get_batch(self, step: int) -> dict[str, torch.Tensor]:
            return {"mask": torch.tensor([1.0, 0.0]) if step == 1 else torch.ones(2)}

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    with rollout_mock.MockScheduler(Source(), config, methods=["get_batch"]) as scheduler:
        for step in range(3):
            try:
                batch = scheduler.get_batch(step)
            except SystemExit as stop:  # the call of step 2 ends the process once the report is written
                assert stop.code == 0 and step == 2
                break
            torch.log(batch["mask"] * torch.sigmoid(net(X[:2]))).sum()
    report = read_explain(out)
    assert report["step"] == 1 and report["first"]["op"] == "aten.log"
    assert install_from_env({}) is None
    with pytest.raises(DebugInputError, match="expected JSON with step and out"):
        install_from_env({"ROLLOUT_MOCK_EXPLAIN": "12"})


def test_a_backward_origin_carries_the_forward_line(net: Net) -> None:
    def step() -> None:
        x = torch.zeros(3, requires_grad=True)
        torch.sqrt(x).sum().backward()  # d sqrt(x) / dx at 0: inf, made in backward from finite values

    probe = rollout_mock.explain(step, model=net, detect_anomaly=True)
    first = probe.first
    assert first is not None and first.phase == "backward" and first.autograd_node == "SqrtBackward0"
    assert first.forward_trace and "test_forensics.py" in first.forward_trace[-1]
