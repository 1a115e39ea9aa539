"""The trusted path: everything that runs pickle, kept apart from the safe loader (which never
imports this module).

* :func:`loads` is what a trusted load (``trust_pickle: true``, ``trusted=True``, ``--trust``)
  hands the decoder to read opaque pickle blobs of format 2 and whole format-1 files.
* FORMAT 1 (legacy): batches as standard protocol-5 pickles. New dumps use format 2; this writer
  is kept so that tests can produce format-1 files exactly as older releases did
  (:func:`dump_v1`), and its ``_rebuild_*`` functions are what ``pickle.load`` of a format-1 file
  calls (the safe path interprets format-1 files without them, see
  :mod:`rollout_mock.codec.legacy`). They are reached as ``rollout_mock.codec._rebuild_*``.

A format-1 step file is an ordinary pickle (protocol 5): ``pickle.load(open(path, "rb"))`` returns the
batch as long as ``rollout_mock`` is importable. What made it fast:

* tensors and numpy arrays are reduced to a small rebuild call whose argument is a
  :class:`pickle.PickleBuffer` over their raw bytes. The C pickler streams such a buffer straight
  to the file (no copy), and the C unpickler ``readinto``-s it straight into a fresh
  ``bytearray`` that the tensor then wraps (no copy). bfloat16 and other dtypes without a numpy
  twin take the same path: the bytes are viewed as ``uint8``;
* verl's ``DataProto`` (and other registered batch classes) are reduced to their attributes, so
  its own ``__getstate__`` (which ``torch.save``-s the TensorDict into a bytes object) is skipped;
* ``cloudpickle`` is the base pickler, so lambdas and classes defined in ``__main__`` or inside
  functions still pickle (they need a trusted load).

As everywhere, a step holds data: ``requires_grad`` in a format-1 file is ignored on load.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, BinaryIO

import cloudpickle
import numpy as np
import torch

from rollout_mock.batch import is_batch_class, keyed_codec
from rollout_mock.codec.encode import tensor_bytes
from rollout_mock.codec.format import PROTOCOL
from rollout_mock.codec.legacy import FORMAT1_KEYED, format1_keyed

__all__ = ["REBUILD_FUNCTIONS", "dtype_name", "dump_v1", "dumps_v1", "loads", "torch_dtype"]


_TORCH_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in vars(torch).values()
    if isinstance(dtype, torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise pickle.UnpicklingError(f"unknown torch dtype {name!r} in step file") from None


# --------------------------------------------------------------------------- rebuild functions
# These module-level functions are what step files reference; their names and signatures are
# part of the on-disk format (see FORMAT_VERSION in rollout_mock.storage.manifest). Never rename them.


def _as_uint8(buffer: Any) -> torch.Tensor:
    view = memoryview(buffer)
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if view.readonly:
        # bytes (a readonly buffer) cannot be shared with a writable tensor: copy once.
        return torch.frombuffer(bytearray(view), dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


def _rebuild_tensor(
    buffer: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool = False
) -> torch.Tensor:
    """Rebuild a CPU tensor from its raw bytes without copying them (``requires_grad`` is ignored)."""
    flat = _as_uint8(buffer)
    target = torch_dtype(dtype)
    if flat.numel() == 0:
        return torch.empty(shape, dtype=target)
    return flat.view(target).reshape(shape)


def _rebuild_parameter(
    buffer: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool = True
) -> torch.nn.Parameter:
    return torch.nn.Parameter(_rebuild_tensor(buffer, dtype, shape), requires_grad=False)


def _rebuild_ndarray(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Rebuild a numpy array from its raw bytes without copying them."""
    np_dtype = np.dtype(dtype)
    view = memoryview(buffer)
    if view.readonly:
        view = memoryview(bytearray(view))
    return np.frombuffer(view, dtype=np_dtype).reshape(shape)


def _rebuild_object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Rebuild a numpy object array; elements (which may themselves be sequences) are kept as-is."""
    return np.fromiter(items, dtype=object, count=len(items)).reshape(shape)


def _rebuild_np_scalar(dtype: str, raw: bytes) -> np.generic:
    return np.frombuffer(raw, dtype=np.dtype(dtype))[0].copy()


def _rebuild_tensordict(
    items: dict[str, Any], batch_size: list[int], device: str | None, names: list[str | None] | None
) -> Any:
    """Format 1's call for an instance of the :data:`FORMAT1_KEYED` class: its keyed items (tensors
    or nested instances) and head, built by the registered class's ``build``."""
    keyed = format1_keyed()
    node = {"$": FORMAT1_KEYED, "batch_size": list(batch_size), "device": device, "names": names}
    keyed.check(node)
    return keyed.build(node, items, lambda: None)


def _rebuild_object(cls: type, state: dict[str, Any]) -> Any:
    """Rebuild a registered batch class from its attribute dict, bypassing ``__setstate__``."""
    obj: Any = cls.__new__(cls)  # type: ignore[call-overload]
    obj.__dict__.update(state)
    return obj


# Step files name these functions as ``rollout_mock.codec.<name>``: keep that path whatever
# module defines them (the package re-exports them).
for _rebuild in (_rebuild_tensor, _rebuild_parameter, _rebuild_ndarray, _rebuild_object_array,
                 _rebuild_np_scalar, _rebuild_tensordict, _rebuild_object):
    _rebuild.__module__ = "rollout_mock.codec"
del _rebuild


REBUILD_FUNCTIONS = {f.__name__: f for f in (_rebuild_tensor, _rebuild_parameter, _rebuild_ndarray,
                                                _rebuild_object_array, _rebuild_np_scalar, _rebuild_tensordict,
                                                _rebuild_object)}


# --------------------------------------------------------------------------- reduction
def _plain_dense(tensor: torch.Tensor) -> bool:
    return (
        tensor.layout is torch.strided
        and not tensor.is_quantized
        and not getattr(tensor, "is_nested", False)
        and tensor.device.type != "meta"
    )


class _BatchPickler(cloudpickle.Pickler):
    """cloudpickle with fast reductions for tensors, arrays and registered batch classes."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self._keep_alive: list[Any] = []

    def _buffer_of(self, array: np.ndarray) -> pickle.PickleBuffer:
        buffer = pickle.PickleBuffer(memoryview(array))  # type: ignore[arg-type]
        self._keep_alive.append(buffer)
        return buffer

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if _plain_dense(obj):
                return self._reduce_tensor(obj)
        elif cls is np.ndarray:
            reduced = self._reduce_ndarray(obj)
            if reduced is not None:
                return reduced
        elif isinstance(obj, np.generic) and cls.__module__ == "numpy" and obj.dtype.kind != "O":
            if obj.dtype.fields is None:
                return _rebuild_np_scalar, (obj.dtype.str, obj.tobytes())
        elif (keyed := keyed_codec(cls)) is not None and keyed.tag == FORMAT1_KEYED:
            head, items, _ = keyed.parts(obj, "")  # its items, batch size, names and CPU device are all it is
            return _rebuild_tensordict, (dict(items), head["batch_size"], head["device"], head["names"])
        elif is_batch_class(cls) and hasattr(obj, "__dict__"):
            return _rebuild_object, (cls, dict(obj.__dict__))
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor: torch.Tensor) -> Any:
        flat, _ = tensor_bytes(tensor)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        buffer = self._buffer_of(raw.numpy())
        args = (buffer, dtype_name(tensor.dtype), tuple(tensor.shape), tensor.requires_grad)
        if type(tensor) is torch.nn.Parameter:
            return _rebuild_parameter, args
        return _rebuild_tensor, args

    def _reduce_ndarray(self, array: np.ndarray) -> Any:
        if array.dtype.hasobject:
            if array.dtype.kind != "O":
                return None  # structured dtypes holding objects: numpy's own reduction
            return _rebuild_object_array, (array.reshape(-1).tolist(), array.shape)
        if array.dtype.fields is not None or array.dtype.kind == "V":
            return None
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
        return _rebuild_ndarray, (self._buffer_of(raw), array.dtype.str, array.shape)


# --------------------------------------------------------------------------- public functions
def dump_v1(obj: Any, file: BinaryIO) -> None:
    """Pickle ``obj`` into ``file`` with tensor data streamed in-band, without copies.

    ``file`` should be unbuffered or lightly buffered: large tensor payloads are handed to its
    ``write`` directly.
    """
    _BatchPickler(file).dump(obj)


def dumps_v1(obj: Any) -> bytes:
    buffer = io.BytesIO()
    dump_v1(obj, buffer)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """Plain ``pickle.loads``: what a trusted load reads opaque blobs and format-1 files with.
    Only for dumps you trust: unpickling can run any code the file names."""
    return pickle.loads(data)
