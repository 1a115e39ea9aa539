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

from rollout_mock.adapters import native_roll  # noqa: F401  (registers ROLL's scheduler hook)
from rollout_mock.wrap.hooks import register_volatile_fields

#: Fields of each framework's requests (and batches) that differ between two faithful runs of
#: the same training: never compared by request matching or check mode.
VOLATILE_FIELDS: dict[str, tuple[str, ...]] = {
    # any framework: fields named as random ids, and wall-clock times in a meta_info
    "common": ("*uuid*", "meta_info.*time*"),
    # RayPPOTrainer.fit/_validate: ``uid = str(uuid.uuid4())`` per prompt, carried into
    # generate_sequences' prompts and its output; ``timing`` of the output (seconds)
    "verl": ("non_tensor_batch.uid", "meta_info.timing"),
    # roll.utils.telemetry.inject_trace_context: W3C trace ids in every get_batch request;
    # get_batch_return_start_time (a time.time()) and the timing metrics of its output
    "roll": ("meta_info._otel_ctx", "meta_info.get_batch_return_start_time", "meta_info.metrics"),
    # slime (slime.utils.types.Sample): the adapter keys its requests (no volatile argument);
    # a sample's wall time, router session id and per-run engine statistics (prefix cache hits,
    # speculative decoding) differ between faithful runs
    "slime": ("non_generation_time", "session_id", "prefix_cache_info", "spec_info"),
    # AReaL: the workflow executor's trajectories carry nothing random; remote-tensor handles are
    # fetched before anything is digested or recorded (see adapters/areal.py)
    "areal": (),
    # TRL: the adapter digests the prompts only; generation timings are not in its records
    "trl": (),
}
for _owner, _patterns in VOLATILE_FIELDS.items():
    register_volatile_fields(_owner, *_patterns)

_EXPORTS = {
    "roll_scheduler": "roll", "roll_handle": "roll", "roll_config": "roll",
    "wrap_verl_rollout": "verl", "VerlRollout": "verl",
    "wrap_areal": "areal", "ArealRollout": "areal",
    "wrap_trl": "trl", "TrlRollout": "trl",
    "open_foreign": "foreign", "import_foreign": "foreign", "detect_format": "foreign",
}

__all__ = [
    "VOLATILE_FIELDS",
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
