"""Carrying a profile to every Ray worker: :func:`ray_runtime_env`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout_mock.determinism.process import _validate_seed
from rollout_mock.determinism.profiles import (
    DETERMINISTIC_MODE_VAR,
    PROFILE_VAR,
    SEED_VAR,
    SETUP_HOOK,
    get_profile,
)
from rollout_mock.errors import ConfigError

__all__ = ["ray_runtime_env"]


#: Environment variable that switches :func:`apply_from_env` on (ROLL's name and meaning).

def _merge_env_vars(base_env: Mapping[str, Any], wanted: Mapping[str, str]) -> dict[str, Any]:
    merged = dict(base_env)
    for name, value in wanted.items():
        if name in merged and merged[name] != value:
            raise ConfigError(
                f"runtime_env env_vars sets {name}={merged[name]!r} but the determinism profile "
                f"needs {name}={value!r}; remove it from env_vars or choose another profile"
            )
        merged[name] = value
    return merged


def ray_runtime_env(
    base: Mapping[str, Any] | None = None, profile: str = "roll", seed: int | None = None
) -> dict[str, Any]:
    """Return a Ray ``runtime_env`` dict that makes every worker deterministic.

    The profile's variables, ``ROLLOUT_MOCK_DETERMINISM_PROFILE`` and (when ``seed`` is given)
    ``ROLLOUT_MOCK_SEED`` are merged into ``base["env_vars"]``; ``worker_process_setup_hook`` is
    set to :data:`SETUP_HOOK` so that each worker runs :func:`apply_from_env` at start-up.

    Edge cases:

    * ``base`` is never modified: the result is a new plain dict with a new ``env_vars`` dict;
      other values (``pip``, ``working_dir``, ...) are shared with ``base``, not copied. ``base``
      may be a ``ray.runtime_env.RuntimeEnv`` (a dict subclass).
    * A variable already in ``base["env_vars"]`` with the *same* value is fine; with a different
      value it is a ConfigError naming the variable (the profile is not silently weakened).
    * A different ``worker_process_setup_hook`` already in ``base`` is a ConfigError: call
      ``rollout_mock.determinism.apply_from_env()`` from that hook instead.
    * Ray (2.x) honours ``worker_process_setup_hook`` only in the job-level
      ``ray.init(runtime_env=...)``; in an actor's or task's own ``runtime_env`` the env vars
      arrive but the hook is ignored, so call :func:`apply_from_env` in the actor's ``__init__``.

    Ray itself is not imported.
    """
    chosen = get_profile(profile)
    _validate_seed(seed)
    result = dict(base or {})
    wanted = chosen.env | {DETERMINISTIC_MODE_VAR: "1", PROFILE_VAR: chosen.name}
    if seed is not None:
        wanted[SEED_VAR] = str(seed)
    result["env_vars"] = _merge_env_vars(result.get("env_vars") or {}, wanted)
    hook = result.get("worker_process_setup_hook")
    if hook is not None and hook != SETUP_HOOK:
        raise ConfigError(
            f"runtime_env already has worker_process_setup_hook={hook!r}; Ray runs only one "
            f"hook, so call {SETUP_HOOK}() from inside your hook and pass a runtime_env without it"
        )
    result["worker_process_setup_hook"] = SETUP_HOOK
    return result
