"""Deterministic execution: profiles, applying them (here, in Ray workers), the GPU self-check,
fingerprints.

``rollout_mock.determinism.apply_from_env`` is the name Ray's ``worker_process_setup_hook``
points at (:data:`SETUP_HOOK`); keep it importable from this package.
"""

from rollout_mock.determinism.check import DeviceCheck, SelfCheck, self_check
from rollout_mock.determinism.fingerprint import (
    INFORMATIONAL_FIELDS,
    MISSING,
    FingerprintDifference,
    compare_fingerprints,
    fingerprint,
    flatten,
    format_differences,
    format_fingerprint,
    is_numerics_relevant,
    torch_flags,
)
from rollout_mock.determinism.process import (
    ApplyReport,
    LateSetting,
    apply,
    apply_from_env,
    ray_runtime_env,
    seed_everything,
)
from rollout_mock.determinism.profiles import (
    DETERMINISTIC_MODE_VAR,
    FINGERPRINT_ENV_VARS,
    FINGERPRINT_VERSION,
    PROFILE_VAR,
    PROFILES,
    SEED_VAR,
    SETUP_HOOK,
    TF32,
    TF32_VAR,
    EnvSetting,
    Profile,
    get_profile,
)
from rollout_mock.errors import DeterminismError

__all__ = [
    "DETERMINISTIC_MODE_VAR", "FINGERPRINT_ENV_VARS", "FINGERPRINT_VERSION", "INFORMATIONAL_FIELDS",
    "MISSING", "PROFILES", "PROFILE_VAR", "SEED_VAR", "SETUP_HOOK", "TF32", "TF32_VAR",
    "ApplyReport", "DeterminismError", "DeviceCheck", "EnvSetting", "FingerprintDifference",
    "LateSetting", "Profile", "SelfCheck", "apply", "apply_from_env", "compare_fingerprints",
    "fingerprint", "flatten", "format_differences", "format_fingerprint", "get_profile",
    "is_numerics_relevant", "ray_runtime_env", "seed_everything", "self_check", "torch_flags",
]
