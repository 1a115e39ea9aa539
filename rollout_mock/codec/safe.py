"""The safe loader's compatibility surface (``load``, ``OPT_IN``, ``is_allowed``).

Since format 2 the safe path runs no unpickler at all (see :mod:`rollout_mock.codec.step` and
:mod:`rollout_mock.codec.legacy`). The history below describes what the former restricted
unpickler allowed; :data:`_ALLOWED` is now only informational (and the list of builtin data
types the format-1 interpreter knows).

Former design:

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

import warnings
from typing import Any, BinaryIO

from rollout_mock.codec.batches import batch_class_names

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
    """Deprecated: the safe loader no longer resolves globals at all.

    Format-2 files hold no globals; format-1 files are read by a data-only interpreter that only
    knows rollout_mock's own rebuild functions and builtin data types. Register batch classes
    with :func:`rollout_mock.register_batch_class` instead; anything else needs a trusted load.
    """
    warnings.warn(
        "rollout_mock.codec.safe.allow_global is deprecated and has no effect on the safe loader; "
        "use register_batch_class for batch classes or a trusted load",
        DeprecationWarning, stacklevel=2,
    )
    _ALLOWED.add((module, name))


def is_allowed(module: str, name: str) -> bool:
    return (module, name) in _ALLOWED or (module, name) in batch_class_names()


def load(file: BinaryIO | Any, *, trusted: bool, source: str = "<stream>") -> Any:
    """Decode one step (format 1 or 2) from a binary file object; restricted unless ``trusted``.

    Safe mode never unpickles: format 2 is parsed as data, format 1 is interpreted by
    :mod:`rollout_mock.codec.legacy`. Prefer :func:`rollout_mock.codec.decode` with a ByteSource.
    """
    from rollout_mock.codec.source import BytesSource
    from rollout_mock.codec.step import decode

    data = file.read()
    return decode(BytesSource(data, source), trusted=trusted)
