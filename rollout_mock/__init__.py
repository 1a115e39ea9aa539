"""rollout_mock: record and replay RL rollout batches at the scheduler layer.

Public API::

    from rollout_mock import MockScheduler, RolloutMockConfig, load_config, load_step

Names are imported lazily (PEP 562), so ``import rollout_mock`` — and the pytest plugin that
every pytest run of an environment with rollout_mock installed loads — does not import torch.
See README.md for the configuration block, the on-disk format and the guarantees.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollout_mock._version import __version__

_EXPORTS: dict[str, str] = {
    "MockScheduler": "rollout_mock.wrap.scheduler",
    "mock_class": "rollout_mock.wrap.actor",
    "RolloutMockConfig": "rollout_mock.config",
    "load_config": "rollout_mock.config",
    "Mode": "rollout_mock.modes",
    "load_step": "rollout_mock.storage.reader",
    "open_dump": "rollout_mock.storage.reader",
    "rank_rows": "rollout_mock.storage.partial",
    "register_batch_class": "rollout_mock.codec",
    "MetricsWriter": "rollout_mock.compare.metrics",
    "read_metrics": "rollout_mock.compare.metrics",
    "ConfigError": "rollout_mock.errors",
    "CorruptStepError": "rollout_mock.errors",
    "DiskFullError": "rollout_mock.errors",
    "DumpNotFoundError": "rollout_mock.errors",
    "FingerprintMismatchError": "rollout_mock.errors",
    "IncompleteDumpError": "rollout_mock.errors",
    "LockedError": "rollout_mock.errors",
    "ManifestError": "rollout_mock.errors",
    "RolloutMockError": "rollout_mock.errors",
    "SchedulerUnavailableError": "rollout_mock.errors",
    "StepExistsError": "rollout_mock.errors",
    "StepNotFoundError": "rollout_mock.errors",
    "UnsafePickleError": "rollout_mock.errors",
    "UnsafePathError": "rollout_mock.errors",
    "WriterError": "rollout_mock.errors",
}

__all__ = ["__version__", *sorted(_EXPORTS)]

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.codec import register_batch_class
    from rollout_mock.compare.metrics import MetricsWriter, read_metrics
    from rollout_mock.config import RolloutMockConfig, load_config
    from rollout_mock.errors import (
        ConfigError,
        CorruptStepError,
        DiskFullError,
        DumpNotFoundError,
        FingerprintMismatchError,
        IncompleteDumpError,
        LockedError,
        ManifestError,
        RolloutMockError,
        SchedulerUnavailableError,
        StepExistsError,
        StepNotFoundError,
        UnsafePathError,
        UnsafePickleError,
        WriterError,
    )
    from rollout_mock.modes import Mode
    from rollout_mock.storage.partial import rank_rows
    from rollout_mock.storage.reader import load_step, open_dump
    from rollout_mock.wrap import mock_class
    from rollout_mock.wrap.scheduler import MockScheduler


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
