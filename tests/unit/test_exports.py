"""Every error a user can catch is importable from the package root (``from rollout_mock import X``)."""

from __future__ import annotations

import inspect

import rollout_mock
import rollout_mock.errors as errors


def _error_classes() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException | Warning) and obj.__module__ == errors.__name__
    }


def test_errors_module_lists_every_class_it_defines() -> None:
    defined = _error_classes()
    assert "ForeignDumpError" in defined and "RolloutMockError" in defined  # the scan itself works
    assert sorted(defined) == sorted(errors.__all__)


def test_every_error_class_is_exported_from_the_package() -> None:
    missing = sorted(set(_error_classes()) - set(rollout_mock.__all__))
    assert not missing, f"add to errors.__all__ (rollout_mock/__init__.py exports that list): {missing}"
    for name, cls in _error_classes().items():
        assert getattr(rollout_mock, name) is cls
        assert name in dir(rollout_mock)


def test_errors_users_catch_by_name() -> None:
    from rollout_mock import DebugInputError, ForeignDumpError, MetricsDivergenceError, StepArgumentError

    for cls in (DebugInputError, ForeignDumpError, MetricsDivergenceError, StepArgumentError):
        assert issubclass(cls, rollout_mock.RolloutMockError)

