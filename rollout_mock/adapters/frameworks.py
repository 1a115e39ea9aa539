"""The frameworks as the core sees them: their batch types, their step-argument names, their
layouts (log-probs, samples, traces), and the scheduler hook that switches off ROLL's own rollout
mock.

Registered at import, which ``import rollout_mock`` does (whatever the user imports: every
``from rollout_mock... import ...`` runs the root package first), so this module imports no
framework, no torch and no numpy.

* **Batch types** (:mod:`rollout_mock.batch`): DataProto-like objects — verl's and ROLL's
  ``DataProto`` (ROLL >= 0.3 keeps ``_batch``/``_non_tensor_batch`` behind ``BatchProxy``
  properties), the demo's and the codec's stand-in — recognised from the instance ``__dict__``
  alone (:func:`rollout_mock.batch.dataproto_fields`), their own ``select_idxs``/``select``/
  ``concat`` used when they have them; TensorDicts (with how the codec writes them, their
  non-tensor values and their stacks); rollout_mock's slime records
  (``{"format": "rollout_mock.slime", "samples": [...]}``: rows are samples, or groups of them)
  and slime's own debug rollout files (``{"rollout_id": N, "samples": [...]}``).
* **Step-argument names** (:func:`rollout_mock.batch.register_step_name`, looked up by
  :mod:`rollout_mock.wrap.calls`): ROLL's ``global_step``, verl's ``meta_info["global_steps"]``,
  slime's ``generate_rollout(args, rollout_id, ...)``.
* **The ROLL scheduler hook** (:mod:`rollout_mock.wrap.hooks`): ROLL's schedulers inherit
  ``RolloutMockMixin``, which reads the same ``rollout_mock:`` block and, in dump mode, pickles
  every batch to ``{dump_dir}/{train|val}/step_N.pkl`` itself — the very paths rollout_mock writes
  (with a manifest and checksums), so the two would collide. A wrapped scheduler therefore gets
  ``mock_config = None`` (the mixin's own off state) after its ``__init__``; rollout_mock records
  and replays instead. Nothing else of the scheduler changes.
* **Layouts** (:class:`rollout_mock.batch.Layout`, :data:`LAYOUTS`): where each framework keeps
  what the readers look for — its log-prob columns (verl's ``rollout_log_probs``, ROLL's
  ``infer_logprobs``, AReaL's ``logprobs``), and for slime's samples and TRL's generation records
  their traces, log-prob sequences and report view. Traces, the log-prob check and the report
  look them up and name no framework; the readers import compare/, debug/ and torch when called.
* **Volatile and live-served fields** (:data:`VOLATILE_FIELDS`, :data:`LIVE_FIELDS`): what request
  matching and check mode leave out of each framework's own calls, and what of a request flows
  into its output and is served with the live value after a replay (:func:`serve_live_fields`).
* **Fingerprints by content** shared by the adapters' pre-flight checks: a tokenizer with its chat
  template (:func:`tokenizer_fingerprint`) and a data file (:func:`file_fingerprint`), so that a
  copy under another path (another machine) is the same input and a changed one is not.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from rollout_mock.batch import (
    BatchType,
    KeyedCodec,
    Layout,
    batch_columns,
    batch_keys,
    batch_parts,
    batch_type_of,
    count_samples,
    dataproto_fields,
    instance_state,
    register_batch_type,
    register_layout,
    register_step_name,
    select_keys,
    take_columns,
    take_rows,
    type_name,
)
from rollout_mock.errors import RolloutMockError
from rollout_mock.wrap.hooks import register_scheduler_hook, register_volatile_fields

__all__ = [
    "DATAPROTO", "LAYOUTS", "LIVE_FIELDS", "REQUEST", "SLIME_RECORD", "SLIME_RECORD_FORMAT", "TENSORDICT",
    "VOLATILE_FIELDS",
    "disable_native_roll_mock", "disable_native_roll_mock_in_actor", "file_fingerprint", "has_native_roll_mock",
    "is_tokenizer",
    "prepare_roll_scheduler", "serve_live_fields", "tokenizer_fingerprint",
]


# --------------------------------------------------------------------------- DataProto-like
def _is_dataproto(obj: Any) -> bool:
    return dataproto_fields(obj) is not None


def _names(obj: Any) -> tuple[str, str, str]:
    found = dataproto_fields(obj)
    if found is None:
        raise RolloutMockError(f"not a DataProto-like batch: {type_name(obj)}")
    return ("_batch", "_non_tensor_batch", "meta_info") if found[0] == "private" else \
        ("batch", "non_tensor_batch", "meta_info")


def _dataproto_parts(obj: Any) -> dict[str, Any]:
    """``batch`` (tensors), ``non_tensor_batch`` (a plain dict) and ``meta_info`` (a copy).

    ``non_tensor_batch`` may be a proxy (ROLL's ``BatchProxy``: ``len``/iteration/``==`` do not
    behave like a dict); it is read through ``keys()`` and ``__getitem__`` only.
    """
    state = object.__getattribute__(obj, "__dict__")
    tensors_name, non_tensor_name, meta_name = _names(obj)
    non_tensor = state[non_tensor_name]
    if non_tensor is None:
        plain: dict[str, Any] = {}
    elif isinstance(non_tensor, dict):
        plain = dict(non_tensor)
    else:
        plain = {key: non_tensor[key] for key in sorted(non_tensor.keys(), key=str)}
    return {"batch": state[tensors_name], "non_tensor_batch": plain, "meta_info": dict(state[meta_name] or {})}


def _structural_rows(obj: Any) -> int | None:
    parts = _dataproto_parts(obj)
    n = count_samples(parts["batch"])
    if n is not None:
        return n
    for value in parts["non_tensor_batch"].values():
        return len(value)
    return None


def _dataproto_rows(obj: Any) -> int | None:
    try:
        return len(obj)  # verl's and ROLL's own rule
    except TypeError:  # no __len__ (the demo's dataclass)
        return _structural_rows(obj)


def _rebuild(obj: Any, parts: dict[str, Any]) -> Any:
    """A shallow copy of ``obj`` (its ``__dict__`` copied, no method of it run) with ``parts``
    written into its instance state under the layout's names."""
    try:
        out = object.__new__(type(obj))
        object.__getattribute__(out, "__dict__").update(object.__getattribute__(obj, "__dict__"))
    except TypeError:  # a class object.__new__ cannot make
        out = copy.copy(obj)
    state = object.__getattribute__(out, "__dict__")
    for name, field in zip(("batch", "non_tensor_batch", "meta_info"), _names(obj)):
        if name in parts:
            state[field] = parts[name]
    return out


def _dataproto_take(obj: Any, index: list[int]) -> Any:
    select = getattr(type(obj), "select_idxs", None)
    if callable(select):  # verl and ROLL: their own implementation keeps every invariant
        import numpy as np

        return select(obj, np.asarray(index, dtype=np.int64))
    n = _structural_rows(obj)
    parts = _dataproto_parts(obj)
    tensors = parts["batch"]
    tensors_type = batch_type_of(tensors)
    if tensors_type is not None and tensors_type.name == "mapping":
        tensors = take_columns(tensors, index, n)
    elif tensors_type is not None and n is not None and count_samples(tensors) == n:
        tensors = take_rows(tensors, index)
    return _rebuild(obj, {"batch": tensors, "non_tensor_batch": take_columns(parts["non_tensor_batch"], index, n),
                          "meta_info": parts["meta_info"]})


def _dataproto_concat(parts: list[Any]) -> Any:
    join = getattr(type(parts[0]), "concat", None)
    if callable(join):
        return join(parts)
    raise RolloutMockError(f"a {type_name(parts[0])} has no concat()")


def _dataproto_columns(obj: Any) -> dict[str, Any]:
    parts = _dataproto_parts(obj)
    columns = dict(batch_columns(parts["batch"]) or {})
    columns.update({str(k): v for k, v in parts["non_tensor_batch"].items() if str(k) not in columns})
    return columns


def _dataproto_select(obj: Any, keys: frozenset[str]) -> Any:
    parts = _dataproto_parts(obj)
    tensors, others = parts["batch"], parts["non_tensor_batch"]
    tensor_keys = [k for k in batch_keys(tensors) if k in keys] if tensors is not None else []
    own = getattr(type(obj), "select", None)
    if callable(own) and callable(getattr(type(obj), "select_idxs", None)):  # verl and ROLL
        return own(obj, batch_keys=tensor_keys, non_tensor_batch_keys=[k for k in others if k in keys],
                   deepcopy=False)
    return _rebuild(obj, {"batch": None if tensors is None else select_keys(tensors, tensor_keys),
                          "non_tensor_batch": {k: v for k, v in others.items() if k in keys}})


DATAPROTO = BatchType(
    "dataproto", _is_dataproto, _dataproto_rows, _dataproto_take, _dataproto_concat,
    columns=_dataproto_columns, select=_dataproto_select, parts=_dataproto_parts, rebuild=_rebuild,
    meta_key="meta_info",
    classes=("verl.protocol:DataProto", "roll.distributed.scheduler.protocol:DataProto"),
    dicts=False,  # an instance of a class outside builtins (dataproto_fields)
)


def _request_meta(obj: Any) -> Mapping[str, Any] | None:
    """The ``meta_info`` mapping in the instance state of an object that is not DataProto-like."""
    if isinstance(obj, type) or type(obj).__module__ == "builtins" or _is_dataproto(obj):
        return None
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    meta = state.get("meta_info") if isinstance(state, dict) else None
    return meta if isinstance(meta, Mapping) else None


def _no_rows(obj: Any, index: list[int]) -> Any:
    raise RolloutMockError(f"a {type_name(obj)} carries only meta_info: it has no rows")


#: An object that carries only ``meta_info`` (a call's request: its step may be there, as in a
#: DataProto's): no rows, no columns.
REQUEST = BatchType(
    "request", lambda b: _request_meta(b) is not None, lambda b: None, _no_rows,
    parts=lambda b: {"meta_info": _request_meta(b)}, meta_key="meta_info", dicts=False,
)


# --------------------------------------------------------------------------- TensorDict
def _is_tensordict(obj: Any) -> bool:
    """tensordict's own classes (recent tensordict registers them as ``Mapping``s), or
    ``batch_size``, ``keys`` and ``items`` on the class of something that is not a mapping."""
    cls = type(obj)
    if isinstance(obj, dict | type) or cls.__module__ in ("torch", "numpy"):
        return False
    if any(c.__name__ == "TensorDictBase" and c.__module__.startswith("tensordict") for c in cls.__mro__):
        return True
    return not isinstance(obj, Mapping) and all(hasattr(cls, name) for name in ("batch_size", "items", "keys"))


def _tensordict_rows(obj: Any) -> int | None:
    size = tuple(obj.batch_size)
    return int(size[0]) if size else None


def _tensordict_take(obj: Any, index: list[int]) -> Any:
    import torch

    return obj[torch.as_tensor(index, dtype=torch.long)]


def _tensordict_concat(parts: list[Any]) -> Any:
    import torch

    return torch.cat(parts)


def _tensordict_parts(obj: Any) -> dict[str, Any]:
    """Its entries as structural walks see them: ``NonTensorData`` as its value and
    ``NonTensorStack`` as a list (what ``td[key]`` gives), so that ``--redact`` and ``diff`` see
    the text a TensorDict holds."""
    return {str(k): obj[k] for k in obj.keys()}


def _tensordict_map_tensors(td: Any, fn: Callable[[Any], Any]) -> Any:
    """Its leaves through ``fn`` (device placement); one that had a device gets the one its leaves
    are on now (a recorded one loads with ``device=None``), and a locked one is locked."""
    import torch  # (importing the adapters imports no torch)

    out = td.apply(fn, device=None, call_on_nested=False, filter_empty=False)
    if td.device is not None:
        devices = {t.device for t in out.values(include_nested=True, leaves_only=True) if isinstance(t, torch.Tensor)}
        if len(devices) == 1:
            out = out.to(devices.pop())
    return out.lock_() if td.is_locked else out


def _tensordict_rebuild(obj: Any, parts: dict[str, Any]) -> Any:
    """A shallow copy with ``parts`` set (a string or a list becomes non-tensor data again)."""
    out = obj.clone(recurse=False)
    if out.is_locked:
        out.unlock_()
    for key, value in parts.items():
        out[key] = value
    return out


# TensorDict in step files: a keyed node (rollout_mock.batch.KeyedCodec), tag "tensordict":
# {"$": "tensordict", "batch_size": [...], "names": [...]|None, "device": "cpu"|None,
#  "items": [[key, NODE], ...], "locked": true?, "consolidated": true?}. A consolidated
# TensorDict is rebuilt with consolidate() (which also locks it, as in tensordict), a locked one
# with lock_().
_warned_devices: set[str] = set()


def _tensordict_node_parts(td: Any, path: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    device = td.device
    head = {"batch_size": list(td.batch_size), "names": list(td.names) if td._has_names() else None,
            "device": "cpu" if device is not None and device.type == "cpu" else None}
    tail: dict[str, Any] = {}
    if device is not None and device.type != "cpu" and device.type not in _warned_devices:
        from rollout_mock.text import logger

        _warned_devices.add(device.type)
        logger.warning("[RolloutMock] %s: the TensorDict device %s is not recorded: it loads on the CPU with "
                       "device=None", path or "a TensorDict", device)
    if td.is_locked:
        tail["locked"] = True
    consolidated = getattr(td, "is_consolidated", None)
    if consolidated is not None and consolidated():
        tail["consolidated"] = True
    return head, td.items(), tail


def _tensordict_node_check(node: Mapping[str, Any]) -> None:
    from rollout_mock.codec.format import check_shape

    check_shape(node.get("batch_size"))
    names = node.get("names")
    if names is not None and (type(names) is not list or any(n is not None and type(n) is not str for n in names)):
        raise ValueError("bad tensordict names")
    if node.get("device") not in (None, "cpu"):
        raise ValueError("bad tensordict device")
    if any(type(node.get(k, False)) is not bool for k in ("locked", "consolidated")):
        raise ValueError("bad tensordict state")


def _tensordict_node_build(node: Mapping[str, Any], items: dict[str, Any], flush: Any) -> Any:
    from tensordict import TensorDict

    td = TensorDict(items, batch_size=list(node["batch_size"]), device=node.get("device"), names=node.get("names"))
    if node.get("consolidated"):
        flush()  # consolidating copies the tensors' data
        td = td.consolidate()
    if node.get("locked") and not td.is_locked:
        td.lock_()
    return td


def _batch_size_rows(node: Mapping[str, Any], rows: slice) -> dict[str, Any] | None:
    """The node with its ``batch_size`` cut to ``rows`` (``None``: it has no batch dimension)."""
    batch_size = list(node["batch_size"])
    if not batch_size:
        return None
    batch_size[0] = len(range(batch_size[0])[rows])
    return {**node, "batch_size": batch_size}


def _tensordict_node_rows(node: Mapping[str, Any], rows: slice) -> tuple[dict[str, Any], slice] | None:
    cut = _batch_size_rows(node, rows)
    return None if cut is None else (cut, rows)


def _cpu(device: Any) -> str | None:
    import torch

    return "cpu" if device is not None and torch.device(device).type == "cpu" else None


def _state_check(node: Mapping[str, Any]) -> None:
    if type(node.get("locked", False)) is not bool:
        raise ValueError(f"bad {node.get('$')} node: locked must be a boolean")


# tensordict's NonTensorData (verl's to_tensordict meta values) in step files: a single-data node,
# tag "nontensor": {"$": "nontensor", "data": NODE, "batch_size": [...], "device": "cpu"|None,
# "locked": bool}. A row selection cuts its batch size, never its value.
def _nontensor_node_parts(obj: Any, path: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    return {}, obj.data, {"batch_size": list(obj.batch_size), "device": _cpu(obj.device), "locked": bool(obj.is_locked)}


def _nontensor_node_check(node: Mapping[str, Any]) -> None:
    from rollout_mock.codec.format import check_shape

    check_shape(node.get("batch_size"))
    if node.get("device") not in (None, "cpu"):
        raise ValueError("bad nontensor device")
    _state_check(node)


def _nontensor_node_build(node: Mapping[str, Any], data: Any, flush: Any) -> Any:
    from tensordict import NonTensorData

    out = NonTensorData(data=data, batch_size=list(node["batch_size"]), device=node.get("device"))
    return out.lock_() if node.get("locked") else out


def _nontensor_node_rows(node: Mapping[str, Any], rows: slice) -> tuple[dict[str, Any], None] | None:
    cut = _batch_size_rows(node, rows)
    return None if cut is None else (cut, None)


# tensordict's stacks in step files: a node of a plain list of items, tag "tdstack":
# {"$": "tdstack", "cls": "nontensor"|"lazy", "stack_dim": int, "locked": bool, "items": [NODE...]}:
# NonTensorStack (verl's uids, prompts, turn scores; nested stacks for lists of lists) and
# LazyStackedTensorDict. Rows along stack_dim 0 are items; along another dimension, rows of each.
_STACKS = {"tensordict.tensorclass:NonTensorStack": "nontensor", "tensordict._lazy:LazyStackedTensorDict": "lazy"}
#: stack_dim is a dimension of a TensorDict's batch size: at most this.
_MAX_STACK_DIM = 32


def _stack_node_parts(obj: Any, path: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    cls = type(obj)
    head = {"cls": _STACKS[f"{cls.__module__}:{cls.__qualname__}"], "stack_dim": int(obj.stack_dim),
            "locked": bool(obj.is_locked)}
    return head, obj.tensordicts, {}


def _stack_node_check(node: Mapping[str, Any]) -> None:
    if node.get("cls") not in ("nontensor", "lazy"):
        raise ValueError("bad tdstack class")
    dim = node.get("stack_dim")
    if type(dim) is not int or not 0 <= dim <= _MAX_STACK_DIM:
        raise ValueError("bad tdstack stack_dim")
    _state_check(node)


def _stack_node_build(node: Mapping[str, Any], items: list[Any], flush: Any) -> Any:
    from tensordict import LazyStackedTensorDict, NonTensorStack

    for item in items:
        if not hasattr(item, "batch_size") or not hasattr(item, "is_locked"):
            raise ValueError("a tdstack item is not a TensorDict-like node")
    cls = NonTensorStack if node["cls"] == "nontensor" else LazyStackedTensorDict
    out = cls(*items, stack_dim=node["stack_dim"])  # no items: an empty stack (what from_list([]) makes)
    return out.lock_() if node.get("locked") else out


def _stack_node_rows(node: Mapping[str, Any], rows: slice) -> tuple[dict[str, Any], slice | None]:
    if node["stack_dim"] == 0:
        return {**node, "items": node["items"][rows]}, None
    return dict(node), rows


TENSORDICT = BatchType(
    "tensordict", _is_tensordict, _tensordict_rows, _tensordict_take, _tensordict_concat,
    columns=lambda b: {str(k): v for k, v in b.items()},
    select=lambda b, keys: b.select(*[k for k in b.keys() if k in keys]),
    parts=_tensordict_parts, rebuild=_tensordict_rebuild, map_tensors=_tensordict_map_tensors,
    codec=(
        KeyedCodec("tensordict", ("tensordict._td:TensorDict",), _tensordict_node_parts, _tensordict_node_check,
                   _tensordict_node_build, _tensordict_node_rows, class_keys=("locked", "consolidated")),
        KeyedCodec("nontensor", ("tensordict.tensorclass:NonTensorData",), _nontensor_node_parts,
                   _nontensor_node_check, _nontensor_node_build, _nontensor_node_rows,
                   class_keys=("batch_size", "device", "locked"), form="data"),
        KeyedCodec("tdstack", tuple(_STACKS), _stack_node_parts, _stack_node_check, _stack_node_build,
                   _stack_node_rows, class_keys=("cls", "stack_dim", "locked"), form="list"),
    ),
    dicts=False,  # _is_tensordict refuses dicts
)


# --------------------------------------------------------------------------- slime records
#: What :mod:`rollout_mock.adapters.slime` records: ``{"format", "kind", "metrics", "samples"}``,
#: ``samples`` a list of ``Sample.to_dict()`` dicts or of groups (lists) of them.
SLIME_RECORD_FORMAT = "rollout_mock.slime"


def _is_slime(obj: Any) -> bool:
    """rollout_mock's slime record, or slime's own ``--save-debug-rollout-data`` file
    (``{"rollout_id": N, "samples": [...]}``)."""
    # a plain dict: a TensorDict is a Mapping whose .get() of a missing key may raise
    return isinstance(obj, dict) and isinstance(obj.get("samples"), list) and (
        obj.get("format") == SLIME_RECORD_FORMAT or "rollout_id" in obj)


def _sample_keys(samples: list[Any], out: list[str]) -> list[str]:
    for sample in samples:
        if isinstance(sample, list):
            _sample_keys(sample, out)
        elif isinstance(sample, Mapping):
            out += [str(k) for k in sample if str(k) not in out]
    return out


def _select_sample(sample: Any, keys: frozenset[str]) -> Any:
    if isinstance(sample, list):
        return [_select_sample(s, keys) for s in sample]
    if isinstance(sample, Mapping):
        return {k: v for k, v in sample.items() if k in keys}
    return sample


SLIME_RECORD = BatchType(
    "slime", _is_slime, lambda b: len(b["samples"]),
    lambda b, i: {**b, "samples": [b["samples"][j] for j in i]},
    lambda ps: {**ps[0], "samples": [s for p in ps for s in p["samples"]]},
    keys=lambda b: _sample_keys(b["samples"], []),
    select=lambda b, keys: {**b, "samples": [_select_sample(s, keys) for s in b["samples"]]},
    parts=lambda b: dict(b), rebuild=lambda b, parts: {**b, **parts},
)


# --------------------------------------------------------------------------- TRL records
#: What :mod:`rollout_mock.adapters.trl` records per generation call: ``{"format", "mode",
#: "generate": {"output": [...], ...}, "rewards": {"rewards_per_func": [N, F] tensor, ...}}``,
#: ``output`` being ``_generate``'s tuple, named by :data:`TRL_OUTPUT_NAMES`; a row is a completion.
TRL_RECORD_FORMAT = "rollout_mock.trl/1"
TRL_OUTPUT_NAMES = ("prompt_ids", "completion_ids", "tool_mask", "completions", "logprobs", "extra_fields", "images",
                    "tool_images")


def _is_trl(obj: Any) -> bool:
    return (isinstance(obj, dict) and obj.get("format") == TRL_RECORD_FORMAT and isinstance(obj.get("generate"), dict)
            and isinstance(obj["generate"].get("output"), list | tuple))


def trl_outputs(record: Mapping[str, Any]) -> dict[str, Any]:
    """A TRL record's generation outputs by name (``prompt_ids``, ``completion_ids``, ...)."""
    return dict(zip(TRL_OUTPUT_NAMES, record["generate"]["output"]))


def _trl_rows(record: Any) -> int | None:
    completions = trl_outputs(record).get("completion_ids")
    return len(completions) if isinstance(completions, list | tuple) else None


def _trl_take(record: Any, index: list[int]) -> Any:
    n = _trl_rows(record)
    output = [[value[i] for i in index] if isinstance(value, list | tuple) and len(value) == n else value
              for value in record["generate"]["output"]]
    taken = {**record, "generate": {**record["generate"], "output": output}}
    rewards = record.get("rewards")
    if isinstance(rewards, dict) and getattr(rewards.get("rewards_per_func"), "shape", (None,))[0] == n:
        taken["rewards"] = {**rewards, "rewards_per_func": rewards["rewards_per_func"][index]}
    return taken


TRL_RECORD = BatchType(
    "trl", _is_trl, _trl_rows, _trl_take, columns=trl_outputs,
    keys=lambda b: [name for name, value in trl_outputs(b).items() if value is not None],
    parts=lambda b: dict(b), rebuild=lambda b, parts: {**b, **parts},
)


# --------------------------------------------------------------------------- registration
# The latest registered type is checked first: DataProto-like objects, the most common batches.
for _batch_type in (TRL_RECORD, SLIME_RECORD, TENSORDICT, REQUEST, DATAPROTO):
    register_batch_type(_batch_type)

register_step_name("global_step")  # ROLL: get_batch(data, global_step, batch_size), meta_info["global_step"]
register_step_name("global_steps")  # verl: meta_info["global_steps"] of generate_sequences' batch
register_step_name("rollout_id")  # slime: generate_rollout(args, rollout_id, data_source, evaluation)


# --------------------------------------------------------------------------- layouts
# Where each framework keeps what the readers look for (rollout_mock.batch.Layout): traces
# (rollout_mock.compare.traces), the log-prob check (rollout_mock.debug.sequences) and the report
# (rollout_mock.debug.report_columns) look them up and name no framework. The readers import
# compare/ and debug/ (and torch) when they are called: importing this module stays cheap.
def _fields(item: Any) -> Mapping[str, Any] | None:
    """A sample's fields: a dict's items, or an object's instance state (slime's ``Sample``), read
    without running any code of the object (a TensorDict's ``get`` of a missing key may raise)."""
    return item if isinstance(item, dict) else instance_state(item)


def _is_slime_sample(item: Any) -> bool:
    """slime's ``Sample`` (or its ``to_dict()``): token ids and the response's length."""
    fields = _fields(item)
    return fields is not None and fields.get("tokens") is not None and fields.get("response_length") is not None


def _flatten(items: Any) -> list[Any]:
    return [x for item in items for x in (_flatten(item) if isinstance(item, list | tuple) else [item])]


def _slime_samples(batch: Any) -> list[Any] | None:
    """The samples of a slime batch, else ``None``: a record (rollout_mock's or slime's own debug
    file; flat, or in groups of one prompt's samples), an eval record (every dataset's samples, flat),
    an object or dict holding ``samples`` (``RolloutFnTrainOutput``), or a list of samples."""
    if isinstance(batch, dict) and batch.get("format") == SLIME_RECORD_FORMAT and "samples" not in batch:
        data = batch.get("data")
        return [s for info in data.values() if isinstance(info, Mapping) for s in info.get("samples") or []] \
            if isinstance(data, Mapping) else None
    if isinstance(batch, dict) and SLIME_RECORD.matches(batch):
        return list(batch["samples"])
    samples = batch if isinstance(batch, list | tuple) else (_fields(batch) or {}).get("samples")
    if not isinstance(samples, list | tuple):
        return None
    first = next((x for item in samples for x in (item if isinstance(item, list | tuple) else [item]) if x is not None),
                 None)
    return list(samples) if first is not None and _is_slime_sample(first) else None


def _slime_reward(value: Any) -> float | None:
    import numpy as np

    from rollout_mock.text import to_float

    if isinstance(value, Mapping):  # a reward model's dict: its score
        value = next((value[k] for k in ("score", "reward", "acc") if k in value), None)
    if isinstance(value, bool | int | float | np.generic):
        return to_float(value)  # 10**400: inf, never OverflowError
    return None


def _slime_trace(sample: Mapping[str, Any], index: int, group: int | None, renderer: Any) -> Any:
    """One slime sample: its prompt (text or chat messages) and its response as messages."""
    from rollout_mock.compare.traces import Trace

    messages = renderer.chat(sample.get("prompt")) or []
    response, n = sample.get("response"), sample.get("response_length")
    if isinstance(response, str):
        messages.append({"role": "assistant", "content": response, "tokens": None})
    elif sample.get("tokens") is not None and isinstance(n, int):
        tokens = list(sample["tokens"])
        messages.append({"role": "assistant", "content": renderer.content(tokens[len(tokens) - n:]),
                         "tokens": tokens[len(tokens) - n:]})
    metadata: dict[str, Any] = {key: renderer.field(sample[key]) for key in ("index", "status", "response_length",
                                                                            "label") if key in sample.keys()}
    if isinstance(n, int) and not isinstance(n, bool):
        metadata["completion_tokens"] = n
    if group is not None:
        metadata["uid"] = group  # GRPO group: samples of one prompt
    elif sample.get("group_index") is not None:  # a flat list (an eval record): the sample's own group
        metadata["uid"] = renderer.field(sample["group_index"])
    if sample.get("status") == "aborted":
        return Trace(index, "rejected", None, messages, metadata)
    return Trace(index, "ok", _slime_reward(sample.get("reward")), messages, metadata)


def _slime_traces(batch: Any, limit: int, renderer: Any) -> list[Any]:
    """slime's samples: a flat list, or groups (lists) of the samples of one prompt."""
    from rollout_mock.compare.traces import Trace

    traces: list[Any] = []
    for g, item in enumerate(_slime_samples(batch) or []):
        members, group = (item, g) if isinstance(item, list | tuple) else ([item], None)
        for sample in members:
            if len(traces) >= limit:
                return traces
            fields = _fields(sample)
            if fields is not None:
                traces.append(_slime_trace(fields, len(traces), group, renderer))
            else:
                traces.append(Trace(len(traces), "rejected", None, [], {"group": g}))
    return traces


def _slime_sequences(batch: Any, keys: Any) -> Any:
    """The log-prob check's sequences of slime's samples: ``tokens``, ``response_length``,
    ``rollout_log_probs`` and ``loss_mask`` of the last ``response_length`` tokens (``keys`` names
    other fields); ``None`` (rejected) items counted, samples without log-probs skipped."""
    import torch

    from rollout_mock.debug.sequences import Extraction, RecordedSequence
    from rollout_mock.errors import DebugInputError
    from rollout_mock.text import logger, short_repr

    items = _flatten(_slime_samples(batch) or [])
    lp_name, tok_name = keys.logprobs or "rollout_log_probs", keys.tokens or "tokens"
    mask_name = keys.mask or "loss_mask"
    out = Extraction("slime", {"logprobs": lp_name, "tokens": tok_name, "mask": mask_name})
    missing = 0
    for index, item in enumerate(items):
        sample = _fields(item)
        if sample is None:
            out.rejected += 1
            continue
        tokens, logprobs, n = sample.get(tok_name), sample.get(lp_name), sample.get("response_length") or 0
        if tokens is None or logprobs is None or n == 0:
            missing += logprobs is None
            continue
        loss_mask = sample.get(mask_name)
        try:  # a damaged sample: text, nesting or numbers past int64 where ids are
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= len(tokens):
                raise ValueError(f"response_length {short_repr(n, 40)} is not in [1, {len(tokens)}]")
            ids = torch.as_tensor(list(tokens), dtype=torch.long)
            recorded = torch.as_tensor(list(logprobs), dtype=torch.float64)[-n:]
            mask = torch.ones(n, dtype=torch.bool) if loss_mask is None else torch.as_tensor(list(loss_mask))[-n:] != 0
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise DebugInputError(
                f"slime sample {index}: {tok_name}, {lp_name}, {mask_name} and response_length are not token ids, "
                f"log-probs, a mask and a length ({short_repr(str(exc), 160)}); name other fields with --keys"
            ) from None
        if ids.ndim != 1 or recorded.ndim != 1 or mask.ndim != 1:
            raise DebugInputError(f"slime sample {index}: {tok_name}, {lp_name} and {mask_name} must be flat lists")
        positions = torch.arange(len(ids) - n, len(ids))[: len(recorded)]
        mask = mask[: len(positions)] & (positions >= 1)
        out.sequences.append(RecordedSequence(index, ids, positions[mask], recorded[: len(positions)][mask]))
    if missing:
        logger.warning("[RolloutMock] %d slime samples have no %s; skipped", missing, lp_name)
    return out


def _count_slime_traces(batch: Any) -> int:
    return sum(len(item) if isinstance(item, list | tuple) else 1 for item in _slime_samples(batch) or [])


def _trl_traces(record: Any, limit: int, renderer: Any) -> list[Any]:
    """A TRL generation record: one trace per completion (its prompt's and completion's token
    ids, the completion's text or messages), the reward the sum of the reward functions'."""
    from rollout_mock.compare.traces import Trace
    from rollout_mock.text import to_float

    named = trl_outputs(record)
    prompts, completions = named.get("prompt_ids") or [], named.get("completion_ids") or []
    texts = named.get("completions")
    rewards = record.get("rewards")
    per_func = rewards.get("rewards_per_func") if isinstance(rewards, Mapping) else None
    traces = []
    for row in range(min(len(completions), limit)):
        messages: list[dict[str, Any]] = []
        if row < len(prompts):
            ids = [int(t) for t in prompts[row]]
            messages.append({"role": "user", "content": renderer.content(ids), "tokens": ids})
        ids = [int(t) for t in completions[row]]
        text = texts[row] if isinstance(texts, list | tuple) and row < len(texts) else None
        chat = None if isinstance(text, str) else renderer.chat(text)
        if chat:
            messages += [{**m, "role": "assistant" if m["role"] == "user" else m["role"]} for m in chat]
        else:
            messages.append({"role": "assistant", "content": text if isinstance(text, str) else renderer.content(ids),
                             "tokens": ids})
        reward = None
        if per_func is not None and row < len(per_func):
            values = [to_float(v) for v in per_func[row].tolist()]
            finite = [v for v in values if v is not None and v == v]
            reward = sum(finite) if finite else None  # TRL sums the reward functions, NaN ones left out
        traces.append(Trace(row, "ok", reward, messages, {"row": row, "mode": record.get("mode")}))
    return traces


def _ids(value: Any) -> list[int]:
    values = value.tolist() if callable(getattr(type(value), "tolist", None)) else list(value)
    return [int(v) for v in values]


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(m, Mapping) for m in value):  # conversational
        return "".join(str(m.get("content", "")) for m in value)
    return None


def _trl_view(record: Any) -> tuple[Any, list[str | None] | None]:
    """A TRL generation record as verl-like columns (``prompts`` left-padded, ``responses``
    right-padded, masks, ``rewards`` = ``nansum`` of ``rewards_per_func`` as TRL sums them,
    ``rollout_log_probs`` when vLLM recorded them, ``uid`` = runs of one prompt) and the completion
    texts, at most the report's rows; the record itself when it holds no generation output."""
    import math

    import numpy as np
    import torch

    from rollout_mock.debug.report_columns import STATS_ROWS
    from rollout_mock.text import to_float

    try:
        output = record["generate"]["output"]
        prompts = [_ids(p) for p in output[0][:STATS_ROWS]]
        completions = [_ids(c) for c in output[1][:STATS_ROWS]]
    except (KeyError, IndexError, TypeError, ValueError):
        return record, None
    n = min(len(prompts), len(completions))
    if n == 0:
        return record, None
    width_p, width_r = max(len(p) for p in prompts[:n]), max(1, max(len(c) for c in completions[:n]))
    cols: dict[str, Any] = {"prompts": torch.zeros(n, width_p, dtype=torch.long),
                            "responses": torch.zeros(n, width_r, dtype=torch.long),
                            "attention_mask": torch.zeros(n, width_p + width_r, dtype=torch.long),
                            "response_mask": torch.zeros(n, width_r, dtype=torch.long)}
    logprobs = output[4] if len(output) > 4 and isinstance(output[4], list | tuple) else None
    if logprobs is not None:
        cols["rollout_log_probs"] = torch.zeros(n, width_r, dtype=torch.float64)
    uids, group = [], -1
    for i in range(n):
        p, c = prompts[i], completions[i]
        cols["prompts"][i, width_p - len(p):] = torch.tensor(p, dtype=torch.long)
        cols["responses"][i, : len(c)] = torch.tensor(c, dtype=torch.long)
        cols["attention_mask"][i, width_p - len(p): width_p + len(c)] = 1
        cols["response_mask"][i, : len(c)] = 1
        if logprobs is not None and i < len(logprobs) and isinstance(logprobs[i], list | tuple):
            row = [to_float(v) for v in logprobs[i][: len(c)]]
            cols["rollout_log_probs"][i, : len(row)] = torch.tensor([math.nan if v is None else v for v in row],
                                                                    dtype=torch.float64)
        group += i == 0 or p != prompts[i - 1]
        uids.append(f"p{group}")
    cols["uid"] = np.array(uids, dtype=object)
    per_func = (record.get("rewards") or {}).get("rewards_per_func")
    if isinstance(per_func, torch.Tensor) and per_func.ndim == 2 and per_func.shape[0] >= n:
        cols["rewards"] = torch.nansum(per_func[:n].to(torch.float64), dim=1)
    texts = output[3] if len(output) > 3 and isinstance(output[3], list | tuple) else []
    return cols, [_text(texts[i]) if i < len(texts) else None for i in range(n)]


#: Each framework's layout, registered in this order (a log-prob column two of them rank alike
#: names the first: verl's ``rollout_log_probs``, which slime's samples share, read by their own
#: reader). verl: the rollout's log-probs over the response, then the trainer's recompute (and its
#: TensorDict name); ROLL: ``infer_logprobs`` over the sequence but its first token; AReaL:
#: ``logprobs`` aligned with ``input_ids``; slime and TRL hold their batches their own way.
LAYOUTS: tuple[Layout, ...] = (
    Layout("verl", logprob_keys=("rollout_log_probs", "old_log_probs", "log_probs")),
    Layout("roll", logprob_keys=("infer_logprobs",)),
    Layout("areal", logprob_keys=("logprobs",)),
    Layout("slime", logprob_keys=("rollout_log_probs",), matches=lambda b: _slime_samples(b) is not None,
           traces=_slime_traces, count_traces=_count_slime_traces, sequences=_slime_sequences,
           view=lambda b: (_slime_samples(b), None)),
    Layout("trl", matches=TRL_RECORD.matches, traces=_trl_traces, count_traces=TRL_RECORD.rows, view=_trl_view),
)
for _layout in LAYOUTS:
    register_layout(_layout)


# --------------------------------------------------------------------------- ROLL's own mock
def has_native_roll_mock(obj: Any) -> bool:
    """Whether ``obj`` carries ROLL's RolloutMockMixin state with the mock switched on."""
    try:
        cfg = obj.__dict__.get("mock_config")
    except AttributeError:
        return False
    return (
        cfg is not None
        and bool(getattr(cfg, "enable", False))
        and callable(getattr(type(obj), "_maybe_dump_batch", None))
        and callable(getattr(type(obj), "_should_load_mock", None))
    )


def disable_native_roll_mock(obj: Any) -> bool:
    """Turn ROLL's own rollout mock off on ``obj``; return whether it was on."""
    if not has_native_roll_mock(obj):
        return False
    from rollout_mock.text import logger

    obj.mock_config = None
    logger.info(
        "[RolloutMock] %s: ROLL's built-in rollout mock is switched off for this scheduler; "
        "rollout_mock records and replays its batches instead", type(obj).__qualname__,
    )
    return True


def disable_native_roll_mock_in_actor(handle: Any) -> bool:
    """Same, inside a Ray actor (through ``__ray_call__``); ``False`` when not possible."""
    caller = getattr(handle, "__ray_call__", None)
    if caller is None:
        return False
    import ray

    from rollout_mock.text import logger

    try:
        return bool(ray.get(caller.remote(_disable_in_actor), timeout=60))
    except Exception as exc:  # noqa: BLE001 - an actor that cannot run it: its own dump stays as it was
        logger.debug("[RolloutMock] could not check the actor for ROLL's rollout mock: %s", exc)
        return False


def _disable_in_actor(instance: Any) -> bool:
    return disable_native_roll_mock(instance)


@register_scheduler_hook
def prepare_roll_scheduler(scheduler: Any) -> None:
    """The scheduler hook (:mod:`rollout_mock.wrap.hooks`): ROLL's own mock off on an object, an
    instance inside an actor, or (through ``__ray_call__``) the actor behind a handle."""
    from rollout_mock.wrap.calls import is_ray_actor_method

    if is_ray_actor_method(getattr(scheduler, "get_batch", None)):
        disable_native_roll_mock_in_actor(scheduler)
    else:
        disable_native_roll_mock(scheduler)


# --------------------------------------------------------------------------- volatile request fields
#: Fields of each framework's requests (and batches) that differ between two faithful runs of
#: the same training: never compared by request matching or check mode, of that framework's
#: calls only (each adapter names its framework; the generic wrapper compares every field).
VOLATILE_FIELDS: dict[str, tuple[str, ...]] = {
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


# --------------------------------------------------------------------------- live-served fields
#: Volatile fields that flow from a framework's request into its output: after a replay they are
#: served with the live request's value (:func:`serve_live_fields`), never the dump run's. verl:
#: the ``uid`` (a fresh ``uuid4`` per prompt) that an output carrying its request's
#: ``non_tensor_batch`` repeats; ``DataProto.union`` of the live batch with a replayed output
#: holding the dump run's uids fails.
LIVE_FIELDS: dict[str, tuple[str, ...]] = {
    "verl": ("non_tensor_batch.uid",),
}


def serve_live_fields(framework: str, request: Any, replayed: Any) -> Any:
    """``replayed`` with each of ``framework``'s :data:`LIVE_FIELDS` (``part.key`` of a batch
    type's parts) set to ``request``'s value, where both hold that field with the same length;
    otherwise ``replayed`` unchanged. The replayed batch is rebuilt (a shallow copy: its other
    fields are shared), never changed in place."""
    fields = LIVE_FIELDS.get(framework, ())
    if not fields:
        return replayed
    live_parts, out_parts = batch_parts(request), batch_parts(replayed)
    if not live_parts or not out_parts:
        return replayed
    changed: dict[str, dict[Any, Any]] = {}
    for field in fields:
        part, _, key = field.partition(".")
        live, out = live_parts.get(part), changed.get(part, out_parts.get(part))
        if not isinstance(live, Mapping) or not isinstance(out, Mapping) or key not in live or key not in out:
            continue
        value, old = live[key], out[key]
        try:
            same_length = len(value) == len(old)
        except TypeError:
            continue
        if same_length:
            changed[part] = {**out, key: value}
    if not changed:
        return replayed
    from rollout_mock.batch import rebuild

    return rebuild(replayed, changed)


# --------------------------------------------------------------------------- tokenizers
def _sha(data: Any) -> str:
    import hashlib
    import json

    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What decides the tokens of a tokenizer, by content and not by path: SHA-256 prefixes of its
    vocabulary (every token and id, added tokens included), its special tokens and its chat
    template (``None`` without one). A processor (vision-language models) is fingerprinted by its
    tokenizer and its own chat template. Two copies of a tokenizer in other directories (another
    machine, another model path) have one fingerprint; a changed chat template changes
    ``chat_template``. Reads only attributes (``get_vocab()``, ``special_tokens_map``,
    ``chat_template``): no framework is imported."""
    inner = getattr(tokenizer, "tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    if inner is not None and not callable(getattr(tokenizer, "get_vocab", None)):
        tokenizer, template = inner, template if template is not None else getattr(inner, "chat_template", None)
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else {}
    special = getattr(tokenizer, "special_tokens_map", None) or {}
    return {
        "vocab": _sha(sorted((str(k), int(v)) for k, v in dict(vocab).items())),
        "vocab_size": len(vocab),
        "special_tokens": _sha({str(k): v for k, v in dict(special).items()}),
        "chat_template": None if template is None else _sha(template),
    }


def is_tokenizer(value: Any) -> bool:
    """Whether ``value`` looks like a Hugging Face tokenizer or processor (duck-typed)."""
    if isinstance(value, type):
        return False
    return callable(getattr(value, "get_vocab", None)) and hasattr(value, "special_tokens_map") or (
        hasattr(value, "tokenizer") and callable(getattr(getattr(value, "tokenizer", None), "get_vocab", None))
        and callable(getattr(value, "apply_chat_template", None)))


# --------------------------------------------------------------------------- data files
#: Bytes of a data file hashed in full; a larger file is hashed by its first and last halves of
#: this many bytes, with its size (``"sampled": true``).
FILE_HASH_LIMIT = 1 << 30
#: Files of a directory fingerprinted (sorted by name); more are counted, not hashed.
DIRECTORY_FILES = 256


def _hash_file(path: str, size: int) -> tuple[str, bool]:
    import hashlib

    digest = hashlib.sha256()
    sampled = size > FILE_HASH_LIMIT
    with open(path, "rb") as f:
        ranges = [(0, FILE_HASH_LIMIT // 2), (size - FILE_HASH_LIMIT // 2, FILE_HASH_LIMIT // 2)] if sampled \
            else [(0, size)]
        for start, length in ranges:
            f.seek(start)
            while length > 0:
                chunk = f.read(min(length, 1 << 20))
                if not chunk:
                    break
                digest.update(chunk)
                length -= len(chunk)
    return digest.hexdigest()[:16], sampled


def file_fingerprint(path: Any) -> Any:
    """A data file by content, not by path: ``{"size", "sha256"}`` (SHA-256 prefix, streamed in
    1 MiB chunks; a file over :data:`FILE_HASH_LIMIT` bytes by its first and last halves of it,
    ``"sampled": true``); a directory as its files' fingerprints by relative name (at most
    :data:`DIRECTORY_FILES`); a path that is not there as ``{"missing": <its name>}``; a list of
    paths item by item. The same file in another directory (another machine) has the same
    fingerprint; a file of the same size with other contents does not."""
    import os

    if isinstance(path, list | tuple):
        return [file_fingerprint(p) for p in path]
    if not isinstance(path, str | os.PathLike):
        return path
    text = os.fspath(path)
    if os.path.isdir(text):
        names = sorted(os.path.relpath(os.path.join(d, f), text) for d, _, files in os.walk(text) for f in files)
        out: dict[str, Any] = {name: file_fingerprint(os.path.join(text, name)) for name in names[:DIRECTORY_FILES]}
        if len(names) > DIRECTORY_FILES:
            out["(files)"] = len(names)
        return out
    if not os.path.isfile(text):
        return {"missing": os.path.basename(text.rstrip("/\\"))}
    size = os.path.getsize(text)
    sha, sampled = _hash_file(text, size)
    return {"size": size, "sha256": sha, **({"sampled": True} if sampled else {})}
