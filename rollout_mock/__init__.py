"""rollout_mock: record and replay RL rollout batches at the scheduler layer.

The public API, all importable from here::

    from rollout_mock import MockScheduler, load_config, open_dump, verify, diff_dumps

* wrapping: :class:`MockScheduler`, :func:`mock_class` (``rollout_mock.wrap``); Hugging Face TRL
  trainers: :func:`wrap_trl` (``rollout_mock.adapters.trl``);
* configuration: :class:`RolloutMockConfig`, :func:`load_config`, :class:`Mode`;
* reading dumps: :func:`open_dump` / :class:`Dump`, :func:`load_step`; stores: :class:`StepStore`,
  :class:`DirectoryStore`, :class:`MemoryStore` (``rollout_mock.storage``);
* comparing: :class:`MetricsWriter`, :func:`read_metrics`, :func:`verify`, :func:`diff_dumps`,
  :func:`compare_batches`, :func:`batch_traces` (``rollout_mock.compare``); check mode's verdicts:
  :func:`read_check_verdicts` / :class:`CheckVerdict`; request matching:
  :func:`register_volatile_fields`;
* determinism: the ``rollout_mock.determinism`` package;
* every error: defined in ``rollout_mock.errors`` and importable from here too (all subclass
  :class:`RolloutMockError`; :class:`MetricsWarning` is a warning).

Names are imported lazily (PEP 562), so ``import rollout_mock`` — and the pytest plugin that
every pytest run of an environment with rollout_mock installed loads — does not import torch.
The documentation lives under ``docs/`` (``mkdocs serve``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollout_mock import errors as _errors

# Every error, imported eagerly (errors.py needs only the standard library): a class added to
# errors.__all__ is exported here, typed, without a second list to keep in step.
from rollout_mock.errors import *  # noqa: F403
from rollout_mock.version import __version__

_EXPORTS: dict[str, str] = {
    "MockScheduler": "rollout_mock.wrap.scheduler",
    "mock_class": "rollout_mock.wrap.actor",
    "wrap_trl": "rollout_mock.adapters.trl",
    "RolloutMockConfig": "rollout_mock.config",
    "load_config": "rollout_mock.config",
    "Mode": "rollout_mock.modes",
    "load_step": "rollout_mock.storage.reader",
    "open_dump": "rollout_mock.storage.reader",
    "Dump": "rollout_mock.storage.reader",
    "StepStore": "rollout_mock.storage.base",
    "Store": "rollout_mock.storage.store",
    "DirectoryStore": "rollout_mock.storage.directory",
    "MemoryStore": "rollout_mock.storage.memory",
    "rank_rows": "rollout_mock.storage.partial",
    "register_batch_class": "rollout_mock.codec",
    "MetricsWriter": "rollout_mock.compare.metrics",
    "read_metrics": "rollout_mock.compare.metrics",
    "verify": "rollout_mock.compare.verify",
    "VerifyReport": "rollout_mock.compare.verify",
    "diff_dumps": "rollout_mock.compare.diff",
    "DiffReport": "rollout_mock.compare.diff",
    "compare_batches": "rollout_mock.compare.diff",
    "batch_traces": "rollout_mock.compare.traces",
    "read_check_verdicts": "rollout_mock.wrap.check",
    "CheckVerdict": "rollout_mock.wrap.check",
    "register_volatile_fields": "rollout_mock.wrap.hooks",
}

__all__ = ["__version__", *sorted(_EXPORTS)]
__all__ += _errors.__all__

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.adapters.trl import wrap_trl
    from rollout_mock.codec import register_batch_class
    from rollout_mock.compare.diff import DiffReport, compare_batches, diff_dumps
    from rollout_mock.compare.metrics import MetricsWriter, read_metrics
    from rollout_mock.compare.traces import batch_traces
    from rollout_mock.compare.verify import VerifyReport, verify
    from rollout_mock.config import RolloutMockConfig, load_config
    from rollout_mock.modes import Mode
    from rollout_mock.storage.base import StepStore
    from rollout_mock.storage.directory import DirectoryStore
    from rollout_mock.storage.memory import MemoryStore
    from rollout_mock.storage.partial import rank_rows
    from rollout_mock.storage.reader import Dump, load_step, open_dump
    from rollout_mock.storage.store import Store
    from rollout_mock.wrap.actor import mock_class
    from rollout_mock.wrap.check import CheckVerdict, read_check_verdicts
    from rollout_mock.wrap.hooks import register_volatile_fields
    from rollout_mock.wrap.scheduler import MockScheduler


# The adapters register their scheduler hooks and their frameworks' volatile request fields
# with rollout_mock.wrap.hooks whatever the user imports (light: no framework, no torch).
import rollout_mock.adapters  # noqa: E402,F401


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
