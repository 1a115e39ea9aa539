"""The batch model: what a batch is, for every type rollout_mock records — the one home of it.

A batch has rows (samples along its first dimension), keys (its named columns) and a type that
must survive a round trip. For every batch type, this module answers: how many rows
(:func:`count_samples`), which keys (:func:`batch_keys`, :func:`describe_keys` for the manifest),
its columns (:func:`batch_columns`), its named parts as structural walks see them
(:func:`batch_parts`, :func:`rebuild`), its per-batch metadata (:func:`batch_meta`), which rows
were rejected (``None`` items, :func:`rejected_count`), a new batch of some rows
(:func:`take_rows`), of some keys (:func:`select_keys`) and one batch of several
(:func:`concat`). Every other module asks here; none detects a framework's class itself.

A type is a :class:`BatchType` in one registry. Built in, in the order they are recognised
(:func:`batch_type_of`), after every registered type:

* lists (AReaL's trajectories, slime's samples; ``None`` = a rejected item, still a row): rows
  are items, keys those of the items (``[*].key`` in :func:`describe_keys`);
* tuples (each element that has the same rows is cut alike);
* tensors (strided and jagged nested tensors included: their first dimension is the row count)
  and numpy arrays;
* mappings of columns sharing a first dimension (other values are per-batch metadata, kept).

Framework adapters register their own types with :func:`register_batch_type` (checked before
the built-in ones, latest first): ``rollout_mock.adapters.frameworks`` registers DataProto-like
objects (verl's, ROLL's, the demo's), TensorDicts and slime records, and ``import rollout_mock``
imports it, whatever the user imports. :func:`register_batch_class` names a class the safe
loader may rebuild field by field (a :class:`BatchType` lists its own in ``classes``). A type
whose classes are made of parts (a TensorDict's keyed entries, the value a wrapper holds, the
items of a stack) tells the codec how to write and rebuild them as data in ``codec``
(:class:`KeyedCodec`, one or several).

Importing this module imports neither torch nor numpy: a tensor or an array can only exist once
its library is imported, so the checks look the library up in :data:`sys.modules`.

A framework fills its batches its own way: where the rollout's log-probs are, what a sample is,
how a trace reads. Each adapter registers that as a :class:`Layout` (:func:`register_layout`);
traces, the log-prob check and the report look it up (:func:`layout_of`, :func:`logprob_keys`,
:func:`layout_of_key`) and name no framework.

:func:`dataproto_fields` reads the instance state of a DataProto-like object without running any
of its code; the codec's safe format and the adapters' DataProto type share it.

Manifest summaries (type, sample count, keys with shapes and dtypes) are computed from the live
batch in dump mode, so that listing a dump never unpickles anything.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

from rollout_mock.errors import RolloutMockError

__all__ = [
    "BatchType", "Layout", "batch_class_names", "batch_columns", "batch_keys", "batch_meta", "batch_parts",
    "batch_type_of", "column_name", "concat", "count_samples", "dataproto_fields", "describe_keys", "instance_state",
    "KeyedCodec", "is_array", "is_batch_class", "is_tensor", "keyed_codec", "keyed_codec_of_tag", "layout_of",
    "layout_of_key", "leading_dim", "logprob_keys", "meta_part_names", "rebuild", "register_batch_class",
    "register_batch_type", "register_layout", "register_step_name", "rejected_count", "select_keys", "step_names",
    "subset", "take_columns", "take_rows", "type_name",
]

_MAX_KEYS = 256
_DATAPROTO_LAYOUTS = (
    ("public", ("batch", "non_tensor_batch", "meta_info")),
    ("private", ("_batch", "_non_tensor_batch", "meta_info")),  # ROLL >= 0.3
)


def type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def is_tensor(value: Any) -> bool:
    """A ``torch.Tensor`` (without importing torch: none exists before torch is imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_array(value: Any) -> bool:
    """A ``numpy.ndarray`` (without importing numpy)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def leading_dim(value: Any) -> int | None:
    """The first dimension of a tensor or array (``None`` for scalars and other values).

    Nested tensors have no ``shape`` in the strided layout ("NestedTensorImpl doesn't support
    sizes"); their first dimension (the number of components) is ``size(0)`` in both layouts.
    """
    if is_tensor(value):
        return int(value.size(0)) if value.dim() else None
    if is_array(value):
        return int(value.shape[0]) if value.ndim else None
    return None


def _shape(value: Any) -> list[int | None]:
    """A tensor's shape; ragged dimensions of a nested tensor (strided or jagged) are ``None``."""
    if not value.is_nested:
        return [int(d) for d in value.shape]
    out: list[int | None] = []
    for dim in range(value.dim()):
        try:
            size = value.size(dim)
        except RuntimeError:  # a ragged dimension of a strided nested tensor
            size = None
        out.append(size if type(size) is int else None)  # jagged: a SymInt
    return out


def _leaf(value: Any) -> dict[str, Any] | None:
    if is_tensor(value):
        return {"shape": _shape(value), "dtype": str(value.dtype).removeprefix("torch.")}
    if is_array(value):
        return {"shape": list(value.shape), "dtype": value.dtype.name}
    return None


def instance_state(obj: Any) -> dict[str, Any] | None:
    """An instance's attribute dict, read without running any code of the object (no property,
    ``__getattr__`` or ``__getattribute__`` override); ``None`` for classes, builtins and objects
    without a ``__dict__`` dict. The one way the batch model and redaction look into an object."""
    if isinstance(obj, type) or type(obj).__module__ == "builtins":
        return None
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return state if isinstance(state, dict) else None


def wrapped_value(obj: Any) -> tuple[Any, Callable[[Any], Any]] | None:
    """``(value, rewrap)`` of an object that only wraps a value — tensordict's ``NonTensorData``
    (its ``data``) and ``NonTensorStack`` (its nested list) —, ``rewrap`` making a new one of the
    same batch size and device around a replacement; ``None`` for anything else. How a walk
    (redaction) reaches the text of one that is not inside a TensorDict."""
    cls = type(obj)
    if not cls.__module__.startswith("tensordict"):
        return None
    if cls.__name__ == "NonTensorStack":
        return obj.tolist(), cls.from_list
    if cls.__name__ in ("NonTensorData", "MetaData"):
        return obj.data, lambda value: cls(data=value, batch_size=obj.batch_size, device=obj.device)
    return None


def dataproto_fields(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """``(layout, instance state)`` of a DataProto-like object, read from its ``__dict__`` only
    (no property, ``__getattr__`` or method of ``obj`` runs): ``layout`` is ``"public"``
    (``batch``, ``non_tensor_batch``, ``meta_info``) or ``"private"`` (ROLL >= 0.3:
    ``_batch``, ``_non_tensor_batch``, ``meta_info``). ``meta_info`` must be a dict, ``batch`` and
    ``non_tensor_batch`` ``None`` or mapping-like (a dict, a TensorDict). ``None`` for anything
    else (classes too, and an object whose parts are strings, lists or numbers: every command then
    treats it as an opaque value instead of failing on ``.items()``)."""
    state = instance_state(obj)
    if state is None:
        return None
    for layout, names in _DATAPROTO_LAYOUTS:
        if all(name in state for name in names) and isinstance(state[names[2]], dict) \
                and _mapping_like_or_none(state[names[0]]) and _mapping_like_or_none(state[names[1]]):
            return layout, state
    return None


def _mapping_like_or_none(value: Any) -> bool:
    """``None``, or an object whose class has ``keys`` and ``__getitem__`` (a dict, a TensorDict,
    ROLL's ``BatchProxy``): what a DataProto's ``batch`` and ``non_tensor_batch`` may be. A string
    or a list there (a hostile or damaged step) makes the object not DataProto-like, so no command
    calls ``.items()`` on it."""
    cls = type(value)
    return value is None or (callable(getattr(cls, "keys", None)) and callable(getattr(cls, "__getitem__", None))
                             and not isinstance(value, (str, bytes, type)))


# --------------------------------------------------------------------------- batch types
class BatchType(NamedTuple):
    """How one kind of batch is recognised, counted, cut, joined and read.

    Required:

    * ``matches(batch)``: whether ``batch`` is of this type (it must never run code of a
      possibly hostile object: no property, ``__getattr__`` or ``__len__``);
    * ``rows(batch)``: its samples (``None``: no batch dimension); this is the sample count;
    * ``take(batch, index)``: a new batch of the same type with rows ``index``, in that order
      (the input is not changed).

    Optional (``None``: the type does not support it, and the caller says so or skips it):

    * ``concat(batches)``: one batch of several of this type, rows in order;
    * ``columns(batch)``: its named columns (``{key: column}``), each with ``rows`` entries along
      its first dimension unless it is per-batch metadata (traces and the log-prob check read
      them); row-oriented types (lists) have none;
    * ``keys(batch)``: its key names (default: the names of its columns);
    * ``select(batch, keys)``: a new batch keeping only the columns ``keys`` (metadata is kept);
    * ``parts(batch)``: its named parts as structural walks see them (``diff``, ``--redact``,
      :func:`describe_keys`): e.g. a DataProto's ``batch``, ``non_tensor_batch`` and
      ``meta_info`` (default: its columns);
    * ``rebuild(batch, parts)``: the same batch with some parts replaced (a copy);
    * ``map_tensors(batch, fn)``: the batch with every tensor ``t`` it holds replaced by
      ``fn(t)`` (device placement), for a type whose parts cannot be replaced one by one (a
      TensorDict with a device moves its values back onto it): without it, placement goes
      through ``parts`` and ``rebuild``;
    * ``meta_key``: the part that holds per-batch metadata (a call's step may be there; it has
      no rows and :func:`describe_keys` leaves it out);
    * ``classes``: ``"module:qualname"`` of the classes of this type that the safe loader may
      rebuild field by field (see :func:`register_batch_class`);
    * ``dicts``: ``False`` declares that ``matches`` never accepts a plain ``dict`` (of exactly
      that class), so the batch model does not ask it about one: the walks over a list of sample
      dicts (:func:`describe_keys`) ask each registered type about every dict they reach.
    """

    name: str
    matches: Callable[[Any], bool]
    rows: Callable[[Any], int | None]
    take: Callable[[Any, list[int]], Any]
    concat: Callable[[list[Any]], Any] | None = None
    columns: Callable[[Any], dict[str, Any]] | None = None
    keys: Callable[[Any], list[str]] | None = None
    select: Callable[[Any, frozenset[str]], Any] | None = None
    parts: Callable[[Any], dict[str, Any]] | None = None
    rebuild: Callable[[Any, dict[str, Any]], Any] | None = None
    map_tensors: Callable[[Any, Callable[[Any], Any]], Any] | None = None
    meta_key: str | None = None
    classes: tuple[str, ...] = ()
    codec: KeyedCodec | tuple[KeyedCodec, ...] | None = None
    dicts: bool = True


class KeyedCodec(NamedTuple):
    """How the codec writes a class made of parts and rebuilds it, as data (no pickle): a header
    node ``{"$": tag, **head, PARTS, **tail}`` whose parts the codec encodes like any other value
    (tensors, nested instances of the class...). A :class:`BatchType` names it in ``codec``; the
    codec knows no such class by name. PARTS, by ``form``:

    * ``"keyed"``: ``"items": [[key, NODE], ...]``, keyed parts (a TensorDict's entries);
    * ``"data"``: ``"data": NODE``, the one value the instance wraps (tensordict's
      ``NonTensorData``);
    * ``"list"``: ``"items": [NODE, ...]``, a plain list of items (a stack of TensorDicts).

    Its members:

    * ``tag``: the node's tag in step files (a name of the file format: never change it);
    * ``classes``: ``"module:qualname"`` of the classes written this way (exactly these, no
      subclass);
    * ``parts(obj, path)``: ``(head, parts, tail)`` of an instance: plain JSON data, its parts
      (``"keyed"``: ``(str key, value)`` pairs; ``"data"``: the value; ``"list"``: the items),
      plain JSON data;
    * ``check(node)``: raise ``ValueError`` when a node's head or tail is malformed (the safe
      loader runs it on every such node of a file before anything is built);
    * ``build(node, parts, flush)``: the instance from a checked node (head and tail) and its
      decoded parts (a dict of the keyed parts, the value, or the list of items); ``flush()``
      completes the reads of the parts' data first, when ``build`` copies it;
    * ``rows(node, rows)``: ``(node, part_rows)`` for the rows ``rows`` (a ``slice``) of the
      instance's first dimension: the node with its head (or its list of items) changed, and the
      rows its parts are then read with (``None``: whole; keyed parts: ``rows``); ``None`` when it
      has no rows (a row selection leaves it whole);
    * ``class_keys``: keys of the node that need the header version of the structural classes
      (an older reader must refuse, not lose them);
    * ``form``: ``"keyed"`` (the default), ``"data"`` or ``"list"``, above.
    """

    tag: str
    classes: tuple[str, ...]
    parts: Callable[[Any, str], tuple[dict[str, Any], Any, dict[str, Any]]]
    check: Callable[[Mapping[str, Any]], None]
    build: Callable[[Mapping[str, Any], Any, Callable[[], None]], Any]
    rows: Callable[[Mapping[str, Any], slice], tuple[dict[str, Any], slice | None] | None]
    class_keys: tuple[str, ...] = ()
    form: str = "keyed"

    def write(self, obj: Any, path: str, node: Callable[[Any, str], Any]) -> dict[str, Any]:
        """The node of ``obj`` (``node(value, path)`` encodes one part)."""
        head, parts, tail = self.parts(obj, path)
        if self.form == "data":
            body: dict[str, Any] = {"data": node(parts, f"{path}.data")}
        elif self.form == "list":
            body = {"items": [node(item, f"{path}[{i}]") for i, item in enumerate(parts)]}
        else:
            body = {"items": [[k, node(v, f"{path}.{k}")] for k, v in parts]}
        return {"$": self.tag, **head, **body, **tail}

    def children(self, node: Mapping[str, Any]) -> list[Any]:
        """The part nodes of a node of this codec (``ValueError`` when it has none of its form;
        ``check`` validates the rest)."""
        if self.form == "data":
            return [node.get("data")]
        items = node.get("items")
        if type(items) is not list:
            raise ValueError(f"{self.tag} node without an items list")
        if self.form == "list":
            return items
        if any(type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str for pair in items):
            raise ValueError(f"{self.tag} node with a bad item: [str key, NODE] expected")
        return [v for _, v in items]

    def keys(self, node: Mapping[str, Any]) -> list[str]:
        """The keys of a checked node's keyed parts (other forms: none)."""
        return [k for k, _ in node["items"]] if self.form == "keyed" else []

    def read(self, node: Mapping[str, Any], value: Callable[[Any], Any], keys: frozenset[str] | None = None) -> Any:
        """The decoded parts of a checked node, as ``build`` takes them (``value`` decodes one part
        node; ``keys``: only these keyed parts)."""
        if self.form == "data":
            return value(node["data"])
        if self.form == "list":
            return [value(item) for item in node["items"]]
        return {k: value(v) for k, v in node["items"] if keys is None or k in keys}


_REGISTERED: list[BatchType] = []
#: The registered types that may match a plain ``dict`` (``BatchType.dicts``), in the same order.
_FOR_DICTS: list[BatchType] = []
_CLASSES: set[tuple[str, str]] = set()
#: The registered types' keyed codecs by class (a cache, emptied by each registration) and by tag.
_CODEC_OF_CLASS: dict[type, KeyedCodec | None] = {}
_CODEC_OF_TAG: dict[str, KeyedCodec] = {}
#: The names a batch's step goes by, in lookup order: rollout_mock's own ``global_step``, then
#: those adapters register (:func:`register_step_name`).
_STEP_NAMES: list[str] = ["global_step"]


def register_batch_type(batch_type: BatchType) -> BatchType:
    """Teach the batch model a type (checked before the built-in ones, latest first). Adapters
    call it at import; registering a type of the same ``name`` again replaces it."""
    _REGISTERED[:] = [t for t in _REGISTERED if t.name != batch_type.name]
    _REGISTERED.insert(0, batch_type)
    _FOR_DICTS[:] = [t for t in _REGISTERED if t.dicts]
    _CODEC_OF_CLASS.clear()
    _CODEC_OF_TAG.clear()
    _CODEC_OF_TAG.update((codec.tag, codec) for t in reversed(_REGISTERED) for codec in _codecs(t))
    return batch_type


def _codecs(batch_type: BatchType) -> tuple[KeyedCodec, ...]:
    codec = batch_type.codec
    return () if codec is None else (codec,) if isinstance(codec, KeyedCodec) else codec


def keyed_codec(cls: type) -> KeyedCodec | None:
    """The :class:`KeyedCodec` that writes instances of exactly ``cls``, else ``None``."""
    try:
        return _CODEC_OF_CLASS[cls]
    except KeyError:
        name = f"{cls.__module__}:{cls.__qualname__}"
        found = next((codec for t in _REGISTERED for codec in _codecs(t) if name in codec.classes), None)
        _CODEC_OF_CLASS[cls] = found
        return found


def keyed_codec_of_tag(tag: Any) -> KeyedCodec | None:
    """The :class:`KeyedCodec` whose nodes carry ``tag``, else ``None``."""
    return _CODEC_OF_TAG.get(tag) if type(tag) is str else None


def register_batch_class(cls: type) -> type:
    """Let the safe loader store instances of ``cls`` by their fields and rebuild them as ``cls``.

    DataProto-like classes (:func:`dataproto_fields`) are stored by their fields without
    registration; register other plain classes whose attribute dict is all their state, and
    classes that must load as themselves rather than as the codec's stand-in. Returns ``cls``
    (decorator use). A :class:`BatchType` names its own classes in ``classes``.
    """
    _CLASSES.add((cls.__module__, cls.__qualname__))
    return cls


def batch_class_names() -> frozenset[tuple[str, str]]:
    """``(module, qualname)`` of every class the safe loader may rebuild."""
    declared = {tuple(path.split(":", 1)) for t in _REGISTERED for path in t.classes}
    return frozenset(_CLASSES | cast(set[tuple[str, str]], declared))


def is_batch_class(cls: type) -> bool:
    return (cls.__module__, cls.__qualname__) in batch_class_names()


def meta_part_names() -> frozenset[str]:
    """The names of the registered batch types' metadata parts (``BatchType.meta_key``, e.g. a
    DataProto's ``meta_info``): where a call's step may sit, beside data that request matching
    compares."""
    return frozenset(t.meta_key for t in (*_REGISTERED, *_BUILTIN) if t.meta_key)


def register_step_name(name: str) -> str:
    """Let the step of a wrapped call also go by ``name``: a keyword argument, a positional
    parameter, or a key of a batch argument's metadata (:func:`batch_meta`). Adapters call it at
    import (``rollout_mock.adapters.frameworks``: ROLL's, verl's and slime's names); wrap/ looks
    the step up through :func:`step_names`. Registering a name again does nothing. Returns it."""
    if not isinstance(name, str) or not name.isidentifier():
        raise RolloutMockError(f"register_step_name: {name!r} is not a parameter name")
    if name not in _STEP_NAMES:
        _STEP_NAMES.append(name)
    return name


def step_names() -> tuple[str, ...]:
    """The names a call's step goes by, in lookup order (see :func:`register_step_name`)."""
    return tuple(_STEP_NAMES)


# --------------------------------------------------------------------------- framework layouts
class Layout(NamedTuple):
    """Where one framework keeps what the readers look for: the rollout's per-token log-probs,
    its samples, its traces. A batch type says what a batch *is* (a DataProto is verl's and
    ROLL's); a layout says how a framework *fills* it (verl's ``rollout_log_probs`` covers the
    response, ROLL's ``infer_logprobs`` the whole sequence but its first token). Adapters register
    one per framework (:func:`register_layout`); traces (``rollout_mock.compare.traces``), the
    log-prob check (``rollout_mock.debug.sequences``) and the report
    (``rollout_mock.debug.report_columns``) look them up, and name no framework themselves.

    Only ``name`` is required; ``None`` leaves a reading to the generic readers (columns, lists of
    column dicts):

    * ``logprob_keys``: the columns holding the rollout's per-token log-probs, best first
      (:func:`logprob_keys` orders every layout's); a columnar batch whose log-probs are found under
      one of them is of this layout (:func:`layout_of_key`);
    * ``matches(batch)``: a batch this framework holds its own way (not as columns, nor as a list
      of column dicts); the readers below then read it (:func:`layout_of`). Like a batch type's,
      it must never run code of a possibly hostile object;
    * ``traces(batch, limit, renderer)``: at most ``limit`` ``rollout_mock.compare.traces.Trace``
      objects (``renderer``: a ``rollout_mock.compare.trace_rows.Renderer``);
      ``count_traces(batch)``: how many the whole batch holds;
    * ``sequences(batch, keys)``: the log-prob check's ``rollout_mock.debug.sequences.Extraction``
      (``keys``: its ``LogprobKeys``);
    * ``view(batch)``: ``(batch, texts)``, the batch as the report reads it (columns, or a list of
      samples) and each row's text (``None``: read from the tokens).
    """

    name: str
    logprob_keys: tuple[str, ...] = ()
    matches: Callable[[Any], bool] | None = None
    traces: Callable[[Any, int, Any], list[Any]] | None = None
    count_traces: Callable[[Any], int | None] | None = None
    sequences: Callable[[Any, Any], Any] | None = None
    view: Callable[[Any], tuple[Any, list[str | None] | None]] | None = None


_LAYOUTS: list[Layout] = []


def register_layout(layout: Layout) -> Layout:
    """Teach the readers a framework's layout (adapters call it at import; registering a layout
    of the same ``name`` again replaces it). :func:`layout_of` checks the latest first."""
    if not isinstance(layout, Layout) or not layout.name:
        raise RolloutMockError(f"register_layout: expected a named rollout_mock.batch.Layout, got {layout!r}")
    _LAYOUTS[:] = [known for known in _LAYOUTS if known.name != layout.name]
    _LAYOUTS.insert(0, layout)
    return layout


def layout_of(batch: Any) -> Layout | None:
    """The registered layout whose ``matches`` recognises ``batch`` (latest registered first),
    else ``None``: the batch is read as columns or as a list of column dicts."""
    if batch is None or type(batch) in _SCALARS:
        return None
    return next((layout for layout in _LAYOUTS if layout.matches is not None and layout.matches(batch)), None)


def logprob_keys() -> tuple[str, ...]:
    """Every layout's log-prob columns, best first: each layout's first choice (in registration
    order), then each one's second, and so on; a key named twice counts once."""
    order = _LAYOUTS[::-1]
    out: list[str] = []
    for rank in range(max((len(layout.logprob_keys) for layout in order), default=0)):
        out += [key for layout in order if rank < len(layout.logprob_keys)
                and (key := layout.logprob_keys[rank]) not in out]
    return tuple(out)


def layout_of_key(key: str) -> Layout | None:
    """The layout whose log-probs go by ``key`` (the one that ranks it highest; the first
    registered of those that rank it alike), else ``None``."""
    ranked = [(layout.logprob_keys.index(key), i, layout) for i, layout in enumerate(_LAYOUTS[::-1])
              if key in layout.logprob_keys]
    return min(ranked, key=lambda found: found[:2])[2] if ranked else None


def _index_column(value: Any, index: list[int], n: int) -> Any:
    """Rows ``index`` of one column whose first dimension is ``n``; other values unchanged."""
    if is_tensor(value) and leading_dim(value) == n:
        import torch

        if value.is_nested:  # neither layout supports fancy indexing: rebuild from components
            parts = [value[i] for i in index]
            return torch.nested.nested_tensor(parts, layout=value.layout) if parts else value[:0]
        return value[torch.as_tensor(index, dtype=torch.long)]
    if is_array(value) and leading_dim(value) == n:
        import numpy as np

        return value[np.asarray(index, dtype=np.int64)]
    if isinstance(value, list):
        return [value[i] for i in index] if len(value) == n else value
    column_type = _registered_type_of(value)  # a TensorDict column, a DataProto column...
    if column_type is not None and column_type.rows(value) == n:
        return column_type.take(value, index)
    return value


def take_columns(columns: Mapping[Any, Any], index: Sequence[int], n: int | None) -> dict[Any, Any]:
    """Rows ``index`` of every column of ``n`` rows (tensors, arrays, lists, registered batch
    types); other values (per-batch metadata) unchanged. A helper for a type's ``take``."""
    rows = [int(i) for i in index]
    return {k: _index_column(v, rows, n) if n is not None else v for k, v in columns.items()}


def _concat_columns(values: list[Any], key: str) -> Any:
    first = values[0]
    if is_tensor(first):
        import torch

        if first.is_nested:
            return torch.nested.nested_tensor([c for v in values for c in v.unbind()], layout=first.layout)
        return torch.cat(values)
    if is_array(first):
        import numpy as np

        return np.concatenate(values)
    if isinstance(first, list):
        return [item for value in values for item in value]
    column_type = _registered_type_of(first)
    if column_type is not None and column_type.concat is not None:
        return column_type.concat(values)
    if all(_same(v, first) for v in values):
        return first  # per-batch metadata, identical in every part
    raise RolloutMockError(f"cannot concatenate key {key!r}: a {type_name(first)} that differs between "
                           f"the parts and has no batch dimension")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an ambiguous comparison means "not known to be the same"
        return False


def _mapping_rows(obj: Mapping[Any, Any]) -> int | None:
    for value in obj.values():
        n = leading_dim(value)
        if n is not None:
            return n
    return None


def _mapping_take(obj: Mapping[Any, Any], index: list[int]) -> Any:
    return _remake(obj, take_columns(obj, index, _mapping_rows(obj)))


def _remake(obj: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of ``obj``'s type holding ``items`` (a plain dict when the type cannot be built
    from one)."""
    if type(obj) is dict:
        return items
    try:
        return cast(Any, type(obj))(items)
    except (TypeError, ValueError):
        return items


def _mapping_concat(parts: list[Any]) -> Any:
    return {key: _concat_columns([p[key] for p in parts], str(key)) for key in parts[0]}


def _tuple_rows(obj: tuple[Any, ...]) -> int | None:
    for item in obj:
        n = count_samples(item)
        if n is not None:
            return n
    return None


def _tuple_take(obj: tuple[Any, ...], index: list[int]) -> Any:
    n = _tuple_rows(obj)
    items = [take_rows(x, index) if count_samples(x) == n else x for x in obj]
    return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)


def _list_keys(obj: list[Any]) -> list[str]:
    keys: list[str] = []
    for item in obj:
        if item is not None:
            keys += [k for k in batch_keys(item) if k not in keys]
    return keys


def _list_select(obj: list[Any], keys: frozenset[str]) -> list[Any]:
    return [select_keys(item, keys) if _selectable(item) else item for item in obj]


def _selectable(value: Any) -> bool:
    batch_type = batch_type_of(value)
    return batch_type is not None and batch_type.select is not None


_BUILTIN: tuple[BatchType, ...] = (
    BatchType("list", lambda b: isinstance(b, list), len, lambda b, i: [b[j] for j in i],
              lambda ps: [item for p in ps for item in p], keys=_list_keys, select=_list_select),
    BatchType("tuple", lambda b: isinstance(b, tuple), _tuple_rows, _tuple_take),
    BatchType("tensor", lambda b: is_tensor(b) or is_array(b), leading_dim,
              lambda b, i: _index_column(b, i, leading_dim(b) or 0),
              lambda ps: _concat_columns(ps, "<value>")),
    BatchType("mapping", lambda b: isinstance(b, Mapping), _mapping_rows, _mapping_take, _mapping_concat,
              columns=lambda b: dict(b.items()),
              select=lambda b, keys: _remake(b, {k: v for k, v in b.items() if k in keys}),
              rebuild=lambda b, parts: _remake(b, {**b, **parts})),
)


def _registered_type_of(value: Any) -> BatchType | None:
    for batch_type in _FOR_DICTS if type(value) is dict else _REGISTERED:
        if batch_type.matches(value):
            return batch_type
    return None


_SCALARS = frozenset({str, bytes, int, float, bool})


def batch_type_of(batch: Any) -> BatchType | None:
    """The :class:`BatchType` describing ``batch`` (registered types first), else ``None``."""
    if batch is None or type(batch) in _SCALARS:  # (a call's plain arguments: asked for at every call)
        return None
    for batch_type in (*(_FOR_DICTS if type(batch) is dict else _REGISTERED), *_BUILTIN):
        if batch_type.matches(batch):
            return batch_type
    return None


def take_rows(batch: Any, index: Sequence[int]) -> Any:
    """A new batch of the same type holding rows ``index`` (in that order); the input is not
    changed. Raises :class:`~rollout_mock.errors.RolloutMockError` for a type without rows."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.rows(batch) is None:
        raise RolloutMockError(f"cannot select rows of a {type_name(batch)}: it has no batch dimension")
    return batch_type.take(batch, [int(i) for i in index])


def select_keys(batch: Any, keys: Iterable[str]) -> Any:
    """A new batch of the same type keeping only the columns ``keys`` (per-batch metadata such as
    a DataProto's ``meta_info`` is kept whole; keys it does not have are ignored). Raises
    :class:`~rollout_mock.errors.RolloutMockError` for a type without keys."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.select is None:
        raise RolloutMockError(f"cannot select keys of a {type_name(batch)}")
    return batch_type.select(batch, frozenset(keys))


def subset(batch: Any, keys: Iterable[str] | None = None, rows: slice | range | Sequence[int] | None = None) -> Any:
    """``batch`` with only the columns ``keys`` (:func:`select_keys`; skipped for a type without
    keys) and the rows ``rows`` (:func:`take_rows`; a slice or range is taken of the batch's rows,
    and a batch without rows is returned whole): what a partial load returns, whatever the
    format it was read from. ``None`` keeps everything."""
    if keys is not None:
        batch_type = batch_type_of(batch)
        if batch_type is not None and batch_type.select is not None:
            batch = batch_type.select(batch, frozenset(keys))
    if rows is not None:
        n = count_samples(batch)
        if n is not None:
            batch = take_rows(batch, range(n)[rows] if isinstance(rows, slice) else rows)
    return batch


def concat(batches: Sequence[Any]) -> Any:
    """One batch of ``batches`` (all of one type), rows in order. Raises
    :class:`~rollout_mock.errors.RolloutMockError` naming the type when it cannot be joined."""
    parts = list(batches)
    if not parts:
        raise RolloutMockError("cannot concatenate no batches")
    batch_type = batch_type_of(parts[0])
    if batch_type is None or batch_type.concat is None:
        raise RolloutMockError(f"a {type_name(parts[0])} cannot be concatenated")
    return batch_type.concat(parts)


def batch_columns(batch: Any) -> dict[str, Any] | None:
    """The named columns of a columnar batch (a DataProto's tensor and non-tensor columns, a
    TensorDict's or a dict's items), keys as strings; ``None`` for other batches (lists: their
    rows are items, each with its own columns)."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.columns is None:
        return None
    return {str(k): v for k, v in batch_type.columns(batch).items()}


def batch_keys(batch: Any) -> list[str]:
    """The keys of a batch, in order: its columns', or the union of its items' (lists)."""
    batch_type = batch_type_of(batch)
    if batch_type is None:
        return []
    if batch_type.keys is not None:
        return batch_type.keys(batch)
    return [str(k) for k in batch_type.columns(batch)] if batch_type.columns is not None else []


def batch_parts(batch: Any) -> dict[str, Any] | None:
    """The named parts of a batch as structural walks see them (``None``: not a batch with parts)."""
    batch_type = batch_type_of(batch)
    if batch_type is None:
        return None
    if batch_type.parts is not None:
        return batch_type.parts(batch)
    return batch_type.columns(batch) if batch_type.columns is not None else None


def rebuild(batch: Any, parts: dict[str, Any]) -> Any:
    """A copy of ``batch`` with ``parts`` replaced (names as :func:`batch_parts` gives them);
    ``batch`` itself when its type cannot be rebuilt."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.rebuild is None:
        return batch
    return batch_type.rebuild(batch, parts)


def batch_meta(batch: Any) -> Mapping[str, Any] | None:
    """The per-batch metadata of a batch (a DataProto's ``meta_info``), if it has a mapping of it."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.meta_key is None:
        return None
    meta = (batch_parts(batch) or {}).get(batch_type.meta_key)
    return meta if isinstance(meta, Mapping) else None


def column_name(key: str, batch: Any) -> str:
    """The column of ``batch`` a key names, in either syntax: ``batch.rewards`` (as
    ``rollout-mock ls --keys`` prints a DataProto's key: part, then column) and ``rewards`` are
    the same key, and so are ``[*].rewards`` and ``rewards`` for a list."""
    if key.startswith("[*].") and len(key) > 4:
        return key[4:]
    head, dot, rest = key.partition(".")
    batch_type = batch_type_of(batch)
    if dot and rest and batch_type is not None and batch_type.parts is not None and head != batch_type.meta_key \
            and head in batch_type.parts(batch):
        return rest
    return key


_PLAIN = frozenset({int, float, str, bool, bytes, list, tuple, type(None)})


def _walk(prefix: str, obj: Any, out: dict[str, dict[str, Any]]) -> None:
    if len(out) >= _MAX_KEYS or type(obj) in _PLAIN:  # scalars and lists hold no described keys
        return
    if type(obj) is dict and _registered_type_of(obj) is None:
        # a plain dict (the builtin mapping type: its items, in order), the common case of a
        # list of sample dicts: values that hold no described keys are not looked into
        for key, value in obj.items():
            if type(value) not in _PLAIN:
                _walk(f"{prefix}.{key}" if prefix else str(key), value, out)
        return
    leaf = _leaf(obj)
    if leaf is not None:
        out[prefix or "<value>"] = leaf
        return
    batch_type = batch_type_of(obj)
    if batch_type is not None and (batch_type.parts is not None or batch_type.columns is not None):
        parts = batch_parts(obj) or {}
        items = [(k, v) for k, v in parts.items() if k != batch_type.meta_key]
    elif callable(getattr(type(obj), "keys", None)) and callable(getattr(type(obj), "__getitem__", None)):
        items = [(key, obj[key]) for key in sorted(obj.keys(), key=str)]  # mapping-like (BatchProxy)
    else:
        return
    for key, value in items:
        _walk(f"{prefix}.{key}" if prefix else str(key), value, out)


def describe_keys(batch: Any) -> dict[str, dict[str, Any]]:
    """Flat ``{dotted.key: {"shape": [...], "dtype": "..."}}`` of the batch's arrays: a type's
    parts give the first segment (``batch.input_ids`` of a DataProto), a list's items merge under
    ``[*]`` (a shape that varies between items is ``None``); metadata parts are left out."""
    if isinstance(batch, list):
        merged: dict[str, dict[str, Any]] = {}
        for item in batch:
            if item is None:
                continue
            keys: dict[str, dict[str, Any]] = {}
            _walk("[*]", item, keys)
            for key, leaf in keys.items():
                known = merged.setdefault(key, dict(leaf))
                if known.get("shape") != leaf["shape"]:
                    known["shape"] = None  # varies between items
        return merged
    out: dict[str, dict[str, Any]] = {}
    _walk("", batch, out)
    return out


def count_samples(batch: Any) -> int | None:
    """Samples in the batch: its rows (the batch dimension, items of a list, rejected ones
    included); ``None`` for a batch without rows."""
    batch_type = batch_type_of(batch)
    return None if batch_type is None else batch_type.rows(batch)


def rejected_count(batch: Any) -> int:
    """Rejected samples: ``None`` items of a list (AReaL's trajectories)."""
    return sum(item is None for item in batch) if isinstance(batch, list) else 0
