"""The by-hand slime wrapper documented in docs/frameworks/slime.md, run as written.

It must record plain data (a dump that replays with the safe loader, no ``trust_pickle``) and
keep evaluation rollouts in ``val`` (the same ``rollout_id`` as a training step must not collide).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
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
    dump._train.close()
    dump._eval.close()
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
    mock._train.close()
    mock._eval.close()
