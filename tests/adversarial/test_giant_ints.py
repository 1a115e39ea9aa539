"""Ints past Python's int-string limit (4,300 digits) in a dump's columns (issue 37, round 4's leftover 2).

Before: ``report`` and ``show`` died with ``ValueError: Exceeds the limit (4300 digits) for integer
string conversion`` on a 20,000-digit int nested in a column's rows or used as a mapping key there
(the trace rows' field summary called ``json.dumps``, then ``repr``); dump mode died with the same
bare ``ValueError`` on such an int in ``meta_info``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_numbers import bounded, make_dump, run

from rollout_mock.errors import UnrecordableBatchError

GIANT = 10**20000


def ids() -> torch.Tensor:
    return torch.ones(2, 3, dtype=torch.long)


CASES: dict[str, Callable[[int], Any]] = {
    "nested_in_rows": lambda s: {"input_ids": ids(), "extra": [[GIANT], [1]]},
    "mapping_key_in_rows": lambda s: {"input_ids": ids(), "extra": [{GIANT: 1}, {1: 2}]},
    "negative_in_dict_rows": lambda s: {"input_ids": ids(), "extra": [{"a": -GIANT}, {"a": 1}]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_and_show_survive_giant_ints(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", CASES[case])
    code, out, err = run("report", dump, "-o", tmp_path / "r.html", capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "r.html").stat().st_size < 5_000_000
    bounded(*run("show", dump, capsys=capsys))
    bounded(*run("diff", dump, dump, capsys=capsys))


def test_dump_mode_names_an_unrecordable_int(tmp_path: Path) -> None:
    with pytest.raises(UnrecordableBatchError, match=r"meta_info\.x: an int of 20001 digits cannot be recorded"):
        make_dump(tmp_path / "d", lambda s: {"input_ids": ids(), "meta_info": {"x": GIANT}}, steps=1)
