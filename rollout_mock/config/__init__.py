"""The ``rollout_mock:`` configuration block: the pydantic model, its choices, and loading it.

ROLL's block (``enable``, ``mode``, ``dump_dir``) loads unchanged; see
:mod:`rollout_mock.config.model` for every key and :mod:`rollout_mock.config.loading` for how
YAML files, mappings and OmegaConf objects are read.
"""

from rollout_mock.config.loading import MAX_CONFIG_BYTES, MAX_YAML_NODES, load_config
from rollout_mock.config.model import (
    BLOCK_KEY,
    MAX_ERROR_LINES,
    CheckServes,
    Compression,
    DiskFullPolicy,
    FingerprintPolicy,
    KeepConfig,
    MetricRule,
    MismatchPolicy,
    MissingStepPolicy,
    RankPolicy,
    ReplayRows,
    RolloutMockConfig,
    Tolerance,
    VerdictAction,
    VerdictConfig,
    WatchdogConfig,
    build_config,
)
from rollout_mock.config.parts import (
    CheckSettings,
    ConfigParts,
    KeepSettings,
    MatchSettings,
    RecordSettings,
    ReplaySettings,
    StoreSettings,
    StreamSettings,
    WatchdogSettings,
    config_parts,
)

__all__ = [
    "BLOCK_KEY", "MAX_CONFIG_BYTES", "MAX_ERROR_LINES", "MAX_YAML_NODES", "CheckServes", "CheckSettings", "Compression",
    "ConfigParts", "DiskFullPolicy", "FingerprintPolicy", "KeepConfig", "KeepSettings", "MatchSettings",
    "MetricRule", "MismatchPolicy", "MissingStepPolicy", "RankPolicy", "RecordSettings", "ReplayRows",
    "ReplaySettings", "RolloutMockConfig", "StoreSettings", "StreamSettings", "Tolerance", "VerdictAction",
    "VerdictConfig", "WatchdogConfig", "WatchdogSettings", "build_config", "config_parts", "load_config",
]
