"""Tolerances that are not finite numbers >= 0 (issue 37, round 5 item 7).

Before: ``check_tolerances: {logprobs: {rtol: .inf}}`` was accepted, and a live batch identical
to the recording got DIFFERS (``inf * |0.0|`` is NaN); ``rtol: true`` was taken as 1.0. Every
tolerance (check mode's, the verdict's, ``verify``/``diff``/``bisect``'s flags, a bundle's) is now
a finite number >= 0, or one ConfigError line naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_numbers import run

from rollout_mock.config import load_config
from rollout_mock.errors import ConfigError


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e999", "true", "-1", "10" * 200, "'inf'", "[1]"])
@pytest.mark.parametrize("kind", ["rtol", "atol"])
def test_check_tolerances_refuse_non_finite(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"rollout_mock:\n  enable: true\n  mode: check\n  dump_dir: {tmp_path}\n"
                    f"  check_tolerances: {{logprobs: {{{kind}: {text}}}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "check_tolerances" in str(caught.value) and f"logprobs.{kind}" in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 1000


@pytest.mark.parametrize("value", [0, 0.0, 1e-6, 3, "1e-3"])
def test_finite_tolerances_still_load(tmp_path: Path, value: Any) -> None:
    config = load_config({"enable": True, "mode": "check", "dump_dir": str(tmp_path),
                          "check_tolerances": {"logprobs": {"rtol": value, "atol": value}}})
    assert config.check_tolerances is not None and config.check_tolerances["logprobs"].rtol == float(value)


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e999"])
def test_verdict_and_flags_refuse_non_finite(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError):
        load_config({"enable": True, "mode": "mock", "dump_dir": str(tmp_path),
                     "verdict": {"rtol": {"loss": float(value)}}})
    a = tmp_path / "a.jsonl"
    a.write_text('{"step": 0, "loss": 1.0}\n')
    code, _, err = run("verify", a, a, f"--rtol={value}", capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "finite number >= 0" in err
