"""A restricted unpickler: loads what rollout_mock writes, refuses anything else.

Like ``torch.load(weights_only=True)``, the default loader resolves only an allow-list of globals:
rollout_mock's own rebuild functions, plain containers, torch dtypes/devices/sizes, TensorDict,
and registered batch classes (verl's ``DataProto`` by default). Any other global — ``os.system``,
a user class, a lambda pickled by value — raises :class:`~rollout_mock.errors.UnsafePickleError`
naming it and the way to opt in. Trusting a dump (``trust_pickle: true``, ``trusted=True``,
``--trust``) switches to the plain unpickler.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any, BinaryIO

import torch

from rollout_mock.codec import batch_class_names
from rollout_mock.errors import UnsafePickleError

_ALLOWED: set[tuple[str, str]] = {
    ("rollout_mock.codec", "_rebuild_tensor"),
    ("rollout_mock.codec", "_rebuild_parameter"),
    ("rollout_mock.codec", "_rebuild_ndarray"),
    ("rollout_mock.codec", "_rebuild_object_array"),
    ("rollout_mock.codec", "_rebuild_np_scalar"),
    ("rollout_mock.codec", "_rebuild_object"),
    ("rollout_mock.codec", "_rebuild_tensordict"),
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
    ("copyreg", "__newobj__"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
    ("torch", "Size"),
    ("torch", "device"),
    ("datetime", "datetime"),
    ("datetime", "date"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("tensordict._td", "TensorDict"),
    ("tensordict.tensordict", "TensorDict"),
    # TensorDict's copyreg reduction: cls.__new__(cls) + __setstate__(state); cls is itself
    # resolved through this allow-list, so only TensorDict can be built.
    ("tensordict._reductions", "_make_td"),
}


def allow_global(module: str, name: str) -> None:
    """Allow ``module.name`` in the safe loader (for your own small, trusted types)."""
    _ALLOWED.add((module, name))


def is_allowed(module: str, name: str) -> bool:
    return (module, name) in _ALLOWED or (module, name) in batch_class_names()


class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only allow-listed globals (see module docstring)."""

    def __init__(self, file: BinaryIO, *, source: str = "<stream>") -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        if is_allowed(module, name):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(importlib.import_module("torch"), name, None)
            if isinstance(value, torch.dtype):
                return value
        raise UnsafePickleError(
            f"{self._source}: refusing to load global {module}.{name}: the safe loader only "
            f"allows what rollout_mock writes (tensors, arrays, plain containers, registered "
            f"batch classes). If you trust this dump, load it with trust_pickle: true in the "
            f"config, trusted=True in rollout_mock.load_step, or --trust on the command line; "
            f"for your own batch class, call rollout_mock.register_batch_class(cls).",
            path=self._source,
        )


def load(file: BinaryIO, *, trusted: bool, source: str = "<stream>") -> Any:
    """Unpickle one object from ``file``; restricted unless ``trusted``."""
    if trusted:
        return pickle.Unpickler(file).load()
    return SafeUnpickler(file, source=source).load()
