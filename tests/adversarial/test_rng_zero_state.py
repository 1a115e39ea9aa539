"""The all-zero Mersenne Twister state (issue 37, round 5 item 8).

Before: a recorded state whose 624 words were all zero (numpy, Python ``random``, torch's CPU
generator) was restored by ``replay_rng``; the trainer's next ``np.random.normal()``,
``random.normalvariate()`` or ``torch.poisson()`` then never returned (its rejection loop draws 0
forever). It is now refused as corrupt before anything is restored. No sampler is run on the
refused state (it would hang): the test checks that nothing changed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock.errors import CorruptStepError
from rollout_mock.wrap.rng import capture_rng, changed, restore_rng


@pytest.fixture(autouse=True)
def keep_global_generators() -> Any:
    saved = capture_rng()
    yield
    restore_rng(saved)


def zero_python(state: dict[str, Any]) -> None:
    version, gauss = state["python"]["version"], state["python"]["gauss"]
    state["python"] = {"version": version, "state": [0] * 624 + [624], "gauss": gauss}


def zero_numpy(state: dict[str, Any]) -> None:
    state["numpy"] = {**state["numpy"], "keys": np.zeros(624, dtype=np.uint32)}


def zero_numpy_dict(state: dict[str, Any]) -> None:
    state["numpy"] = {"bit_generator": "MT19937", "state": {"key": [0] * 624, "pos": 624}, "has_gauss": 0,
                      "gauss": 0.0}


def zero_torch(state: dict[str, Any]) -> None:
    cpu = state["torch"].clone()
    cpu[24:24 + 8 * 624] = 0
    state["torch"] = cpu


def zero_but_low_bits_of_first(state: dict[str, Any]) -> None:
    """Word 0 is ignored but for its top bit: 0x7fffffff in it is still the degenerate state."""
    state["numpy"] = {**state["numpy"], "keys": np.array([0x7FFFFFFF] + [0] * 623, dtype=np.uint32)}


CASES: dict[str, Callable[[dict[str, Any]], None]] = {
    "python": zero_python, "numpy": zero_numpy, "numpy_dict_form": zero_numpy_dict, "torch": zero_torch,
    "numpy_low_bits": zero_but_low_bits_of_first,
}


def _as_python_form(state: dict[str, Any]) -> dict[str, Any]:
    python = state["python"]
    if isinstance(python, tuple):
        state["python"] = {"version": python[0], "state": list(python[1]), "gauss": python[2]}
    return state


@pytest.mark.parametrize("case", sorted(CASES))
def test_all_zero_state_is_refused_and_nothing_restored(case: str) -> None:
    state = capture_rng()
    before = capture_rng()
    if case == "python" and isinstance(state["python"], tuple):
        state = _as_python_form(state)
    CASES[case](state)
    with pytest.raises(CorruptStepError, match="all-zero Mersenne Twister state") as caught:
        restore_rng(state, step=7)
    assert "step 7" in str(caught.value) and "\n" not in str(caught.value)
    assert not changed(before, capture_rng())


def test_a_real_state_with_a_top_bit_only_is_fine() -> None:
    """numpy's own seeding sets word 0 to 0x80000000: valid, restored."""
    state = capture_rng()
    state["numpy"] = {**state["numpy"], "keys": np.array([0x80000000] + [0] * 623, dtype=np.uint32)}
    restore_rng(state)
    assert np.isfinite(np.random.normal())
    random.random()
    torch.rand(1)
