"""Deterministic execution: environment profiles, torch switches, seeding and fingerprints.

Four jobs, one per section below:

* **Profiles** name the environment variables that make CUDA libraries deterministic. ``"roll"``
  is exactly the four ``system_envs`` of ROLL's rollout-mock guide; ``"strict"`` adds the NCCL,
  flash-attention, TF32 and hash-seed switches that ``"roll"`` leaves to chance.
* :func:`apply` puts a profile into ``os.environ`` of *this* process, turns on torch's
  deterministic mode, turns TF32 off and seeds ``random``/``numpy``/``torch``. It never pretends:
  variables that the libraries already read (cuBLAS after CUDA started, NCCL after a process group
  exists, ``PYTHONHASHSEED`` after the interpreter started) are listed in
  :attr:`ApplyReport.too_late`, logged as a warning, or raised with ``strict=True``.
* :func:`apply_from_env` is the worker-side entry point (Ray's ``worker_process_setup_hook``) and
  :func:`ray_runtime_env` builds the ``runtime_env`` that carries a profile to every Ray worker.
* :func:`fingerprint` describes the software, hardware and switches that decide the numerics of a
  run; :func:`compare_fingerprints` and :func:`format_differences` show what changed between the
  run that recorded a dump and the run that replays it.

Nothing here runs at import time: unlike ROLL, where ``DETERMINISTIC_MODE`` only works if it was
exported before ``import roll``, every effect happens when a function is called.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Final

from rollout_mock.errors import ConfigError, RolloutMockError

logger = logging.getLogger("rollout_mock")

#: Environment variable that switches :func:`apply_from_env` on (ROLL's name and meaning).
DETERMINISTIC_MODE_VAR: Final = "DETERMINISTIC_MODE"
#: Environment variable holding the seed that :func:`apply_from_env` applies (an integer).
SEED_VAR: Final = "ROLLOUT_MOCK_SEED"
#: Environment variable naming the profile that :func:`apply_from_env` applies (default ``roll``).
PROFILE_VAR: Final = "ROLLOUT_MOCK_DETERMINISM_PROFILE"
#: Module path of :func:`apply_from_env`, as Ray's ``worker_process_setup_hook`` wants it.
SETUP_HOOK: Final = "rollout_mock.determinism.apply_from_env"
#: Version of the :func:`fingerprint` layout; bump it when a field changes meaning.
FINGERPRINT_VERSION: Final = 1

_MAX_SEED: Final = 2**32 - 1  # numpy.random.seed accepts 0 .. 2**32 - 1


class DeterminismError(RolloutMockError):
    """``apply(strict=True)`` found settings that can no longer take effect in this process.

    ``too_late`` holds one :class:`LateSetting` per such variable. Nothing was changed.
    """

    def __init__(self, message: str, *, too_late: Sequence[LateSetting]) -> None:
        super().__init__(message)
        self.too_late = tuple(too_late)


# --------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvSetting:
    """One environment variable of a profile, the value it gets and why."""

    name: str
    value: str
    reason: str


@dataclass(frozen=True)
class Profile:
    """A named set of environment variables for deterministic execution."""

    name: str
    description: str
    settings: tuple[EnvSetting, ...]

    @property
    def env(self) -> dict[str, str]:
        """The variables as a new ``{name: value}`` dict (safe to modify)."""
        return {s.name: s.value for s in self.settings}


_ROLL_SETTINGS: Final = (
    EnvSetting(
        "NCCL_ALGO",
        "Ring",
        "NCCL otherwise picks Tree/NVLS by message size, changing the reduction order",
    ),
    EnvSetting(
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        "0",
        "Transformer Engine must not pick its atomics-based fused attention",
    ),
    EnvSetting(
        "CUBLAS_WORKSPACE_CONFIG",
        ":4096:8",
        "cuBLAS is only deterministic with a fixed workspace (torch requires it)",
    ),
    EnvSetting(
        DETERMINISTIC_MODE_VAR,
        "1",
        "ROLL and apply_from_env() switch torch's deterministic mode on from it",
    ),
)

_STRICT_EXTRA: Final = (
    EnvSetting(
        "NCCL_PROTO",
        "Simple",
        "NCCL picks LL/LL128 by message size; their chunking changes reduction order",
    ),
    EnvSetting(
        "NCCL_NVLS_ENABLE", "0", "NVLink SHARP reduces inside the NVSwitch, outside NCCL's ordering"
    ),
    EnvSetting(
        "NCCL_COLLNET_ENABLE",
        "0",
        "CollNet/SHARP reduces inside network switches, outside NCCL's ordering",
    ),
    EnvSetting(
        "FLASH_ATTENTION_DETERMINISTIC",
        "1",
        "transformers/verl then call flash-attn's deterministic backward",
    ),
    EnvSetting(
        "NVIDIA_TF32_OVERRIDE", "0", "forces TF32 off in cuBLAS/cuDNN even if a library turns it on"
    ),
    EnvSetting(
        "PYTHONHASHSEED",
        "0",
        "fixes str hashing, hence the iteration order of sets of str, in child processes",
    ),
)

#: The built-in profiles by name (read-only).
PROFILES: Final[Mapping[str, Profile]] = MappingProxyType(
    {
        "roll": Profile(
            "roll", "ROLL's system_envs for deterministic runs, unchanged", _ROLL_SETTINGS
        ),
        "strict": Profile(
            "strict",
            "roll plus NCCL protocol/NVLS/CollNet, flash-attn, TF32 and hash seed",
            _ROLL_SETTINGS + _STRICT_EXTRA,
        ),
    }
)

#: Every variable any profile sets, plus overrides that change numerics behind torch's back.
FINGERPRINT_ENV_VARS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(
        [s.name for p in PROFILES.values() for s in p.settings]
        + ["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"]
    )
)


def get_profile(name: str) -> Profile:
    """Return the built-in profile called ``name``.

    Raises :class:`~rollout_mock.errors.ConfigError` naming the valid profiles when ``name`` is
    unknown (the lookup is case-sensitive).
    """
    try:
        return PROFILES[name]
    except KeyError:
        valid = ", ".join(sorted(PROFILES))
        raise ConfigError(
            f"unknown determinism profile {name!r}; valid profiles: {valid}"
        ) from None


# --------------------------------------------------------------------------------------------
# apply()
# --------------------------------------------------------------------------------------------


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
    variables whose new value this process will not see (child processes will).
    """

    profile: str
    seed: int | None
    env: dict[str, str]
    changed: dict[str, str | None]
    torch_flags: dict[str, Any]
    too_late: tuple[LateSetting, ...] = ()

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


def _set_torch_flags() -> None:
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(
        True
    )  # not warn_only: a nondeterministic op must fail loudly
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


def apply(seed: int | None = None, profile: str = "roll", *, strict: bool = False) -> ApplyReport:
    """Make this process deterministic: profile env vars, torch switches, seeds.

    Sets every variable of ``profile`` in ``os.environ`` (so child processes inherit it), then
    ``cudnn.deterministic=True``, ``cudnn.benchmark=False``,
    ``torch.use_deterministic_algorithms(True)`` (nondeterministic ops then raise), TF32 off for
    matmul and cuDNN and float32 matmul precision ``"highest"``; seeds everything when ``seed`` is
    not None (``None``: leave the random generators alone).

    Variables the libraries have already read (see :class:`LateSetting`) are still written to
    ``os.environ`` but listed in ``ApplyReport.too_late`` and logged as one WARNING on the
    ``rollout_mock`` logger. With ``strict=True`` such variables raise :class:`DeterminismError`
    instead, before anything is changed. An unknown ``profile`` or a bad ``seed`` raises
    ConfigError, also before anything is changed. Calling apply() twice is harmless.
    """
    chosen = get_profile(profile)
    _validate_seed(seed)
    wanted = chosen.env
    too_late = _find_too_late(wanted)
    if too_late and strict:
        raise DeterminismError(_late_message(too_late), too_late=too_late)
    changed = {
        name: os.environ.get(name)
        for name, value in wanted.items()
        if os.environ.get(name) != value
    }
    os.environ.update(wanted)
    _set_torch_flags()
    if seed is not None:
        seed_everything(seed)
    if too_late:
        logger.warning(_late_message(too_late))
    return ApplyReport(chosen.name, seed, wanted, changed, torch_flags(), too_late)


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
    ``"roll"``) with the seed in ``ROLLOUT_MOCK_SEED`` (unset or empty: no seeding). A malformed
    seed or unknown profile raises ConfigError; in a Ray setup hook that stops the worker with the
    message, which is better than a silently nondeterministic worker.
    """
    if os.environ.get(DETERMINISTIC_MODE_VAR) != "1":
        return None
    profile = os.environ.get(PROFILE_VAR) or "roll"
    report = apply(seed=_seed_from_env(), profile=profile)
    logger.info(
        "[RolloutMock] Determinism applied in pid %d: profile=%s, seed=%s",
        os.getpid(),
        profile,
        report.seed,
    )
    return report


# --------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Fingerprint
# --------------------------------------------------------------------------------------------

#: Fingerprint fields (dotted paths; a prefix covers its sub-fields) that do not change numerics.
INFORMATIONAL_FIELDS: Final[frozenset[str]] = frozenset(
    {"fingerprint_version", "python", "platform", "gpu.count"}
)


def torch_flags() -> dict[str, Any]:
    """The torch switches that decide determinism and float32 numerics, read back (no CUDA init)."""
    import torch

    matmul = torch.backends.cuda.matmul
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_algorithms_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cuda_matmul_allow_tf32": bool(matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
    }


def _nccl_version() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # built without NCCL
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def _gpus_from_pynvml() -> tuple[list[str], str] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
            ]
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML errors are their own hierarchy; fall back to nvidia-smi
        logger.debug("pynvml failed, falling back to nvidia-smi: %s", exc)
        return None

    def text(value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return [text(n) for n in names], text(driver)


def _gpus_from_nvidia_smi(timeout_s: float = 5.0) -> tuple[list[str], str | None] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("nvidia-smi failed: %s", exc)
        return None
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
    names = [row[0] for row in rows]
    drivers = {row[1] for row in rows if len(row) > 1}
    return names, (drivers.pop() if len(drivers) == 1 else None)


def _gpu_info() -> dict[str, Any] | None:
    """GPU models, count and driver; None without CUDA. Never initialises CUDA itself.

    NVML and nvidia-smi see every GPU of the node, so ``models`` is the sorted set of model names
    (robust to CUDA_VISIBLE_DEVICES), while ``count`` is what this process can see. Unknown parts
    are None.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    found = _gpus_from_pynvml() or _gpus_from_nvidia_smi()
    names: list[str] | None = found[0] if found else None
    driver = found[1] if found else None
    if names is None and torch.cuda.is_initialized():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "models": sorted(set(names)) if names is not None else None,
        "count": torch.cuda.device_count(),
        "driver": driver,
    }


def fingerprint() -> dict[str, Any]:
    """Describe what decides this process's numerics, as a JSON-serialisable dict.

    Keys: ``fingerprint_version``, ``python``, ``platform``, ``machine``, ``numpy``, ``torch``,
    ``torch_cuda``, ``cudnn``, ``nccl``, ``gpu`` (None without CUDA), ``env`` (every variable of
    :data:`FINGERPRINT_ENV_VARS`, None when unset) and ``torch_flags`` (see :func:`torch_flags`).
    Library versions that do not apply (CPU-only torch) are None.

    It describes the *calling* process: a Ray driver's fingerprint says nothing about its workers'
    torch switches. It never initialises CUDA; nvidia-smi (5 s timeout) runs only when CUDA is
    available and pynvml is not installed.
    """
    import numpy as np
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": _nccl_version(),
        "gpu": _gpu_info(),
        "env": {name: os.environ.get(name) for name in FINGERPRINT_ENV_VARS},
        "torch_flags": torch_flags(),
    }


class _Missing:
    """Marks a field present on only one side of a comparison."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


#: Value of a :class:`FingerprintDifference` side on which the field does not exist.
MISSING: Final = _Missing()


def is_numerics_relevant(path: str) -> bool:
    """False for fields in :data:`INFORMATIONAL_FIELDS` (or below them); True for all others."""
    return not any(path == f or path.startswith(f + ".") for f in INFORMATIONAL_FIELDS)


@dataclass(frozen=True)
class FingerprintDifference:
    """One field whose value differs; a side is :data:`MISSING` when the field is absent there."""

    field: str
    recorded: Any
    current: Any

    @property
    def numerics_relevant(self) -> bool:
        """Whether this difference can change results (see :data:`INFORMATIONAL_FIELDS`)."""
        return is_numerics_relevant(self.field)

    def to_dict(self) -> dict[str, Any]:
        """JSON form; a missing side is the string ``"<missing>"``."""

        def side(value: Any) -> Any:
            return repr(MISSING) if value is MISSING else value

        return {
            "field": self.field,
            "recorded": side(self.recorded),
            "current": side(self.current),
            "numerics_relevant": self.numerics_relevant,
        }


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into ``{"a.b.c": value}``; an empty mapping stays a leaf (``{}``)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = dict(value) if isinstance(value, Mapping) else value
    return flat


def _normalise(value: Any) -> Any:
    """Tuples compare equal to lists (JSON round trips turn one into the other)."""
    if isinstance(value, tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def compare_fingerprints(
    recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> list[FingerprintDifference]:
    """Every field that differs between two fingerprints; numerics-relevant first, then by name.

    Nested mappings are compared field by field (dotted paths). A field on one side only is a
    difference with :data:`MISSING` on the other side. Equal fingerprints give ``[]``.
    """
    old, new = flatten(recorded), flatten(current)
    diffs = [
        FingerprintDifference(path, old.get(path, MISSING), new.get(path, MISSING))
        for path in sorted(old.keys() | new.keys())
        if path not in old or path not in new or _normalise(old[path]) != _normalise(new[path])
    ]
    return sorted(diffs, key=lambda d: (not d.numerics_relevant, d.field))


def _render(path: str, value: Any) -> str:
    if value is MISSING:
        return "<missing>"
    if value is None:
        return "<unset>" if path.startswith("env.") else "None"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def format_differences(diffs: Sequence[FingerprintDifference]) -> str:
    """An aligned text table ``field | recorded (dump) | current (this run)``.

    Informational fields (see :data:`INFORMATIONAL_FIELDS`) are marked ``[info]``; unset env
    vars show as ``<unset>``, absent fields as ``<missing>``. ``[]`` gives ``"(no differences)"``.
    """
    if not diffs:
        return "(no differences)"
    rows = [["field", "recorded (dump)", "current (this run)"]]
    for d in diffs:
        name = d.field if d.numerics_relevant else f"{d.field} [info]"
        rows.append([name, _render(d.field, d.recorded), _render(d.field, d.current)])
    return _table(rows)


def format_fingerprint(fp: Mapping[str, Any]) -> str:
    """One ``field  value`` line per flattened field, values aligned, in the fingerprint's order."""
    flat = flatten(fp)
    if not flat:
        return "(empty fingerprint)"
    width = max(len(path) for path in flat)
    return "\n".join(f"{path.ljust(width)}  {_render(path, value)}" for path, value in flat.items())


__all__ = [
    "DETERMINISTIC_MODE_VAR",
    "FINGERPRINT_ENV_VARS",
    "FINGERPRINT_VERSION",
    "INFORMATIONAL_FIELDS",
    "MISSING",
    "PROFILES",
    "PROFILE_VAR",
    "SEED_VAR",
    "SETUP_HOOK",
    "ApplyReport",
    "DeterminismError",
    "EnvSetting",
    "FingerprintDifference",
    "LateSetting",
    "Profile",
    "apply",
    "apply_from_env",
    "compare_fingerprints",
    "fingerprint",
    "flatten",
    "format_differences",
    "format_fingerprint",
    "get_profile",
    "is_numerics_relevant",
    "ray_runtime_env",
    "seed_everything",
    "torch_flags",
]
