"""Applying a profile: in this process (:func:`apply`), from the environment at a worker's
start-up (:func:`apply_from_env`), and in every Ray worker (:func:`ray_runtime_env`); seeding."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from rollout_mock.determinism.check import SelfCheck, self_check
from rollout_mock.determinism.fingerprint import torch_flags
from rollout_mock.determinism.profiles import (
    _MAX_SEED,
    DETERMINISTIC_MODE_VAR,
    PROFILE_VAR,
    SEED_VAR,
    SETUP_HOOK,
    TF32,
    TF32_VAR,
    get_profile,
)
from rollout_mock.errors import ConfigError, DeterminismError
from rollout_mock.text import logger

__all__ = [
    "ApplyReport", "LateSetting", "apply", "apply_from_env", "ray_runtime_env", "seed_everything",
]


@dataclass(frozen=True)
class LateSetting:
    """A variable that was set in ``os.environ`` but cannot take effect in this process any more."""

    variable: str
    wanted: str
    previous: str | None
    reason: str


@dataclass(frozen=True)
class ApplyReport:
    """What :func:`apply` did, and what it could not do.

    ``env`` holds every profile variable with the value it now has in ``os.environ``; ``changed``
    maps the variables apply() changed to their previous value (``None``: was unset);
    ``torch_flags`` are the torch switches read back after applying; ``too_late`` lists the
    variables whose new value this process will not see (child processes will); ``tf32`` is the
    TF32 choice (``"keep"`` or ``"off"``); ``check`` is the self-check's result when
    ``apply(check=True)`` ran it, else None.
    """

    profile: str
    seed: int | None
    env: dict[str, str]
    changed: dict[str, str | None]
    torch_flags: dict[str, Any]
    too_late: tuple[LateSetting, ...] = ()
    tf32: str = TF32.KEEP.value
    check: SelfCheck | None = None

    @property
    def fully_applied(self) -> bool:
        """True when every setting is in effect in this process."""
        return not self.too_late

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, e.g. for a manifest."""
        return {
            "profile": self.profile,
            "seed": self.seed,
            "env": dict(self.env),
            "changed": dict(self.changed),
            "torch_flags": dict(self.torch_flags),
            "too_late": [asdict(late) for late in self.too_late],
            "tf32": self.tf32,
            "check": None if self.check is None else self.check.to_dict(),
        }


def _nccl_process_group_exists() -> bool:
    """True when torch.distributed is initialised with a backend that uses NCCL."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return "nccl" in str(dist.get_backend()).lower()


def _cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())


#: Modules that copy FLASH_ATTENTION_DETERMINISTIC into a module global when they are imported.
_FLASH_IMPORT_READERS: Final = (
    "verl.models.transformers.qwen2_vl",
    "verl.models.transformers.glm4v",
)


def _late_reason(variable: str, previous: str | None, wanted: str) -> str | None:
    """Why setting ``variable`` from ``previous`` to ``wanted`` cannot take effect now, or None."""
    if previous == wanted:
        return None
    if variable in ("CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE") and _cuda_initialized():
        return (
            "CUDA is already initialised in this process and cuBLAS/cuDNN read this when their "
            "first handle is created; export it before the process starts (Ray: runtime_env "
            "env_vars)"
        )
    if variable.startswith("NCCL_") and _nccl_process_group_exists():
        return (
            "torch.distributed already uses NCCL, which reads this when a communicator is created; "
            "export it before init_process_group (torchrun: in the launch environment)"
        )
    if variable == "PYTHONHASHSEED":
        return "the interpreter reads this once at start-up; only child processes will use it"
    if variable == "FLASH_ATTENTION_DETERMINISTIC":
        loaded = [name for name in _FLASH_IMPORT_READERS if name in sys.modules]
        if loaded:
            return f"already imported modules read it at import time: {', '.join(loaded)}"
    return None


def _find_too_late(env: Mapping[str, str]) -> tuple[LateSetting, ...]:
    found = []
    for variable, wanted in env.items():
        previous = os.environ.get(variable)
        reason = _late_reason(variable, previous, wanted)
        if reason is not None:
            found.append(LateSetting(variable, wanted, previous, reason))
    return tuple(found)


def _validate_seed(seed: int | None) -> None:
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ConfigError(f"determinism seed must be an integer in [0, {_MAX_SEED}], got {seed!r}")


def _set_torch_flags(tf32: TF32) -> None:
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)  # not warn_only: a nondeterministic op must fail loudly
    if tf32 is TF32.OFF:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def seed_everything(seed: int) -> None:
    """Seed ``random``, ``numpy`` and torch (CPU and every CUDA device, lazily if CUDA is off).

    ``seed`` must be in ``[0, 2**32 - 1]`` (numpy's limit); otherwise ConfigError.
    Seeding never initialises CUDA.
    """
    import numpy as np
    import torch

    _validate_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also queues the seed for every CUDA device
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # lazy: does not initialise CUDA


def _late_message(too_late: Sequence[LateSetting]) -> str:
    lines = [
        f"[RolloutMock] {len(too_late)} determinism setting(s) cannot take effect in this process:"
    ]
    for late in too_late:
        lines.append(f"  {late.variable}={late.wanted} (was {late.previous!r}): {late.reason}")
    return "\n".join(lines)


def _wanted_env(profile_env: dict[str, str], tf32: TF32) -> dict[str, str]:
    """The variables a profile and a TF32 choice set together."""
    return profile_env | {setting.name: setting.value for setting in tf32.settings}


def _report_check(result: SelfCheck, strict: bool) -> None:
    """Log the self-check; a disagreement is a WARNING, or a DeterminismError with ``strict``."""
    if result.agreed is not False:
        logger.info("[RolloutMock] %s", result.summary())
        return
    message = (
        f"[RolloutMock] {result.summary()}. A switch did not take: look at the report's too_late, "
        "export CUBLAS_WORKSPACE_CONFIG before the process starts, and make sure nothing calls "
        "torch.use_deterministic_algorithms(False) after apply()"
    )
    if strict:
        raise DeterminismError(message, check=result)
    logger.warning(message)


def apply(
    seed: int | None = None,
    profile: str = "roll",
    *,
    tf32: TF32 | str = TF32.KEEP,
    strict: bool = False,
    check: bool = False,
) -> ApplyReport:
    """Make this process deterministic: profile env vars, torch switches, seeds.

    Sets every variable of ``profile`` in ``os.environ`` (so child processes inherit it), then
    ``cudnn.deterministic=True``, ``cudnn.benchmark=False`` and
    ``torch.use_deterministic_algorithms(True)`` (nondeterministic ops then raise); seeds
    everything when ``seed`` is not None (``None``: leave the random generators alone).

    ``tf32`` is a precision choice, not a determinism switch (:class:`TF32`): ``"keep"`` (default)
    leaves TF32 as it is; ``"off"`` turns it off for matmul and cuDNN, sets float32 matmul
    precision ``"highest"`` and ``NVIDIA_TF32_OVERRIDE=0``.

    Variables the libraries have already read (see :class:`LateSetting`) are still written to
    ``os.environ`` but listed in ``ApplyReport.too_late`` and logged as one WARNING on the
    ``rollout_mock`` logger. With ``strict=True`` such variables raise :class:`DeterminismError`
    instead, before anything is changed. An unknown ``profile`` or ``tf32`` or a bad ``seed``
    raises ConfigError, also before anything is changed. Calling apply() twice is harmless.

    ``check=True`` then runs :func:`~rollout_mock.determinism.self_check` on every visible GPU
    (this starts CUDA, after the variables are set) and stores its result in
    ``ApplyReport.check``: logged at INFO when it agreed or had nothing to run (no GPU), as a
    WARNING when a GPU's two runs disagreed, or, with ``strict=True``, raised as a
    :class:`DeterminismError` (the settings stay applied).
    """
    chosen = get_profile(profile)
    choice = TF32.parse(tf32)
    _validate_seed(seed)
    wanted = _wanted_env(chosen.env, choice)
    too_late = _find_too_late(wanted)
    if too_late and strict:
        raise DeterminismError(_late_message(too_late), too_late=too_late)
    changed = {
        name: os.environ.get(name)
        for name, value in wanted.items()
        if os.environ.get(name) != value
    }
    os.environ.update(wanted)
    _set_torch_flags(choice)
    if seed is not None:
        seed_everything(seed)
    if too_late:
        logger.warning(_late_message(too_late))
    result = self_check() if check else None
    report = ApplyReport(
        chosen.name, seed, wanted, changed, torch_flags(), too_late, choice.value, result
    )
    if result is not None:
        _report_check(result, strict)
    return report


def _seed_from_env() -> int | None:
    raw = os.environ.get(SEED_VAR)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{SEED_VAR} must be an integer, got {raw!r}") from None


def apply_from_env() -> ApplyReport | None:
    """Worker-side :func:`apply`, driven only by environment variables; usable as a Ray setup hook.

    Does nothing and returns None unless ``DETERMINISTIC_MODE`` is exactly ``"1"`` (ROLL's
    switch). Otherwise applies the profile named by ``ROLLOUT_MOCK_DETERMINISM_PROFILE`` (default
    ``"roll"``) with the seed in ``ROLLOUT_MOCK_SEED`` (unset or empty: no seeding) and the TF32
    choice in ``ROLLOUT_MOCK_TF32`` (``keep`` or ``off``; unset or empty: ``keep``). A malformed
    seed, TF32 choice or unknown profile raises ConfigError; in a Ray setup hook that stops the
    worker with the message, which is better than a silently nondeterministic worker.
    """
    if os.environ.get(DETERMINISTIC_MODE_VAR) != "1":
        return None
    profile = os.environ.get(PROFILE_VAR) or "roll"
    tf32 = TF32.parse(os.environ.get(TF32_VAR) or TF32.KEEP.value, source=TF32_VAR)
    report = apply(seed=_seed_from_env(), profile=profile, tf32=tf32)
    logger.info(
        "[RolloutMock] Determinism applied in pid %d: profile=%s, seed=%s, tf32=%s",
        os.getpid(),
        profile,
        report.seed,
        report.tf32,
    )
    return report


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
    base: Mapping[str, Any] | None = None,
    profile: str = "roll",
    seed: int | None = None,
    *,
    tf32: TF32 | str = TF32.KEEP,
) -> dict[str, Any]:
    """Return a Ray ``runtime_env`` dict that makes every worker deterministic.

    The profile's variables, those of the ``tf32`` choice, ``ROLLOUT_MOCK_DETERMINISM_PROFILE``,
    ``ROLLOUT_MOCK_TF32`` and (when ``seed`` is given) ``ROLLOUT_MOCK_SEED`` are merged into
    ``base["env_vars"]``; ``worker_process_setup_hook`` is set to :data:`SETUP_HOOK` so that each
    worker runs :func:`apply_from_env` at start-up.

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
    choice = TF32.parse(tf32)
    _validate_seed(seed)
    result = dict(base or {})
    wanted = _wanted_env(chosen.env, choice)
    wanted |= {DETERMINISTIC_MODE_VAR: "1", PROFILE_VAR: chosen.name, TF32_VAR: choice.value}
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
