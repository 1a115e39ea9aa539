"""verl's and tensordict's real classes round-trip data-only and bit for bit (issue 23).

Every case of :mod:`real_class_cases` is dumped by a wrapped scheduler; a fresh interpreter
replays the dump with the safe loader (mock mode, no trust_pickle), compares each batch with a
freshly built one (class, dtypes, values, keys, meta_info, lock/consolidation state, ragged
dimension, numpy scalar types) and runs the framework's own methods on both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.protocol")
pytest.importorskip("tensordict")
pytestmark = pytest.mark.verl

sys.path.insert(0, str(Path(__file__).parent))
import real_class_cases as cases
from conftest import HANG_S

from rollout_mock import MockScheduler
from rollout_mock.codec import open_step


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dump = tmp_path_factory.mktemp("real_classes")
    batches = {step: build() for step, build in enumerate(cases.CASES.values())}
    dump_errors: dict[str, str] = {}
    config = {"enable": True, "mode": "dump", "dump_dir": str(dump)}
    with MockScheduler(cases.Returns(batches), config) as mock:
        for step, name in enumerate(cases.CASES):
            try:
                assert mock.get_batch(None, step) is batches[step]
            except Exception as exc:  # noqa: BLE001 - reported by that case's test
                dump_errors[name] = f"dump mode: {type(exc).__name__}: {exc}"
    out = dump / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(cases.__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, cases.__file__, str(dump), str(out)], check=False, env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"dump": dump, "dump_errors": dump_errors, "results": json.loads(out.read_text())}


@pytest.mark.parametrize("name", list(cases.CASES))
def test_case_replays_bit_for_bit(replayed: dict[str, Any], name: str) -> None:
    error = replayed["dump_errors"].get(name)
    assert error is None, error
    assert replayed["results"][name] == "ok", replayed["results"][name]


def test_there_are_about_a_hundred_cases() -> None:
    assert len(cases.CASES) >= 100


def _tags(node: Any, found: set[str]) -> set[str]:
    if type(node) is list:
        for x in node:
            _tags(x, found)
    elif type(node) is dict:
        if "$" in node:
            found.add(node["$"])
        for x in node.values():
            _tags(x, found)
    return found


def test_dumps_are_data_only_and_versioned(replayed: dict[str, Any]) -> None:
    """No step holds an opaque pickle; steps using the class tags say header version 4."""
    steps = sorted((replayed["dump"] / "train").glob("step_*.pkl"))
    assert len(steps) == len(cases.CASES) - len(replayed["dump_errors"])
    versions = set()
    for path in steps:
        view = open_step(path)
        layout = view._layout
        root = layout.root
        assert "pickle" not in _tags(root, set()), path
        head = path.read_bytes().split(b'"format":"rollout_mock.step","version":', 1)[1]
        versions.add(int(head.split(b",", 1)[0]))
    assert 4 in versions


def test_failure_is_detected() -> None:
    """The comparison can fail: a lost lock, a lost numpy scalar type, a wrong ragged dimension."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    with pytest.raises(AssertionError, match="locked"):
        cases.same(TensorDict({"a": torch.zeros(2)}, [2]).lock_(), TensorDict({"a": torch.zeros(2)}, [2]))
    with pytest.raises(AssertionError, match="str_"):
        cases.same(np.str_("a"), "a")
    a = cases.CASES["njt-ragged2-equal-verl"]()
    b = torch.nested.nested_tensor(list(a.unbind()), layout=torch.jagged)
    with pytest.raises(AssertionError, match="ragged"):
        cases.same(a, b)


def test_strided_nested_codec() -> None:
    """Strided nested tensors round-trip through the codec, safe loader, data only."""
    import torch

    from rollout_mock.codec import BytesSource, decode, encode_bytes

    for build in ("nested-strided-2d", "nested-strided-3d", "nested-strided-in-dict"):
        recorded = cases.CASES[build]()
        cases.same(recorded, decode(BytesSource(encode_bytes(recorded), build), trusted=False))
    nested = cases.CASES["nested-strided-2d"]()
    assert nested.layout is torch.strided
