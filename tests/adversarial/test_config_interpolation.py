"""Interpolation bombs in a config (issue 28): a few hundred bytes of nested ``${...}`` made
``load_config`` run past 30 s (``b: ${a}${a}``, ``c: ${b}${b}``...: the resolved text doubles at
each level). Interpolations are now bounded like YAML aliases (by depth and by resolved size),
checked before OmegaConf resolves anything; the error names the key, the chain and the fix.

Each case runs in a fresh interpreter with a timeout (a bomb that is not refused never returns).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_S
from test_hostile_dumps import REPO

pytest.importorskip("omegaconf")

BLOCK = "rollout_mock: {enable: true, mode: dump, dump_dir: '${%s}'}\n"


def levels(reference: str, count: int = 10, fan: int = 8) -> str:
    """``v0`` ten characters, each ``v{i}`` ``fan`` references to ``v{i-1}`` (``reference`` formats one)."""
    lines = ['v0: "aaaaaaaaaa"']
    lines += [f"v{i}: \"{reference.format(i - 1) * fan}\"" for i in range(1, count)]
    return "\n".join(lines) + "\n" + BLOCK % f"v{count - 1}"


BOMBS: dict[str, tuple[str, str]] = {
    # the audit's case: concatenated references, 8**9 * 10 characters from 419 bytes
    "concatenation": (levels("${{v{}}}"), "expand to more than"),
    "through_oc_select": (levels("${{oc.select:v{}}}"), "expand to more than"),
    # verl's nested defaults: a resolver's default argument is followed like any reference
    "through_nested_oc_select_defaults": (levels("${{oc.select:nothing,${{oc.select:v{},null}}}}"),
                                          "expand to more than"),
    "relative_references": (
        "rollout_mock:\n  enable: true\n  mode: dump\n  x0: aaaaaaaaaa\n"
        + "".join(f"  x{i}: \"{'${.x%d}' % (i - 1) * 8}\"\n" for i in range(1, 10)) + "  dump_dir: '${.x9}'\n",
        "expand to more than"),
    "lists_of_lists": (
        "l0: [1, 2, 3, 4]\n" + "".join(f"l{i}: ['${{l{i - 1}}}', '${{l{i - 1}}}', '${{l{i - 1}}}', '${{l{i - 1}}}']\n"
                                       for i in range(1, 14))
        + "rollout_mock: {enable: true, mode: dump, dump_dir: x, pin_steps: '${l13}'}\n", "expand to more than"),
    "nested_names": (
        "a0: aaaaaaaaaa\n" + "".join(f"n{i}: a{i}\n" for i in range(10))
        + "".join(f"a{i}: \"{'${${n%d}}' % (i - 1) * 8}\"\n" for i in range(1, 10)) + BLOCK % "a9",
        "expand to more than"),
    "chain_of_200": ("".join(f"c{i}: '${{c{i + 1}}}'\n" for i in range(200)) + "c200: d\n" + BLOCK % "c0",
                     "nest deeper than 64 levels"),
    "cycle": ("a: '${b}'\nb: '${a}'\n" + BLOCK % "a", "refers to itself"),
}


def _load(path: Path, *, dictconfig: bool = False) -> str:
    code = textwrap.dedent(f"""
        from rollout_mock.config.loading import load_config
        from rollout_mock.errors import ConfigError
        source = {str(path)!r}
        if {dictconfig!r}:
            import yaml
            from omegaconf import OmegaConf
            source = OmegaConf.create(yaml.safe_load(open(source)))
        try:
            load_config(source)
            print("LOADED")
        except ConfigError as exc:
            print("REFUSED", exc)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"load_config({path.name}) did not return in 60 s: the bomb was resolved") from None
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_interpolation_bombs_are_refused_naming_the_key(tmp_path: Path, case: str) -> None:
    text, why = BOMBS[case]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert len(text) < 4000
    out = _load(path)
    assert out.startswith("REFUSED") and why in out, out
    assert "rollout_mock." in out and ("write the value out" in out.lower()), out
    assert len(out) < 1000


def test_a_dictconfig_is_checked_before_omegaconf_resolves_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BOMBS["concatenation"][0])
    out = _load(path, dictconfig=True)
    assert out.startswith("REFUSED") and "expand to more than" in out, out


def test_ordinary_interpolations_still_resolve(tmp_path: Path) -> None:
    from rollout_mock.config.loading import load_config

    path = tmp_path / "config.yaml"
    path.write_text("exp: run1\nroot: /tmp\nwhich: exp\nsub: {name: x}\nrollout_mock:\n  enable: true\n  mode: dump\n"
                    "  dump_dir: '${root}/${${which}}/${sub.name}'\n  max_keep: 3\n  pin_steps: ['${..max_keep}']\n")
    config = load_config(path)
    assert str(config.dump_dir) == "/tmp/run1/x" and config.pin_steps == [3]


def test_verls_own_unresolved_default_config_loads(tmp_path: Path) -> None:
    """Issue 35 item 7: verl's generated ppo_trainer config holds nested defaults such as
    ``${oc.select:a,${oc.select:b,null}}``; load_config took them for a name made by a resolver."""
    verl_config = pytest.importorskip("verl.trainer.config")
    import yaml

    source = Path(verl_config.__file__).parent / "_generated_ppo_trainer.yaml"
    text = source.read_text()
    assert "${oc.select:actor_rollout_ref.actor.fsdp_config.qat,${oc.select:" in text
    data = yaml.safe_load(text)
    data["rollout_mock"] = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d"),
                            "name": "${trainer.project_name}"}
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(data))
    assert _load(path) == "LOADED\n"
    assert _load(path, dictconfig=True) == "LOADED\n"


def test_a_name_made_by_a_resolver_is_shown_whole(tmp_path: Path) -> None:
    key = "some.rather_long.path.to.a.value.that_is_longer_than_sixty_characters_in_all"
    path = tmp_path / "config.yaml"
    path.write_text(f"x: '${{oc.select:${{oc.env:HOME}}.{key}}}'\n" + BLOCK % "x")
    out = _load(path)
    assert out.startswith("REFUSED") and "made by another resolver" in out, out
    assert f"${{oc.select:${{oc.env:HOME}}.{key}}}" in out, out
