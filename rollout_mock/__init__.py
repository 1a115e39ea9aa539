"""rollout_mock: record and replay RL rollout batches at the scheduler layer.

Public API::

    from rollout_mock import MockScheduler, RolloutMockConfig, load_config, load_step

See README.md for the configuration block, the on-disk format and the guarantees.
"""

from rollout_mock._version import __version__
from rollout_mock.codec import register_batch_class
from rollout_mock.config import RolloutMockConfig, load_config
from rollout_mock.errors import (
    ConfigError,
    CorruptStepError,
    DumpNotFoundError,
    IncompleteDumpError,
    LockedError,
    ManifestError,
    RolloutMockError,
    SchedulerUnavailableError,
    StepExistsError,
    StepNotFoundError,
    UnsafePickleError,
    WriterError,
)
from rollout_mock.loading import load_step, open_dump
from rollout_mock.modes import Mode
from rollout_mock.scheduler import MockScheduler, mock_class

__all__ = [
    "ConfigError",
    "CorruptStepError",
    "DumpNotFoundError",
    "IncompleteDumpError",
    "LockedError",
    "ManifestError",
    "MockScheduler",
    "Mode",
    "RolloutMockConfig",
    "RolloutMockError",
    "SchedulerUnavailableError",
    "StepExistsError",
    "StepNotFoundError",
    "UnsafePickleError",
    "WriterError",
    "__version__",
    "load_config",
    "load_step",
    "mock_class",
    "open_dump",
    "register_batch_class",
]
