"""The adapters' registrations (scheduler hooks, batch types, step-argument names) are made
whatever the user imports, and cheaply: each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_S

#: A scheduler that carries ROLL's RolloutMockMixin state with its own mock on (as ROLL's
#: schedulers do when the same `rollout_mock:` block is in their config).
ROLL_LIKE = """
import sys
class MockConfig:
    enable = True
class Scheduler:
    def __init__(self):
        self.mock_config = MockConfig()
    def _maybe_dump_batch(self, *args): raise AssertionError("ROLL's own mock wrote the batch")
    def _should_load_mock(self, *args): return False
    def get_batch(self, data, global_step, batch_size):
        return {"x": [global_step] * batch_size}
real = Scheduler()
"""


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "dump")], capture_output=True, text=True,
                          timeout=HANG_S, cwd=tmp_path)


@pytest.mark.parametrize("import_line", [
    "from rollout_mock import MockScheduler",
    "from rollout_mock.wrap.scheduler import MockScheduler",
    "from rollout_mock.wrap import MockScheduler",
])
def test_the_roll_hook_is_active_whatever_the_user_imports(tmp_path: Path, import_line: str) -> None:
    proc = _run(f"""
{import_line}
{ROLL_LIKE}
with MockScheduler(real, {{"enable": True, "mode": "dump", "dump_dir": sys.argv[1]}}) as mock:
    mock.get_batch(None, 0, 2)
assert real.mock_config is None, "ROLL's own rollout mock is still on"
print("ok")
""", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_batch_types_and_step_names_are_registered_by_any_import(tmp_path: Path) -> None:
    proc = _run("""
from rollout_mock.batch import batch_type_of, count_samples, step_names
class Proto:  # DataProto-like: the adapters' type, found from the instance state
    def __init__(self):
        self.batch, self.non_tensor_batch, self.meta_info = None, {"uid": ["a", "b", "c"]}, {"global_steps": 4}
assert batch_type_of(Proto()).name == "dataproto" and count_samples(Proto()) == 3
assert step_names() == ("global_step", "global_steps", "rollout_id"), step_names()
print("ok")
""", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_layouts_are_registered_by_any_import(tmp_path: Path) -> None:
    """Traces, the log-prob check and the report read every framework's shapes whatever the user
    imported: the adapters' layouts (rollout_mock.batch.Layout) are registered by the root package."""
    proc = _run("""
from rollout_mock.compare.traces import batch_traces
from rollout_mock.debug.sequences import extract_sequences
import torch
record = {"format": "rollout_mock.slime", "samples": [
    {"tokens": [1, 2, 3], "response_length": 1, "response": "yes", "rollout_log_probs": [-0.5]}]}
assert [m["content"] for m in batch_traces(record)[0].messages] == ["yes"]
assert extract_sequences(record).layout == "slime"
columns = {"input_ids": torch.ones(2, 4, dtype=torch.long), "infer_logprobs": torch.zeros(2, 3)}
assert extract_sequences(columns).layout == "roll"
print("ok")
""", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_importing_rollout_mock_stays_cheap(tmp_path: Path) -> None:
    """The registrations import no framework, torch or numpy (nor pydantic: the configuration)."""
    proc = _run("""
import sys
import rollout_mock, rollout_mock.batch, rollout_mock.adapters
heavy = sorted(m for m in ("torch", "numpy", "pydantic", "tensordict", "verl", "roll", "ray", "slime", "areal")
               if m in sys.modules)
print(heavy)
""", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]
