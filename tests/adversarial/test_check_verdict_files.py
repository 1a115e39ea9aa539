"""Check-verdict files that are hostile, and a directory where check mode writes one (issue 37,
round 5 item 14).

Before: ``read_check_verdicts`` raised ``RecursionError`` for a verdict nested 100,000 deep and
``OverflowError`` for ``step: 1e999``, a ``match`` of 400 digits or ``tokens: Infinity``; check mode
with a directory at the verdict path raised a bare ``IsADirectoryError`` out of the training call.
Now a hostile verdict is skipped with one warning line (bounded JSON reader), and the directory is
one :class:`DumpNotWritableError` naming the step, the path and the fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from rollout_mock import MockScheduler
from rollout_mock.errors import DumpNotWritableError
from rollout_mock.wrap.check import CheckVerdict, read_check_verdicts


class Source:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": [global_step, 1]}


def dump_of(path: Path) -> Path:
    with MockScheduler(Source(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as mock:
        mock.get_batch(None, global_step=0)
    return path


def good() -> dict[str, Any]:
    return CheckVerdict(stream="train", step=1, run_step=1, method="get_batch", match=1.0, token_match=None,
                        tokens=0, equal=True, passed=True, served="recorded").to_json()


HOSTILE: dict[str, bytes] = {
    "nested_100000": json.dumps({**good(), "step": 2})[:-1].encode() + b', "keys": ' + b"[" * 100_000
    + b"]" * 100_000 + b"}",
    "step_1e999": json.dumps({**good(), "step": 2}).replace('"step": 2', '"step": 1e999').encode(),
    "match_400_digits": json.dumps({**good(), "step": 2}).replace('"match": 1.0', '"match": ' + "9" * 400).encode(),
    "tokens_infinity": json.dumps({**good(), "step": 2}).replace('"tokens": 0', '"tokens": Infinity').encode(),
    "match_nan_string": json.dumps({**good(), "step": 2, "match": "nan"}).encode(),
    "step_huge_int": json.dumps({**good(), "step": 2}).replace('"step": 2', '"step": ' + "1" * 90).encode(),
    "not_utf8": b'{"format": "\xff"}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_verdict_is_skipped(tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture) -> None:
    dump = dump_of(tmp_path / "d")
    folder = dump / "checks" / "train"
    folder.mkdir(parents=True)
    (folder / "step_000001.json").write_text(json.dumps(good()))
    (folder / "step_000002.json").write_bytes(HOSTILE[case])
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        verdicts = read_check_verdicts(dump)
    assert [v.step for v in verdicts] == [1]


def test_a_directory_at_the_verdict_path(tmp_path: Path) -> None:
    dump = dump_of(tmp_path / "d")
    (dump / "checks" / "train" / "step_000000.json").mkdir(parents=True)
    config = {"enable": True, "mode": "check", "dump_dir": str(dump)}
    with pytest.raises(DumpNotWritableError) as caught, MockScheduler(Source(), config) as mock:
        mock.get_batch(None, global_step=0)
    message = str(caught.value)
    assert "train step 0" in message and "step_000000.json" in message and "\n" not in message
    assert caught.value.step == 0
