"""rollout_mock: record and replay RL rollout batches at the scheduler layer.

The public API, all importable from here::

    from rollout_mock import MockScheduler, load_config, open_dump, verify, diff_dumps

* wrapping: :class:`MockScheduler`, :func:`wrap_scheduler` (the same, typed as what it wraps),
  :func:`mock_class` (``rollout_mock.wrap``); Hugging Face TRL
  trainers: :func:`wrap_trl` (``rollout_mock.adapters.trl``);
* configuration: :class:`RolloutMockConfig`, :func:`load_config`, :class:`Mode`;
* reading dumps: :func:`open_dump` / :class:`Dump`, :func:`load_step`; stores: :class:`Store`, :class:`StepStore`,
  :func:`DirectoryStore`, :func:`MemoryStore` (``rollout_mock.storage``);
* comparing: :class:`MetricsWriter`, :func:`read_metrics`, :func:`verify`, :func:`diff_dumps`,
  :func:`compare_batches`, :func:`batch_traces` (``rollout_mock.compare``); check mode's verdicts:
  :func:`read_check_verdicts` / :class:`CheckVerdict`; request matching:
  :func:`register_volatile_fields`, :func:`register_matcher` (named ``match_on`` matchers);
* the flight recorder (``keep:``): :func:`observe` and :func:`pin` reach every dump-mode
  scheduler of this process (``MockScheduler.observe`` / ``.pin`` reach one);
* forensics: :func:`anomaly_hooks` / :func:`explain` name the module and op that made a step's
  numbers non-finite (``rollout-mock explain``);
* determinism: the ``rollout_mock.determinism`` package;
* every error: defined in ``rollout_mock.errors`` and importable from here too (all subclass
  :class:`RolloutMockError`; :class:`MetricsWarning` is a warning).

Names are imported lazily (PEP 562), so ``import rollout_mock`` — and the pytest plugin that
every pytest run of an environment with rollout_mock installed loads — does not import torch.
The documentation lives under ``docs/`` (``mkdocs serve``).
"""

from __future__ import annotations

import importlib
import inspect
import os as _os
from typing import TYPE_CHECKING, Any

from rollout_mock import errors as _errors

# Every error, imported eagerly (errors.py needs only the standard library): a class added to
# errors.__all__ is exported here, typed, without a second list to keep in step.
from rollout_mock.errors import *  # noqa: F403
from rollout_mock.version import __version__

_EXPORTS: dict[str, str] = {
    "MockScheduler": "rollout_mock.wrap.scheduler",
    "wrap_scheduler": "rollout_mock.wrap.scheduler",
    "mock_class": "rollout_mock.wrap.actor",
    "wrap_trl": "rollout_mock.adapters.trl",
    "RolloutMockConfig": "rollout_mock.config",
    "load_config": "rollout_mock.config",
    "Mode": "rollout_mock.modes",
    "load_step": "rollout_mock.storage.reader",
    "open_dump": "rollout_mock.storage.reader",
    "Dump": "rollout_mock.storage.reader",
    "StepStore": "rollout_mock.storage.store",
    "Store": "rollout_mock.storage.store",
    "DirectoryStore": "rollout_mock.storage.store",
    "MemoryStore": "rollout_mock.storage.store",
    "rank_rows": "rollout_mock.storage.reader",
    "register_batch_class": "rollout_mock.batch",
    "MetricsWriter": "rollout_mock.compare.expected",
    "read_metrics": "rollout_mock.compare.metrics",
    "verify": "rollout_mock.compare.verify",
    "VerifyReport": "rollout_mock.compare.verify",
    "diff_dumps": "rollout_mock.compare.diff",
    "DiffReport": "rollout_mock.compare.diff",
    "compare_batches": "rollout_mock.codec.structure",
    "batch_traces": "rollout_mock.compare.traces",
    "read_check_verdicts": "rollout_mock.wrap.check",
    "CheckVerdict": "rollout_mock.wrap.check",
    "register_volatile_fields": "rollout_mock.wrap.hooks",
    "register_matcher": "rollout_mock.wrap.mismatch",
    "observe": "rollout_mock.wrap.retention",
    "anomaly_hooks": "rollout_mock.debug.forensics",
    "explain": "rollout_mock.debug.forensics",
    "pin": "rollout_mock.wrap.retention",
}

__all__ = ["__version__", *sorted(_EXPORTS)]
__all__ += _errors.__all__

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.adapters.trl import wrap_trl
    from rollout_mock.batch import register_batch_class
    from rollout_mock.codec.structure import compare_batches
    from rollout_mock.compare.diff import DiffReport, diff_dumps
    from rollout_mock.compare.expected import MetricsWriter
    from rollout_mock.compare.metrics import read_metrics
    from rollout_mock.compare.traces import batch_traces
    from rollout_mock.compare.verify import VerifyReport, verify
    from rollout_mock.config import RolloutMockConfig, load_config
    from rollout_mock.debug.forensics import anomaly_hooks, explain
    from rollout_mock.modes import Mode
    from rollout_mock.storage.reader import Dump, load_step, open_dump, rank_rows
    from rollout_mock.storage.store import DirectoryStore, MemoryStore, StepStore, Store
    from rollout_mock.wrap.actor import mock_class
    from rollout_mock.wrap.check import CheckVerdict, read_check_verdicts
    from rollout_mock.wrap.hooks import register_volatile_fields
    from rollout_mock.wrap.mismatch import register_matcher
    from rollout_mock.wrap.retention import observe, pin
    from rollout_mock.wrap.scheduler import MockScheduler, wrap_scheduler


if not TYPE_CHECKING:
    # Hidden from type checkers: they see the names imported above, each with its own type, so
    # that a misspelt name (``from rollout_mock import wrap_schedular``) is an error, not ``Any``.
    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'rollout_mock' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        _plain_docs(value)
        globals()[name] = value
        return value


def _plain_docs(value: Any) -> None:
    """``help()`` on a public name shows plain text: the reStructuredText markup of its docstring
    and of its class's methods and properties (``code``, :class:`~a.B`) is rewritten once, when
    the name is first taken from the package, as the CLI's help is (:func:`rollout_mock.cli.plain_text`);
    the source keeps the markup. (The errors, imported eagerly, keep theirs.)"""
    from rollout_mock.cli import plain_text

    # the class's own members and those it inherits from the package's classes (help() shows both)
    owners = [c for c in value.__mro__ if c.__module__.startswith("rollout_mock.")] if isinstance(value, type) else []
    members = [m.__func__ if isinstance(m, classmethod | staticmethod) else m
               for owner in owners for m in vars(owner).values()]
    ours = [m for m in members if (inspect.isfunction(m) and m.__module__.startswith("rollout_mock."))
            or (isinstance(m, property) and getattr(m.fget, "__module__", "").startswith("rollout_mock."))]
    for target in [value, *ours]:  # (a function a library put in the class, e.g. pydantic's, is left alone)
        doc = target.__dict__.get("__doc__") if isinstance(target, type) else target.__doc__
        if isinstance(doc, str):
            target.__doc__ = plain_text(doc)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


# The framework adapters' registrations — batch types (rollout_mock.batch), step-argument names
# (rollout_mock.wrap.calls) and scheduler hooks such as switching off ROLL's own rollout mock
# (rollout_mock.wrap.hooks) — are made whatever the user imports: ``from rollout_mock.x import y``
# runs this module first. Cheap: rollout_mock.adapters imports no framework, torch or numpy.
from rollout_mock import adapters as _adapters  # noqa: E402

# ``rollout-mock explain`` runs the training command with ROLLOUT_MOCK_EXPLAIN set: its step hook
# starts the anomaly probe when the chosen step is called (nothing is imported when it is unset).
if _os.environ.get("ROLLOUT_MOCK_EXPLAIN"):
    from rollout_mock.debug.forensics import install_from_env as _install_explain

    _install_explain()
