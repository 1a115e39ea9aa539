"""The by-hand slime wrapper documented in docs/frameworks/slime.md, run as written.

It must record plain data (a dump that replays with the safe loader, no ``trust_pickle``) and
keep evaluation rollouts in ``val`` (the same ``rollout_id`` as a training step must not collide).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import HANG_S
from test_frameworks_slime import args, slime_pkg  # noqa: F401  (fixture; pytest puts this directory on sys.path)

from rollout_mock import open_dump

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks" / "slime.md"


def load_wrapper(tmp_path: Path, mode: str) -> types.ModuleType:
    text = DOC.read_text(encoding="utf-8")
    code = re.search(r"<!-- slime-by-hand -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert code is not None, "the by-hand example is missing from docs/frameworks/slime.md"
    (tmp_path / "rollout_mock.yaml").write_text(
        f"rollout_mock:\n  enable: true\n  mode: {mode}\n  dump_dir: {tmp_path / 'd'}\n")
    module = types.ModuleType(f"my_rollout_{mode}")
    source = code.group(1).replace('"rollout_mock.yaml"', repr(str(tmp_path / "rollout_mock.yaml")))
    exec(compile(source, str(DOC), "exec"), module.__dict__)  # noqa: S102 - the documented example itself
    return module


def test_documented_wrapper_records_plain_data_and_separates_eval(
    slime_pkg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn

    dump = load_wrapper(tmp_path, "dump")
    recorded = [call_rollout_fn(dump.generate_rollout, args(), i, None, evaluation=False) for i in range(2)]
    evaluated = call_rollout_fn(dump.generate_rollout, args(), 1, None, evaluation=True)  # same id as train 1
    assert isinstance(recorded[0], RolloutFnTrainOutput) and isinstance(evaluated, RolloutFnEvalOutput)
    for wrapper in dump._wrappers.values():
        wrapper.close()
    reader = open_dump(tmp_path / "d")
    assert {s.key: reader.steps(s) for s in reader.streams()} == {"train": [0, 1], "val": [1]}

    slime_pkg.CALLS.clear()
    del sys.modules["slime.rollout.sglang_rollout"]  # mock mode must not even import it
    mock = load_wrapper(tmp_path, "mock")  # default config: the safe (data-only) loader
    for i in range(2):
        out = call_rollout_fn(mock.generate_rollout, args(), i, None, evaluation=False)
        assert [[s.to_dict() for s in g] for g in out.samples] == [[s.to_dict() for s in g] for g in recorded[i].samples]
    ev = call_rollout_fn(mock.generate_rollout, args(), 1, None, evaluation=True)
    assert [s.to_dict() for s in ev.data["eval_ds"]["samples"]] == [s.to_dict() for s in evaluated.data["eval_ds"]["samples"]]
    assert "slime.rollout.sglang_rollout" not in sys.modules
    for wrapper in mock._wrappers.values():
        wrapper.close()


# ------------------------------------------------------------------------------ issue 35
RUN = Path(__file__).with_name("slime_startup_run.py")
REPO = Path(__file__).resolve().parents[2]


def _startup(tmp_path: Path, pkg: Path, name: str, mode: str, prompts: Path, which: str, seed: int) -> dict[str, Any]:
    """One slime run from its start-up, in its own process with its own hash seed."""
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, PYTHONHASHSEED=str(seed),
               PYTHONPATH=os.pathsep.join([str(pkg), str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("ROLLOUT_MOCK_MODE", None)
    proc = subprocess.run([sys.executable, str(RUN), str(out), mode, str(tmp_path / f"dump-{which}"), str(prompts),
                           str(tmp_path / f"save-{name}"), which], capture_output=True, text=True, timeout=HANG_S,
                          env=env, check=False)
    assert out.exists(), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.parametrize("which", ["adapter", "by-hand"])
def test_an_identical_rerun_of_slimes_start_up_replays_and_another_prompt_file_is_refused(
    slime_pkg: Any, tmp_path: Path, which: str  # noqa: F811
) -> None:
    """Issue 35 items 4 and 6: the by-hand recipe compared ``args`` field by field, so slime's
    random ``sglang_router_port``, its ``wandb_run_id`` and the ``--save`` path refused an
    identical rerun; and the adapter's request did not see another ``--prompt-data`` file of the
    same size."""
    pkg = Path(sys.modules["slime"].__file__).parents[1]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"question {i}"}) + "\n" for i in range(8)))
    other = tmp_path / "elsewhere" / "prompts.jsonl"  # the same file on another machine
    other.parent.mkdir()
    other.write_bytes(prompts.read_bytes())
    same_size = tmp_path / "same_size.jsonl"
    same_size.write_text("".join(json.dumps({"input": f"question {7 - i}"}) + "\n" for i in range(8)))
    assert same_size.stat().st_size == prompts.stat().st_size

    dumped = _startup(tmp_path, pkg, "dump", "dump", prompts, which, seed=1)
    assert "error" not in dumped, dumped
    replayed = _startup(tmp_path, pkg, "mock", "mock", other, which, seed=2)
    assert "error" not in replayed, replayed
    assert replayed["samples"] == dumped["samples"] and replayed["position"] == dumped["position"]
    refused = _startup(tmp_path, pkg, "changed", "mock", same_size, which, seed=3)
    assert refused.get("error") == "RolloutSettingsMismatchError", refused
    assert "  prompt_data.sha256: " in refused["message"] and "prompt_data.size" not in refused["message"]
