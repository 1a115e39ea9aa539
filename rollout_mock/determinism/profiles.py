"""Determinism profiles: the environment variables each one sets, and the TF32 choice.

A profile holds what buys run-to-run determinism. TF32 is a separate choice (:class:`TF32`): it
changes precision, not determinism (a TF32 matmul gives the same bits on every run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Final

from rollout_mock.errors import ConfigError

__all__ = [
    "DETERMINISTIC_MODE_VAR",
    "EnvSetting",
    "FINGERPRINT_ENV_VARS",
    "FINGERPRINT_VERSION",
    "PROFILES",
    "PROFILE_VAR",
    "Profile",
    "SEED_VAR",
    "SETUP_HOOK",
    "TF32",
    "TF32_VAR",
    "get_profile",
]


#: Environment variable that switches :func:`apply_from_env` on (ROLL's name and meaning).
DETERMINISTIC_MODE_VAR: Final = "DETERMINISTIC_MODE"
#: Environment variable holding the seed that :func:`apply_from_env` applies (an integer).
SEED_VAR: Final = "ROLLOUT_MOCK_SEED"
#: Environment variable naming the profile that :func:`apply_from_env` applies (default ``roll``).
PROFILE_VAR: Final = "ROLLOUT_MOCK_DETERMINISM_PROFILE"
#: Environment variable holding the TF32 choice that :func:`apply_from_env` applies (default ``keep``).
TF32_VAR: Final = "ROLLOUT_MOCK_TF32"
#: Module path of :func:`apply_from_env`, as Ray's ``worker_process_setup_hook`` wants it.
SETUP_HOOK: Final = "rollout_mock.determinism.apply_from_env"
#: Version of the :func:`fingerprint` layout; bump it when a field changes meaning.
FINGERPRINT_VERSION: Final = 1

_MAX_SEED: Final = 2**32 - 1  # numpy.random.seed accepts 0 .. 2**32 - 1


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
            "roll plus NCCL protocol/NVLS/CollNet, flash-attn and hash seed",
            _ROLL_SETTINGS + _STRICT_EXTRA,
        ),
    }
)

_TF32_OFF_SETTINGS: Final = (
    EnvSetting(
        "NVIDIA_TF32_OVERRIDE", "0", "forces TF32 off in cuBLAS/cuDNN even if a library turns it on"
    ),
)


class TF32(str, Enum):
    """What :func:`~rollout_mock.determinism.apply` does with TF32: a precision choice.

    TF32 rounds the inputs of float32 matmuls and convolutions to 10 mantissa bits on Ampere and
    newer GPUs. It is deterministic run to run, so turning it off buys no determinism: it changes
    the numbers (more precise, slower), the same way on every run. Dump and replay must make the
    same choice; the fingerprint records torch's TF32 switches either way.
    """

    KEEP = "keep"
    """Leave torch's TF32 switches and ``NVIDIA_TF32_OVERRIDE`` as they are (default)."""

    OFF = "off"
    """Full float32: ``cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32`` off, float32 matmul
    precision ``"highest"``, and ``NVIDIA_TF32_OVERRIDE=0`` (which cuBLAS/cuDNN read when CUDA
    starts, so it is too late in a process where CUDA already runs)."""

    @classmethod
    def parse(cls, value: object, *, source: str = "tf32") -> TF32:
        """``value`` as a member (case and surrounding spaces ignored).

        Anything else (a bool included: ``True`` would be ambiguous) raises ConfigError naming
        ``source`` and the valid values.
        """
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        valid = ", ".join(member.value for member in cls)
        raise ConfigError(f"{source} must be one of {valid}; got {value!r}")

    @property
    def settings(self) -> tuple[EnvSetting, ...]:
        """The environment variables this choice sets (none for ``keep``)."""
        return _TF32_OFF_SETTINGS if self is TF32.OFF else ()

    def __str__(self) -> str:
        return self.value


#: Every variable any profile or TF32 choice sets, plus overrides that change numerics behind
#: torch's back.
FINGERPRINT_ENV_VARS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(
        [s.name for p in PROFILES.values() for s in p.settings]
        + [s.name for s in _TF32_OFF_SETTINGS]
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
