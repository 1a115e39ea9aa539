"""One-line integrations with RL frameworks, and readers of their own rollout dumps.

* :mod:`~rollout_mock.adapters.roll`  — ``ray.remote(roll_scheduler(RolloutScheduler, pipeline_config))``
* :mod:`~rollout_mock.adapters.verl`  — ``wrap_verl_rollout(trainer)`` after ``init_workers()``
* :mod:`~rollout_mock.adapters.areal` — ``wrap_areal(engine, cfg, step=lambda: global_step)``
* :mod:`~rollout_mock.adapters.trl`   — ``wrap_trl(trainer, cfg)`` after building a TRL ``GRPOTrainer``
* :mod:`~rollout_mock.adapters.slime` — ``--rollout-function-path rollout_mock.adapters.slime.generate_rollout``
* :mod:`~rollout_mock.adapters.foreign` — ``open_foreign`` / ``import_foreign`` for ROLL, verl
  ``skip.rollout``, AReaL ``trajectory_debug`` and slime debug rollout dumps.

Names are imported lazily: ``import rollout_mock.adapters`` imports no framework. It does
register the adapters' scheduler hooks (:mod:`rollout_mock.wrap.hooks`), e.g. switching off
ROLL's built-in rollout mock on a scheduler that rollout_mock records, and each framework's
volatile request fields (:data:`VOLATILE_FIELDS`), which request matching and check mode do not
compare.
"""

from __future__ import annotations

import importlib
from typing import Any

from rollout_mock.adapters import frameworks  # noqa: F401  (registers the frameworks: hooks, batch types, step names, volatile fields)
from rollout_mock.adapters.frameworks import LIVE_FIELDS, VOLATILE_FIELDS, serve_live_fields, tokenizer_fingerprint

_EXPORTS = {
    "roll_scheduler": "roll", "roll_handle": "roll", "roll_config": "roll",
    "wrap_verl_rollout": "verl", "VerlRollout": "verl",
    "wrap_areal": "areal", "ArealRollout": "areal",
    "wrap_trl": "trl", "TrlRollout": "trl",
    "open_foreign": "foreign", "import_foreign": "foreign", "detect_format": "foreign",
}

__all__ = [
    "LIVE_FIELDS", "VOLATILE_FIELDS", "serve_live_fields", "tokenizer_fingerprint",
    "ArealRollout", "VerlRollout", "detect_format", "import_foreign", "open_foreign", "roll_config",
    "roll_handle", "roll_scheduler", "wrap_areal", "wrap_verl_rollout",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock.adapters' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollout_mock.adapters.{module}"), name)
    globals()[name] = value
    return value
