"""A restricted unpickler: loads what rollout_mock writes, refuses anything else.

Like ``torch.load(weights_only=True)``, the default loader resolves only an allow-list of globals:
rollout_mock's own rebuild functions, plain containers, torch dtypes/devices/sizes, and
registered batch classes (verl's ``DataProto`` by default). Any other global — ``os.system``,
``builtins.eval``, a user class, a lambda pickled by value — raises
:class:`~rollout_mock.errors.UnsafePickleError` naming it and the way to opt in. Trusting a dump
(``trust_pickle: true``, ``trusted=True``, ``--trust``) switches to the plain unpickler.

What the allow-list deliberately leaves out, because each is a known way to turn "only these
globals" back into "any code": ``builtins.getattr``/``eval``/``exec``/``__import__``/``open``/
``object``/``type``, ``copyreg._reconstructor`` and ``copyreg.__newobj__`` (they instantiate any
class; protocol 5 does not need them), ``functools.partial``, ``operator.*``, every ``torch`` name
other than dtypes, ``Size`` and ``device`` (``torch.load``, ``torch.jit``, storages), and numpy
reconstructors (crafted ``numpy.dtype`` states have crashed the interpreter).
``_rebuild_object`` is only honoured for registered batch classes, and persistent IDs are refused.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, BinaryIO

import torch

from rollout_mock import codec
from rollout_mock.codec import batch_class_names
from rollout_mock.errors import UnsafePickleError

__all__ = ["OPT_IN", "REBUILD_FUNCTIONS", "SafeUnpickler", "allow_global", "is_allowed", "load"]

#: Functions in :mod:`rollout_mock.codec` that step files may reference. A test checks that every
#: ``codec._rebuild_*`` function is listed here, so a new one cannot be forgotten.
REBUILD_FUNCTIONS: frozenset[str] = frozenset(
    {
        "_rebuild_tensor",
        "_rebuild_parameter",
        "_rebuild_ndarray",
        "_rebuild_object_array",
        "_rebuild_np_scalar",
        "_rebuild_tensordict",
        "_rebuild_object",
    }
)

_ALLOWED: set[tuple[str, str]] = {
    *(("rollout_mock.codec", name) for name in REBUILD_FUNCTIONS),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "slice"),
    ("builtins", "range"),
    ("builtins", "bytearray"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("builtins", "tuple"),
    ("builtins", "int"),
    ("builtins", "float"),
    ("builtins", "str"),
    ("builtins", "bool"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("collections", "Counter"),
    ("torch", "Size"),
    ("torch", "device"),
    ("datetime", "datetime"),
    ("datetime", "date"),
    ("datetime", "time"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("tensordict._td", "TensorDict"),
    ("tensordict.tensordict", "TensorDict"),
}

OPT_IN = (
    "trust_pickle: true in the rollout_mock config, trusted=True in rollout_mock.load_step, "
    "or --trust on the command line"
)


def allow_global(module: str, name: str) -> None:
    """Allow ``module.name`` in the safe loader (for your own small, trusted types).

    Only allow plain data types whose construction cannot run arbitrary code.
    """
    _ALLOWED.add((module, name))


def is_allowed(module: str, name: str) -> bool:
    return (module, name) in _ALLOWED or (module, name) in batch_class_names()


def _checked_rebuild_object(source: str) -> Callable[[type, dict[str, Any]], Any]:
    def rebuild(cls: type, state: dict[str, Any]) -> Any:
        if not isinstance(cls, type) or not codec.is_batch_class(cls) or not isinstance(state, dict):
            name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"
            raise UnsafePickleError(
                f"{source}: refusing to rebuild {name} from an attribute dict: only registered "
                f"batch classes may be (rollout_mock.register_batch_class). If you trust this "
                f"dump, load it with {OPT_IN}.",
                path=source,
            )
        return codec._rebuild_object(cls, state)

    return rebuild


class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only allow-listed globals (see module docstring)."""

    def __init__(self, file: BinaryIO, *, source: str = "<stream>") -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        if module == "rollout_mock.codec" and name == "_rebuild_object":
            return _checked_rebuild_object(self._source)
        if is_allowed(module, name):
            return super().find_class(module, name)
        if module == "torch" and "." not in name:
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise UnsafePickleError(
            f"{self._source}: refusing to load global {module}.{name}: the safe loader only "
            f"allows what rollout_mock writes (tensors, arrays, plain containers, registered "
            f"batch classes). If you trust this dump, load it with {OPT_IN}; for your own "
            f"batch class, call rollout_mock.register_batch_class(cls).",
            path=self._source,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            f"{self._source}: refusing a persistent id ({type(pid).__name__}): rollout_mock never "
            f"writes one. If you trust this dump, load it with {OPT_IN}.",
            path=self._source,
        )


def load(file: BinaryIO, *, trusted: bool, source: str = "<stream>") -> Any:
    """Unpickle one object from ``file``; restricted unless ``trusted``."""
    if trusted:
        return pickle.Unpickler(file).load()
    return SafeUnpickler(file, source=source).load()
