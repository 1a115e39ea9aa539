from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rollout_mock import ConfigError, Mode, RolloutMockConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_defaults_match_roll() -> None:
    config = RolloutMockConfig()
    assert config.enable is False
    assert config.mode is Mode.DUMP
    assert config.dump_dir == "./rollout_mock_dumps"


def test_roll_yaml_loads_unchanged() -> None:
    config = load_config(CONFIGS / "roll_dump.yaml")
    assert config.enable and config.mode is Mode.DUMP
    assert config.dump_dir == "./output/rollout_dumps/baseline_v1"
    # ROLL's top-level max_steps feeds the mock-mode pre-flight check.
    assert config.max_steps == 50
    assert load_config(CONFIGS / "roll_mock.yaml").mode is Mode.MOCK


def test_full_example_is_valid_and_documents_every_option() -> None:
    config = load_config(CONFIGS / "rollout_mock_full.yaml")
    text = (CONFIGS / "rollout_mock_full.yaml").read_text()
    for field in RolloutMockConfig.model_fields:
        assert f"  {field}:" in text, field
    assert config == RolloutMockConfig(enable=True)


def test_block_mapping_and_plain_block_and_omegaconf() -> None:
    block = {"enable": True, "mode": "mock", "dump_dir": "/tmp/x"}
    assert load_config({"rollout_mock": block}).mode is Mode.MOCK
    assert load_config(block).dump_dir == "/tmp/x"
    omega = OmegaConf.create({"max_steps": 7, "rollout_mock": block})
    loaded = load_config(omega)
    assert loaded.mode is Mode.MOCK and loaded.max_steps == 7
    assert load_config(OmegaConf.create(block)).enable is True


def test_omegaconf_interpolation_resolves() -> None:
    omega = OmegaConf.create({"root": "/data", "rollout_mock": {"enable": True, "dump_dir": "${root}/dumps"}})
    assert load_config(omega).dump_dir == "/data/dumps"


def test_mode_enum_accepts_strings_and_members() -> None:
    assert Mode("dump") is Mode.DUMP
    assert Mode("MOCK") is Mode.MOCK
    assert Mode.DUMP.records and not Mode.DUMP.replays
    assert Mode.MOCK.replays and not Mode.MOCK.records
    assert load_config({"mode": "Mock"}).mode is Mode.MOCK


def test_unknown_key_names_key_value_and_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {"enable": True, "dumpdir": "./x"}})
    message = str(info.value)
    assert "rollout_mock.dumpdir: unknown key (value './x')" in message
    assert "did you mean 'dump_dir'?" in message
    assert "valid keys: enable, mode, dump_dir" in message


def test_bad_mode_names_value_and_choices() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"enable": True, "mode": "replay"})
    message = str(info.value)
    assert message.startswith("rollout_mock.mode: invalid value 'replay'")
    assert "valid choices: dump, mock" in message


def test_bad_values_one_line_each() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"enable": "maybe", "max_steps": 0, "ranks": "some"})
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("rollout_mock.enable: invalid value 'maybe'") and "true, false" in lines[0]
    assert lines[1].startswith("rollout_mock.max_steps: invalid value 0")
    assert lines[2].startswith("rollout_mock.ranks: invalid value 'some'") and "one, all" in lines[2]


def test_missing_yaml_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout_mock: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(empty)


def test_config_is_frozen_and_replace_validates() -> None:
    config = load_config({"enable": True})
    with pytest.raises(ValueError, match="frozen"):  # pydantic's ValidationError
        config.mode = Mode.MOCK  # type: ignore[misc]
    assert config.replace(mode="mock").mode is Mode.MOCK
    with pytest.raises(ConfigError):
        config.replace(mode="nope")


def test_dataclass_config_object() -> None:
    from dataclasses import dataclass

    @dataclass
    class RollConfig:  # ROLL's dataclass shape
        enable: bool = True
        mode: str = "mock"
        dump_dir: str = "./d"

    @dataclass
    class Pipeline:
        rollout_mock: RollConfig

    assert load_config(RollConfig()).mode is Mode.MOCK
    assert load_config(Pipeline(RollConfig())).dump_dir == "./d"
