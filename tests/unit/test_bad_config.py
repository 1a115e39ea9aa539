"""Every invalid field of the config gives one clear line: field, value, valid choices."""

from __future__ import annotations

import pytest

from rollout_mock import ConfigError, RolloutMockConfig, load_config

BOOL = "valid choices: true, false"

# field -> (bad value, what the line must also say)
BAD: dict[str, tuple[object, str]] = {
    "enable": ("maybe", BOOL),
    "mode": ("record", "valid choices: dump, mock, check"),
    "dump_dir": ("  ", "must not be empty"),
    "storage_options": ("anon", "dictionary"),
    "overwrite": ("sometimes", BOOL),
    "max_steps": (0, "greater than or equal to 1"),
    "dump_steps": ("all", "list"),
    "max_keep": (0, "greater than or equal to 1"),
    "pin_steps": ("first", "list"),
    "keep": ({"last": 0}, "last: Input should be greater than or equal to 1"),
    "background": ("yes please", BOOL),
    "max_pending": (0, "greater than or equal to 1"),
    "prefetch": ([], BOOL),
    "device": ("gpu", "cpu, cuda, cuda:N"),
    "replay_rng": ("sometimes", "bool"),
    "verify_checksum": ("nope", BOOL),
    "trust_pickle": ("if safe", BOOL),
    "hmac_key_env": (5, "string"),
    "name": ("a/b", "without '/'"),
    "ranks": ("some", "valid choices: one, all"),
    "replay_rows": ({"dp_rank": 2, "dp_size": 2}, "must be below dp_size"),
    "replay_keys": ([], "non-empty list"),
    "dump_rank": (-1, "greater than or equal to 0"),
    "fingerprint": ("loud", "valid choices: warn, error, off"),
    "on_disk_full": ("retry", "valid choices: fail, skip"),
    "compression": ("gzip", "valid choices: none, zstd, lz4"),
    "verdict": ("loud", "'warn', 'fail' or 'off'"),
    "watchdog": ({"factor": 0}, "greater than 1"),
    "on_missing_step": ("skip", "valid choices: error, repeat_nearest, record"),
    "subsample": (1.5, "less than or equal to 1"),
    "step_offset": ("ten", "integer"),
    "step_map": ({0: -1}, "dump steps must be >= 0"),
    "match_on": (["step", "data"], "cannot be combined"),
    "on_mismatch": ("ignore", "valid choices: error, warn"),
    "check_serves": ("both", "valid choices: recorded, live"),
    "check_min_match": (1.5, "less than or equal to 1"),
    "check_tolerances": ({"logprobs": {"rtol": -1}}, "greater than or equal to 0"),
    "check_sample_key": ("a..b", "must be a key name or dotted path"),
}


def test_every_field_is_covered() -> None:
    assert set(BAD) == set(RolloutMockConfig.model_fields)


@pytest.mark.parametrize("field", sorted(BAD))
def test_bad_value_gives_one_clear_line(field: str) -> None:
    value, hint = BAD[field]
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {"enable": True, field: value}})
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"rollout_mock.{field}: invalid value {value!r}: "), message
    assert hint in message, message


def test_several_bad_fields_give_one_line_each() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"mode": "replay", "on_disk_full": "ignore", "max_pending": -3})
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert {line.split(":")[0] for line in lines} == {
        "rollout_mock.mode", "rollout_mock.on_disk_full", "rollout_mock.max_pending"
    }


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("dump_dri", "dump_dir"), ("mdoe", "mode"), ("trust_pickles", "trust_pickle"), ("on_disk_ful", "on_disk_full")],
)
def test_unknown_key_names_it_and_suggests(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"rollout_mock": {"enable": True, key: "x"}})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"rollout_mock.{key}: unknown key (value 'x') (did you mean {suggestion!r}?)")
    assert "valid keys: enable, mode, dump_dir" in message


def test_unknown_key_without_close_match() -> None:
    with pytest.raises(ConfigError, match=r"rollout_mock\.zzz: unknown key \(value 1\); valid keys: "):
        load_config({"zzz": 1})


def test_yaml_file_errors_name_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "train.yaml"
    path.write_text("rollout_mock:\n  enable: true\n  mode: replay\n")
    with pytest.raises(ConfigError, match=rf"^{path}: rollout_mock\.mode: invalid value 'replay'"):
        load_config(path)


def test_enum_values_accept_both_spellings() -> None:
    from rollout_mock.config import DiskFullPolicy

    assert load_config({"on_disk_full": "skip"}).on_disk_full is DiskFullPolicy.SKIP
    assert load_config({"on_disk_full": DiskFullPolicy.SKIP}).on_disk_full is DiskFullPolicy.SKIP
