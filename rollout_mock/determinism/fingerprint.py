"""Environment fingerprints: what a run's numerics depend on, and how two differ."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_mock.determinism.profiles import FINGERPRINT_ENV_VARS, FINGERPRINT_VERSION
from rollout_mock.text import logger, table

__all__ = [
    "FingerprintDifference",
    "INFORMATIONAL_FIELDS",
    "MISSING",
    "compare_fingerprints",
    "fingerprint",
    "flatten",
    "format_differences",
    "format_fingerprint",
    "is_numerics_relevant",
    "torch_flags",
]


#: Environment variable that switches :func:`apply_from_env` on (ROLL's name and meaning).

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
    return table(rows)


def format_fingerprint(fp: Mapping[str, Any]) -> str:
    """One ``field  value`` line per flattened field, values aligned, in the fingerprint's order."""
    flat = flatten(fp)
    if not flat:
        return "(empty fingerprint)"
    width = max(len(path) for path in flat)
    return "\n".join(f"{path.ljust(width)}  {_render(path, value)}" for path, value in flat.items())
