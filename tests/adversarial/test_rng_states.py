"""Recorded random number states (issue 28, "one validated RNG restore").

With ``replay_rng: true`` mock mode restores the generator states a dump recorded. Before the fix a
numpy state with ``pos=10**8`` was handed to ``np.random.set_state`` unchecked and the replaying
process died of SIGSEGV at its next ``np.random`` draw; malformed states raised bare
``ValueError``/``OverflowError``/``RuntimeError`` from numpy, ``random`` or torch, some after part of
the state was already restored. Now every field is checked against its generator's layout first,
and anything else is a :class:`CorruptStepError` naming the step and the field, raised before the
batch is served, with no generator changed.
"""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hostile_dumps import REPO, TIMEOUT

from rollout_mock import MockScheduler
from rollout_mock.errors import CorruptStepError
from rollout_mock.wrap import rng
from rollout_mock.wrap.rng import capture_rng, changed, restore_rng


@pytest.fixture(autouse=True)
def keep_global_generators() -> Any:
    saved = capture_rng()
    yield
    restore_rng(saved)


def _numpy_dict(pos: int) -> dict[str, Any]:
    return {"bit_generator": "MT19937", "state": {"key": np.arange(624, dtype=np.uint32), "pos": pos},
            "has_gauss": 0, "gauss": 0.0}


#: name -> (edit of a real captured state, the field the error must name)
MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "numpy_pos_1e8": (lambda s: s["numpy"].update(pos=10**8), "numpy.pos"),
    "numpy_pos_negative": (lambda s: s["numpy"].update(pos=-1), "numpy.pos"),
    "numpy_key_2_32": (lambda s: s["numpy"]["keys"].__setitem__(5, 2**32), "numpy.keys[5]"),
    "numpy_key_negative": (lambda s: s["numpy"]["keys"].__setitem__(0, -1), "numpy.keys[0]"),
    "numpy_keys_623": (lambda s: s["numpy"]["keys"].pop(), "numpy.keys"),
    "numpy_keys_str": (lambda s: s["numpy"].update(keys="x" * 624), "numpy.keys"),
    "numpy_name": (lambda s: s["numpy"].update(name="PCG64"), "numpy.name"),
    "numpy_has_gauss_2": (lambda s: s["numpy"].update(has_gauss=2), "numpy.has_gauss"),
    "numpy_cached_nan": (lambda s: s["numpy"].update(cached=float("nan")), "numpy.cached"),
    "numpy_cached_huge_int": (lambda s: s["numpy"].update(cached=10**400), "numpy.cached"),
    "numpy_missing_key": (lambda s: s["numpy"].pop("pos"), "numpy"),
    "numpy_dict_form_pos": (lambda s: s.update(numpy=_numpy_dict(10**8)), "numpy.state.pos"),
    "python_state_10": (lambda s: s["python"].update(state=s["python"]["state"][:10]), "python.state"),
    "python_index_625": (lambda s: s["python"]["state"].__setitem__(624, 625), "python.state[624]"),
    "python_word_2_64": (lambda s: s["python"]["state"].__setitem__(3, 2**64), "python.state[3]"),
    "python_word_float": (lambda s: s["python"]["state"].__setitem__(3, 1.5), "python.state[3]"),
    "python_version_2": (lambda s: s["python"].update(version=2), "python.version"),
    "python_gauss_str": (lambda s: s["python"].update(gauss="x"), "python.gauss"),
    "python_gauss_inf": (lambda s: s["python"].update(gauss=float("inf")), "python.gauss"),
    "torch_size_10": (lambda s: s.update(torch=torch.zeros(10, dtype=torch.uint8)), "torch"),
    "torch_int64": (lambda s: s.update(torch=s["torch"].long()), "torch"),
    "torch_2d": (lambda s: s.update(torch=s["torch"].reshape(2, -1)), "torch"),
    "torch_zeros": (lambda s: s.update(torch=torch.zeros_like(s["torch"])), "torch"),  # invalid mt19937 state
    "torch_list": (lambda s: s.update(torch=[0] * 5056), "torch"),
    "cuda_float": (lambda s: s.update(cuda=[torch.zeros(16)]), "cuda[0]"),
    "cuda_str": (lambda s: s.update(cuda="x"), "cuda"),
    "cuda_huge": (lambda s: s.update(cuda=[torch.zeros(1 << 20, dtype=torch.uint8)]), "cuda[0]"),
    "unknown_part": (lambda s: s.update(mps=b"x"), "mps"),
    "not_a_mapping": (lambda s: s.clear(), "format"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_states_are_refused_before_anything_is_restored(case: str) -> None:
    edit, field = MALFORMED[case]
    state = copy.deepcopy(capture_rng())
    random.random(), np.random.rand(), torch.rand(1)  # noqa: B018 - move every generator off the state
    edit(state)
    before = capture_rng()
    with pytest.raises(CorruptStepError, match=r"step 4 of train/rng: .*random number state is corrupt") as info:
        restore_rng(state, step=4, where="train/rng")
    assert f": {field} " in str(info.value) or f": {field}" in str(info.value), info.value
    assert info.value.step == 4
    assert not changed(before, capture_rng())  # all or nothing: no generator was touched


def test_valid_states_in_both_numpy_forms_are_restored() -> None:
    state = capture_rng()
    expected = np.random.rand(3)
    restore_rng(state)
    assert np.array_equal(np.random.rand(3), expected)
    legacy = np.random.get_state(legacy=False)
    drawn = np.random.rand(2)
    restore_rng({"format": rng.RNG_FORMAT, "numpy": legacy})
    assert np.array_equal(np.random.rand(2), drawn)


def test_a_cuda_state_of_another_device_count_is_checked_and_left_alone() -> None:
    state = capture_rng()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 3
    restore_rng(state)  # no error where CUDA is absent or has another device count (documented)


def test_pos_1e8_in_a_dump_no_longer_kills_the_replaying_process(tmp_path: Path) -> None:
    """The recorded numpy state of step 1 is forged with ``pos=10**8``: the replaying process used
    to die of SIGSEGV at its next ``np.random`` draw; now mock mode raises before serving step 1."""
    code = textwrap.dedent(f"""
        import numpy as np, torch
        from rollout_mock import MockScheduler
        from rollout_mock.wrap import rng

        class Sampling:
            def get_batch(self, global_step):
                return {{"x": torch.rand(3), "n": float(np.random.rand())}}

        config = {{"enable": True, "dump_dir": {str(tmp_path / "d")!r}, "replay_rng": True, "background": False}}
        real = rng.capture_rng
        def forged():
            state = real()
            state["numpy"]["pos"] = 10**8
            return state
        with MockScheduler(Sampling(), {{**config, "mode": "dump"}}) as dump:
            dump.get_batch(global_step=0)
            rng.capture_rng = forged
            dump.get_batch(global_step=1)
            rng.capture_rng = real
        mock = MockScheduler(None, {{**config, "mode": "mock"}}, spec=Sampling)
        mock.get_batch(global_step=0)
        try:
            mock.get_batch(global_step=1)
        except Exception as exc:
            print("REFUSED", type(exc).__name__, exc)
        print("DRAW", np.random.rand())
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "REFUSED CorruptStepError" in done.stdout and "step 1 of train/rng" in done.stdout, done.stdout
    assert "numpy.pos is 100000000, outside [0, 624]" in done.stdout
    assert "DRAW" in done.stdout


def test_mock_mode_raises_before_serving_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Sampling:
        def get_batch(self, global_step: int) -> dict[str, Any]:
            return {"x": torch.rand(3), "p": random.random()}

    config = {"enable": True, "dump_dir": str(tmp_path / "d"), "replay_rng": True, "background": False}
    real = rng.capture_rng

    def forged() -> dict[str, Any]:
        state = real()
        state["python"]["state"] = state["python"]["state"][:100]
        return state

    with MockScheduler(Sampling(), {**config, "mode": "dump"}) as dump:
        monkeypatch.setattr(rng, "capture_rng", forged)
        dump.get_batch(global_step=0)
    monkeypatch.setattr(rng, "capture_rng", real)
    served = []
    with MockScheduler(None, {**config, "mode": "mock"}, spec=Sampling) as mock:
        with pytest.raises(CorruptStepError, match=r"step 0 of train/rng: .*python.state holds 100 values"):
            served.append(mock.get_batch(global_step=0))
    assert served == []
