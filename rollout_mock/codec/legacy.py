"""Reading format-1 step files (protocol-5 pickles) safely, without running pickle.

A small interpreter of the pickle opcodes that format-1 writers emitted: PROTO/FRAME, constants,
strings, bytes (in-band ``BINBYTES*``/``BYTEARRAY8``), lists/tuples/dicts/sets, the memo, and
``GLOBAL``/``STACK_GLOBAL`` + ``REDUCE`` only for rollout_mock's own ``_rebuild_*`` functions and
a fixed set of builtin data types, each called through a validating factory here (never the
object the name resolves to). ``BUILD``, ``NEWOBJ``, ``NEWOBJ_EX``, ``INST``, ``OBJ``, ``EXT*``,
``PERSID`` and out-of-band buffers are refused with :class:`UnsafePickleError`.

Resource bounds: every allocation is checked before it happens (``prod(shape) * itemsize`` must
equal the buffer length; bytes copied by factories count against a budget of a few times the
file size), containers may nest at most :data:`MAX_NESTING` deep, and the finished object is
walked once, counting every visit of a shared object again, so a few hundred bytes of shared
tuples cannot expand into a tree that takes minutes to traverse.
"""

from __future__ import annotations

import collections
import datetime
import io
import math
import pickletools
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import KeyedCodec, keyed_codec, keyed_codec_of_tag
from rollout_mock.codec.classes import batch_class_names, build_batch
from rollout_mock.codec.decode import OPT_IN
from rollout_mock.codec.format import MAX_NDIM, TORCH_DTYPES, KeyBudget, check_keys, numpy_dtype
from rollout_mock.errors import UnsafePickleError

__all__ = ["MAX_NESTING", "load_v1"]

MAX_NESTING = 200
_REFUSED = {"BUILD", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID",
            "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER"}


class _Global:
    """A global named by the file that is not one of the data types below (never resolved)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


class _Factory:
    def __init__(self, name: str) -> None:
        self.name = name


_TYPES: dict[tuple[str, str], Any] = {
    **{("builtins", t.__name__): t for t in (set, frozenset, complex, slice, range, bytearray, list, dict,
                                             tuple, int, float, str, bool)},
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "deque"): collections.deque,
    ("collections", "Counter"): collections.Counter,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    **{("datetime", t.__name__): t for t in (datetime.datetime, datetime.date, datetime.time,
                                             datetime.timedelta, datetime.timezone)},
    **{("torch", name): dtype for name, dtype in TORCH_DTYPES.items()},
}
_FACTORIES = {"_rebuild_tensor", "_rebuild_parameter", "_rebuild_ndarray", "_rebuild_object_array",
              "_rebuild_np_scalar", "_rebuild_tensordict", "_rebuild_object"}
_SEQ = (list, tuple, set, frozenset)

#: The keyed class (:class:`rollout_mock.batch.KeyedCodec`, registered by an adapter) whose
#: instances format 1 writes as a ``_rebuild_tensordict`` call: its tag, a name of the file format.
FORMAT1_KEYED = "tensordict"


def format1_keyed() -> KeyedCodec:
    """The registered :data:`FORMAT1_KEYED` class: a file of format 1 holds one."""
    keyed = keyed_codec_of_tag(FORMAT1_KEYED)
    if keyed is None:
        raise ValueError(f"a format-1 file holds a {FORMAT1_KEYED!r} instance and no adapter registers that class "
                         "(rollout_mock.adapters.frameworks does)")
    return keyed


def _fail(message: str) -> ValueError:
    return ValueError(message)


def _shape(value: Any) -> list[int]:
    if not isinstance(value, (tuple, list, torch.Size)) or len(value) > MAX_NDIM:
        raise _fail(f"bad shape {value!r:.80}")
    if any(type(d) is not int or d < 0 for d in value):
        raise _fail(f"bad shape {value!r:.80}")
    return list(value)


class _Machine:
    def __init__(self, data: bytes, name: str, batch_class: type | None) -> None:
        self.data = data
        self.name = name
        self.batch_class = batch_class
        self.budget = 4 * len(data) + (64 << 20)  # bytes factories may copy
        self.depth: dict[int, int] = {}
        self.keep: list[Any] = []
        self.keys = KeyBudget()

    def _spend(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise _fail("the file asks for far more memory than its size justifies")

    def _nest(self, container: Any, children: Any) -> Any:
        depth = 1 + max((self.depth.get(id(c), 0) for c in children), default=0)
        if depth > MAX_NESTING:
            raise _fail(f"containers nested deeper than {MAX_NESTING}")
        if depth > self.depth.get(id(container), 0):
            self.depth[id(container)] = depth
        self.keep.append(container)
        return container

    def _unsafe(self, what: str) -> UnsafePickleError:
        return UnsafePickleError(
            f"{self.name}: refusing {what}: the safe loader only reads what rollout_mock writes "
            f"(tensors, arrays, plain containers, batch classes). If you trust this dump, load it "
            f"with {OPT_IN}.",
            path=self.name,
        )

    # ------------------------------------------------------------------ globals and calls
    def find(self, module: str, name: str) -> Any:
        if module == "rollout_mock.codec" and name in _FACTORIES:
            return _Factory(name)
        if (module, name) in _TYPES:
            return _TYPES[(module, name)]
        return _Global(module, name)

    def call(self, func: Any, args: Any) -> Any:
        if type(args) is not tuple:
            raise _fail("REDUCE arguments are not a tuple")
        if isinstance(func, _Factory):
            return getattr(self, func.name)(*args)
        if isinstance(func, _Global):
            raise self._unsafe(f"to call global {func!r}")
        if isinstance(func, type) or isinstance(func, torch.dtype):
            return self._construct(func, args)
        raise self._unsafe(f"to call {type(func).__name__} {func!r:.60}")

    def _construct(self, cls: Any, args: tuple[Any, ...]) -> Any:
        if cls in (set, frozenset, list, tuple, collections.deque) and len(args) <= 2:
            if args and not isinstance(args[0], _SEQ):
                raise _fail(f"{cls.__name__} from {type(args[0]).__name__}")
            if len(args) == 2 and not (cls is collections.deque and (args[1] is None or type(args[1]) is int)):
                raise _fail("bad arguments")
            self._spend(8 * (len(args[0]) if args else 0))
            if args and cls in (set, frozenset):
                check_keys(args[0])
            return self._nest(cls(*args), args[0] if args else ())
        if cls in (dict, collections.OrderedDict, collections.Counter) and len(args) <= 1:
            if args and not isinstance(args[0], (dict, list, tuple)):
                raise _fail(f"{cls.__name__} from {type(args[0]).__name__}")
            self._spend(16 * (len(args[0]) if args else 0))
            if args:
                check_keys(list(args[0]) if isinstance(args[0], dict) else [p[0] for p in args[0]])
            out = cls(*args)
            return self._nest(out, [*out.keys(), *out.values()])
        if cls is collections.defaultdict and len(args) <= 1:
            if args and args[0] not in (None, list, dict, set, int, float, str, tuple, bool, complex):
                raise _fail("defaultdict with an unsupported default factory")
            return self._nest(cls(*args), ())
        if cls is bytearray:
            if not args:
                return bytearray()
            if len(args) != 1 or not isinstance(args[0], (bytes, bytearray)):
                raise _fail("bytearray only from bytes")
            self._spend(len(args[0]))
            return bytearray(args[0])
        if cls is complex and len(args) <= 2 and all(type(a) in (int, float) for a in args):
            return complex(*args)
        if cls in (slice, range) and 1 <= len(args) <= 3 \
                and all(type(a) is int or (cls is slice and a is None) for a in args):
            return cls(*args)
        if cls is torch.Size and len(args) == 1 and isinstance(args[0], (tuple, list)):
            return torch.Size(_shape(args[0]))
        if cls is torch.device and 1 <= len(args) <= 2 and type(args[0]) is str and len(args[0]) <= 16 \
                and (len(args) == 1 or (type(args[1]) is int and 0 <= args[1] < 4096)):
            return torch.device(*args)
        if cls in (datetime.datetime, datetime.date, datetime.time) and 1 <= len(args) <= 2 \
                and type(args[0]) is bytes and len(args[0]) <= 10 \
                and (len(args) == 1 or args[1] is None or type(args[1]) is datetime.timezone):
            return cls(*args)
        if cls is datetime.timedelta and len(args) <= 3 and all(type(a) is int for a in args):
            return cls(*args)
        if cls is datetime.timezone and 1 <= len(args) <= 2 and type(args[0]) is datetime.timedelta \
                and (len(args) == 1 or type(args[1]) is str):
            return cls(*args)
        raise self._unsafe(f"to call {getattr(cls, '__qualname__', cls)!s:.60} with these arguments")

    # ------------------------------------------------------------------ rollout_mock factories
    def _buffer(self, buffer: Any, nbytes: int) -> Any:
        if type(buffer) not in (bytes, bytearray) or len(buffer) != nbytes:
            raise _fail(f"buffer of {len(buffer) if isinstance(buffer, (bytes, bytearray)) else '?'} bytes, "
                        f"shape and dtype need {nbytes}")
        if type(buffer) is bytes:
            self._spend(nbytes)
            return bytearray(buffer)
        return buffer

    def _rebuild_tensor(self, buffer: Any, dtype: Any, shape: Any, requires_grad: Any = False) -> torch.Tensor:
        if dtype not in TORCH_DTYPES or type(requires_grad) is not bool:
            raise _fail(f"bad tensor dtype {dtype!r:.40}")
        target, dims = TORCH_DTYPES[dtype], _shape(shape)
        nbytes = math.prod(dims) * target.itemsize
        raw = self._buffer(buffer, nbytes)
        if nbytes == 0:
            tensor = torch.zeros(dims, dtype=target)
        else:
            flat = torch.frombuffer(raw, dtype=torch.uint8)
            if target is torch.bool and bool((flat > 1).any()):
                raise _fail("bool tensor holds bytes other than 0 and 1")
            tensor = flat.view(target).reshape(dims)
        return tensor  # requires_grad is ignored: a step holds data, not autograd state

    def _rebuild_parameter(self, buffer: Any, dtype: Any, shape: Any, requires_grad: Any = True) -> Any:
        if type(requires_grad) is not bool:
            raise _fail("bad requires_grad")
        return torch.nn.Parameter(self._rebuild_tensor(buffer, dtype, shape), requires_grad=False)

    def _rebuild_ndarray(self, buffer: Any, dtype: Any, shape: Any) -> np.ndarray:
        np_dtype, dims = numpy_dtype(dtype), _shape(shape)
        nbytes = math.prod(dims) * np_dtype.itemsize
        raw = self._buffer(buffer, nbytes)
        if nbytes == 0:
            return np.zeros(dims, dtype=np_dtype)
        return np.frombuffer(raw, dtype=np_dtype).reshape(dims)

    def _rebuild_object_array(self, items: Any, shape: Any) -> np.ndarray:
        dims = _shape(shape)
        if type(items) is not list or math.prod(dims) != len(items):
            raise _fail("object array items do not match its shape")
        self._spend(8 * len(items))
        array = np.empty(len(items), dtype=object)
        for i, x in enumerate(items):
            array[i] = x
        return self._nest(array.reshape(dims), items)

    def _rebuild_np_scalar(self, dtype: Any, raw: Any) -> Any:
        np_dtype = numpy_dtype(dtype)
        if type(raw) is not bytes or len(raw) != np_dtype.itemsize:
            raise _fail("numpy scalar size mismatch")
        return np.frombuffer(raw, dtype=np_dtype)[0].copy()

    def _rebuild_tensordict(self, items: Any, batch_size: Any, device: Any, names: Any) -> Any:
        keyed = format1_keyed()
        if type(items) is not dict or any(type(k) is not str for k in items):
            raise _fail(f"bad {FORMAT1_KEYED} items")
        for value in items.values():
            if not isinstance(value, torch.Tensor) and keyed_codec(type(value)) is not keyed:
                raise _fail(f"{FORMAT1_KEYED} items must be tensors or {FORMAT1_KEYED} instances")
        node = {"$": FORMAT1_KEYED, "batch_size": _shape(batch_size), "device": device, "names": names}
        keyed.check(node)
        return keyed.build(node, items, lambda: None)

    def _rebuild_object(self, cls: Any, state: Any) -> Any:
        if not isinstance(cls, _Global):
            raise self._unsafe(f"to rebuild {getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)} "
                               f"from an attribute dict: only batch classes may be")
        if type(state) is not dict or any(type(k) is not str for k in state):
            raise _fail("bad _rebuild_object arguments")
        path = f"{cls.module}:{cls.name}"
        for layout, names in (("public", ("batch", "non_tensor_batch", "meta_info")),
                              ("private", ("_batch", "_non_tensor_batch", "meta_info"))):
            if all(n in state for n in names):
                fields = dict(zip(("batch", "non_tensor_batch", "meta_info"), (state[n] for n in names)))
                extra = {k: v for k, v in state.items() if k not in names}
                return build_batch("dataproto", path, layout, fields, extra, batch_class=self.batch_class)
        if (cls.module, cls.name) not in batch_class_names():
            raise self._unsafe(f"to rebuild {cls!r} from an attribute dict: only registered batch classes "
                               f"(rollout_mock.register_batch_class) or DataProto-like states may be")
        return build_batch("object", path, "dict", {}, state, batch_class=self.batch_class)

    # ------------------------------------------------------------------ the interpreter
    def run(self) -> Any:
        stack: list[Any] = []
        marks: list[list[Any]] = []
        memo: dict[int, Any] = {}

        def pop_mark() -> list[Any]:
            nonlocal stack
            items, stack = stack, marks.pop()
            return items

        items: Any
        arg: Any
        for opcode, arg, _pos in pickletools.genops(io.BytesIO(self.data)):
            op = opcode.name
            if op in _REFUSED:
                raise self._unsafe(f"pickle opcode {op} (rollout_mock never writes it)")
            if op in ("PROTO", "FRAME"):
                if op == "PROTO" and not 2 <= arg <= 5:
                    raise _fail(f"pickle protocol {arg}")
            elif op == "STOP":
                if len(stack) != 1 or marks:
                    raise _fail("unbalanced pickle stack at STOP")
                return stack[0]
            elif op == "MARK":
                marks.append(stack)
                stack = []
            elif op == "POP":
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif op == "POP_MARK":
                pop_mark()
            elif op == "DUP":
                stack.append(stack[-1])
            elif op in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[op])
            elif op in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                        "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
                        "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8"):
                stack.append(bytearray(arg) if op == "BYTEARRAY8" and type(arg) is not bytearray else arg)
            elif op in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
                stack.append({"EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_SET": set}[op]())
            elif op == "EMPTY_TUPLE":
                stack.append(())
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(op[-1])
                if len(stack) < n:
                    raise _fail("stack underflow")
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(self._nest(items, items))
            elif op in ("TUPLE", "LIST", "FROZENSET"):
                items = pop_mark()
                kind = {"TUPLE": tuple, "LIST": list, "FROZENSET": frozenset}[op]
                if kind is frozenset:
                    check_keys(items)
                stack.append(self._nest(kind(items), items))
            elif op == "DICT":
                items = pop_mark()
                check_keys(items[::2])
                stack.append(self._nest(dict(zip(items[::2], items[1::2], strict=True)), items))
            elif op in ("APPEND", "APPENDS"):
                items = [stack.pop()] if op == "APPEND" else pop_mark()
                target = stack[-1]
                if type(target) is not list:
                    raise _fail(f"{op} to a {type(target).__name__}")
                target.extend(items)
                self._nest(target, items)
            elif op in ("SETITEM", "SETITEMS"):
                items = stack[-2:] if op == "SETITEM" else pop_mark()
                if op == "SETITEM":
                    del stack[-2:]
                target = stack[-1]
                if type(target) not in (dict, collections.OrderedDict, collections.defaultdict, collections.Counter):
                    raise _fail(f"{op} on a {type(target).__name__}")
                self.keys.add(target, items[::2])
                for key, value in zip(items[::2], items[1::2], strict=True):
                    self._nest(target, (key, value))
                    dict.__setitem__(target, key, value)
            elif op == "ADDITEMS":
                items = pop_mark()
                if type(stack[-1]) is not set:
                    raise _fail("ADDITEMS to a non-set")
                self.keys.add(stack[-1], items)
                self._nest(stack[-1], items)
                stack[-1].update(items)
            elif op in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memo[len(memo) if op == "MEMOIZE" else int(arg)] = stack[-1]
            elif op in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[int(arg)])
            elif op == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                stack.append(self.find(module, name))
            elif op == "STACK_GLOBAL":
                name, module = stack.pop(), stack.pop()
                if type(name) is not str or type(module) is not str:
                    raise _fail("STACK_GLOBAL of non-strings")
                stack.append(self.find(module, name))
            elif op == "REDUCE":
                args = stack.pop()
                stack[-1] = self.call(stack[-1], args)
            else:
                raise self._unsafe(f"pickle opcode {op} (not in the format-1 subset)")
        raise _fail("pickle stream without STOP")

    def check(self, root: Any) -> None:
        """Walk the result once, counting shared objects at each use; refuse leftovers."""
        visits = 8 * len(self.data) + 100_000
        todo: list[tuple[Any, int]] = [(root, 0)]
        while todo:
            obj, depth = todo.pop()
            visits -= 1
            if visits < 0:
                raise _fail("the object graph expands to far more objects than the file holds "
                            "(shared references used as a size bomb)")
            if depth > MAX_NESTING:
                raise _fail(f"containers nested deeper than {MAX_NESTING}")
            if isinstance(obj, (_Global, _Factory)):
                raise self._unsafe(f"global {getattr(obj, 'module', 'rollout_mock.codec')}."
                                   f"{obj.name} as a value")
            if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
                todo.extend((x, depth + 1) for x in obj)
            elif isinstance(obj, dict):
                todo.extend((x, depth + 1) for pair in obj.items() for x in pair)
            elif type(obj) is np.ndarray and obj.dtype.kind == "O":
                todo.extend((x, depth + 1) for x in obj.reshape(-1))
            elif hasattr(obj, "__dict__") and type(obj).__module__ not in ("torch", "numpy", "tensordict._td"):
                state = object.__getattribute__(obj, "__dict__")
                if isinstance(state, dict):
                    todo.extend((x, depth + 1) for x in state.values())


def load_v1(data: Any, *, name: str = "<stream>", batch_class: type | None = None) -> Any:
    """Decode a format-1 step file without unpickling (see module docstring)."""
    machine = _Machine(bytes(data), name, batch_class)
    result = machine.run()
    machine.check(result)
    return result
