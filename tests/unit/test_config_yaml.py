"""YAML config files: alias bombs fail fast, messages stay short, ``${...}`` interpolations."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest
from conftest import cpu_seconds

from rollout_mock import ConfigError, load_config


def _bomb(levels: int, key: str = "dump_dir") -> str:
    """A "billion laughs" document: each level repeats the previous one 9 times."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    lines += ["rollout_mock:", "  enable: true", f"  {key}: *l{levels - 1}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [7, 9])
@pytest.mark.parametrize("key", ["dump_dir", "no_such_key"])
def test_an_alias_bomb_fails_fast_with_a_short_message(tmp_path: Path, levels: int, key: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(levels, key))
    assert path.stat().st_size < 1000
    failures: list[ConfigError] = []

    def load() -> None:
        with pytest.raises(ConfigError) as raised:
            load_config(path)
        failures.append(raised.value)

    assert cpu_seconds(load) < 5  # CPU time: a busy machine does not inflate it
    message = str(failures[0])
    assert len(message) < 400, message[:1000]
    assert "alias" in message and str(path) in message


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("rollout_mock:\n  enable: true\n  dump_steps: &x [1, *x]\n")
    with pytest.raises(ConfigError, match="recursive alias"):
        load_config(path)


def test_ordinary_aliases_still_work(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        "steps: &steps [0, 5, 9]\nbase: &base {enable: true, mode: dump}\n"
        "rollout_mock:\n  <<: *base\n  dump_steps: *steps\n  pin_steps: *steps\n"
    )
    config = load_config(path)
    assert config.enable and config.dump_steps == [0, 5, 9] and config.pin_steps == [0, 5, 9]


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollout_mock.config.loading.MAX_CONFIG_BYTES", 1000)
    path = tmp_path / "big.yaml"
    path.write_text("rollout_mock:\n  enable: true\n" + "# padding\n" * 200)
    with pytest.raises(ConfigError, match="too large"):
        load_config(path)


def test_deep_nesting_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("rollout_mock:\n  dump_steps: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_error_messages_never_embed_unbounded_values(tmp_path: Path) -> None:
    huge = "x" * 1_000_000
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {"enable": True, "dump_dir": [huge], "mode": huge, huge: 1}})
    assert len(str(info.value)) < 2000
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {f"bad_key_{i}": i for i in range(1000)}})
    lines = str(info.value).splitlines()
    assert len(lines) <= 30 and "more problem" in lines[-1], lines[-3:]
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": list(range(1_000_000))})
    assert len(str(info.value)) < 300
    path = tmp_path / "syntax.yaml"
    path.write_text("rollout_mock: {enable: true, dump_dir: '" + "y" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert len(str(info.value)) < 700


# ------------------------------------------------------------------------------ ${...}
INTERPOLATED = """\
output_dir: /runs/exp1
trainer:
  total_steps: 7
rollout_mock:
  enable: true
  mode: mock
  dump_dir: ${output_dir}/dumps
  max_steps: ${trainer.total_steps}
"""


def test_interpolations_in_a_yaml_file_are_resolved_with_omegaconf(tmp_path: Path) -> None:
    pytest.importorskip("omegaconf")
    path = tmp_path / "train.yaml"
    path.write_text(INTERPOLATED)
    config = load_config(path)
    assert config.dump_dir == "/runs/exp1/dumps" and config.max_steps == 7


def test_env_interpolation_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("omegaconf")
    monkeypatch.setenv("ROLLOUT_MOCK_TEST_ROOT", "/scratch/me")
    path = tmp_path / "block.yaml"
    path.write_text("enable: true\ndump_dir: ${oc.env:ROLLOUT_MOCK_TEST_ROOT}/d\n")
    assert load_config(path).dump_dir == "/scratch/me/d"


def test_an_unresolvable_interpolation_names_the_key(tmp_path: Path) -> None:
    pytest.importorskip("omegaconf")
    path = tmp_path / "train.yaml"
    path.write_text("rollout_mock:\n  enable: true\n  dump_dir: ${nowhere}/dumps\n")
    with pytest.raises(ConfigError, match=r"rollout_mock\.dump_dir: cannot resolve '\$\{nowhere\}/dumps'"):
        load_config(path)


def test_interpolations_outside_the_block_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_omegaconf(monkeypatch)
    path = tmp_path / "train.yaml"
    path.write_text("other: ${whatever}\nrollout_mock:\n  enable: true\n  dump_dir: /plain\n")
    assert load_config(path).dump_dir == "/plain"


def _without_omegaconf(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "omegaconf" or name.startswith("omegaconf."):
            raise ImportError(f"No module named {name!r} (simulated)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_without_omegaconf_an_interpolation_is_rejected_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_omegaconf(monkeypatch)
    path = tmp_path / "train.yaml"
    path.write_text(INTERPOLATED)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "rollout_mock.dump_dir" in message and "omegaconf" in message and str(path) in message
    with pytest.raises(ConfigError, match=r"rollout_mock\.dump_dir: .*omegaconf"):
        load_config({"rollout_mock": {"enable": True, "dump_dir": "${oc.env:HOME}/d"}})
