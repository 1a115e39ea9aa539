"""Replacing prompt and response text in a batch with placeholders of the same type.

Only fields named as text are touched (token ids are not: they encode the text too, so a dump
with ``--redact`` is safe to share only with people who do not hold the tokenizer, or after
``--keys`` drops the token columns). Names: :data:`TEXT_KEYS`. Under a text key, a string becomes
``"<redacted>"``, a string used as a mapping key ``"<redacted>N"``; chat messages keep their
structure (``role``, ``content``... as keys, the ``role`` and ``type`` values of
:data:`KEPT_VALUES`) and lose their text; lists, tuples, dicts and object arrays keep their shape.
Id-like fields (``uid``, ``index``...) are kept, since training groups samples by them.

One walk (:func:`_Walk`) covers every holder of a value: mappings, lists, tuples (named ones
too), numpy arrays, the parts of every batch type of the batch model (a DataProto's
``non_tensor_batch`` and ``meta_info``, a TensorDict's entries with their ``NonTensorData`` and
``NonTensorStack`` values, bare ones too) and the attribute dict of other objects (registered batch classes,
slime's ``Sample``). It has no depth escape: a container nested deeper than :data:`MAX_DEPTH`
is replaced whole by the placeholder (named ``(nested deeper than 64 levels)`` among the redacted
fields), so nothing is kept for being deep. Each object is visited once (shared references do not
multiply the work).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from rollout_mock.batch import (
    batch_parts,
    batch_type_of,
    instance_state,
    is_array,
    is_tensor,
    rebuild,
    wrapped_value,
)

__all__ = [
    "CALL_ARGUMENTS", "KEPT_VALUES", "MAX_DEPTH", "PLACEHOLDER", "TEXT_KEYS", "redact", "redact_batch", "redact_call",
    "redact_request",
]

PLACEHOLDER = "<redacted>"
#: Field names holding prompt/response text: verl/ROLL non-tensor keys, slime Sample fields.
TEXT_KEYS: frozenset[str] = frozenset({
    "raw_prompt", "raw_prompt_ids_text", "messages", "prompt", "prompts_text", "prompt_text", "response",
    "responses_text", "response_text", "raw_response", "completion", "text", "label", "ground_truth",
    "multi_modal_data", "tools_kwargs", "extra_info",
})
#: Under a text key, the mapping keys kept as they are (the structure of chat messages and their
#: content parts); every other string key is text and is replaced.
_STRUCTURE_KEYS = frozenset({
    "role", "content", "name", "type", "tool_call_id", "tool_calls", "function", "arguments", "id", "text",
    "image", "image_url", "url", "audio", "input_audio", "video", "reasoning_content", "refusal",
})
#: The values kept under a text key: chat roles and content-part types, nothing else.
KEPT_VALUES: Mapping[str, frozenset[str]] = {
    "role": frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"}),
    "type": frozenset({"text", "image", "image_url", "audio", "input_audio", "video", "file", "function",
                       "tool_call", "tool_result", "thinking"}),
}
#: Containers nested deeper than this are replaced whole by the placeholder.
MAX_DEPTH = 64
_TOO_DEEP = f"(nested deeper than {MAX_DEPTH} levels)"


class _Walk:
    """One redaction pass over a value (see the module docstring).

    ``scrub`` (below a text key): every string goes. ``all_keys``: string mapping keys go too,
    structural ones included (a recorded call's arguments). ``hits``: the text keys met."""

    def __init__(self, names: frozenset[str], *, all_keys: bool = False) -> None:
        self.names = names
        self.all_keys = all_keys
        self.hits: set[str] = set()
        self._done: dict[tuple[int, bool], Any] = {}
        self._alive: list[Any] = []  # keeps every visited value alive, so that no id is reused

    def value(self, value: Any, scrub: bool, depth: int = 0) -> Any:
        if isinstance(value, str):
            return PLACEHOLDER if scrub else value
        if isinstance(value, (bytes, bytearray)):
            return PLACEHOLDER.encode() if scrub else value
        if value is None or isinstance(value, (bool, int, float, complex)) or is_tensor(value):
            return value
        if is_array(value) and value.dtype != object:
            if not scrub or value.dtype.kind in "biufcmM":
                return value
            if value.dtype.kind in "US":
                size = max(len(PLACEHOLDER), value.itemsize)
                return np.full(value.shape, PLACEHOLDER, dtype=f"{value.dtype.kind}{size}")
            return PLACEHOLDER  # records (structured dtypes) and raw bytes: their text cannot be told apart
        if depth > MAX_DEPTH:  # no depth escape: the whole container goes
            self.hits.add(_TOO_DEEP)
            return PLACEHOLDER
        memo = (id(value), scrub)
        if memo in self._done:
            return self._done[memo]
        self._alive.append(value)
        self._done[memo] = PLACEHOLDER  # a cycle back to a value being walked: cut there
        out = self._container(value, scrub, depth + 1)
        self._done[memo] = out
        return out

    def _container(self, value: Any, scrub: bool, depth: int) -> Any:
        if isinstance(value, np.ndarray):  # an object array
            array = np.empty(value.shape, dtype=object)
            for idx, item in np.ndenumerate(value):
                array[idx] = self.value(item, scrub, depth)
            return array if _changed(value.reshape(-1), array.reshape(-1)) else value
        if (wrapped := wrapped_value(value)) is not None:  # before the batch types: it has no entries
            return self._wrapped(value, wrapped, scrub, depth)
        if isinstance(value, (set, frozenset)):
            items = [self.value(v, scrub, depth) for v in value]
            return type(value)(items) if _changed(value, items) else value
        kind = batch_type_of(value)
        if kind is not None and kind.name not in ("mapping", "list", "tuple", "tensor") and kind.rebuild is not None:
            parts = batch_parts(value) or {}
            walked = {name: self._field(name, part, scrub, depth) for name, part in parts.items()}
            changed = {name: part for name, part in walked.items() if part is not parts[name]}
            return rebuild(value, changed) if changed else value
        if isinstance(value, Mapping):
            return self._mapping(value, scrub, depth)
        if isinstance(value, list):
            out = [self.value(v, scrub, depth) for v in value]
            return out if _changed(value, out) else value
        if isinstance(value, tuple):
            items = [self.value(v, scrub, depth) for v in value]
            if not _changed(value, items):
                return value
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        return self._object(value, scrub, depth)

    def _field(self, name: Any, value: Any, scrub: bool, depth: int) -> Any:
        """The value of a mapping key or attribute ``name``."""
        if scrub:
            kept = KEPT_VALUES.get(name) if isinstance(name, str) and not self.all_keys else None
            return value if kept is not None and isinstance(value, str) and value in kept else \
                self.value(value, True, depth)
        if isinstance(name, str) and name in self.names:
            out = self.value(value, True, depth)
            if out is not value:  # the report lists only what was changed
                self.hits.add(name)
            return out
        return self.value(value, False, depth)

    def _key(self, key: Any, index: int, scrub: bool) -> Any:
        """A mapping key under a text key: text (a string, bytes, a tuple) is replaced."""
        if not scrub or isinstance(key, (bool, int, float, type(None))):
            return key
        if isinstance(key, str) and key in _STRUCTURE_KEYS and not self.all_keys:
            return key
        return f"{PLACEHOLDER}{index}"

    def _mapping(self, value: Mapping[Any, Any], scrub: bool, depth: int) -> Any:
        items = {self._key(key, i, scrub): self._field(key, item, scrub, depth)
                 for i, (key, item) in enumerate(value.items())}
        if list(items) == list(value.keys()) and not _changed(value.values(), items.values()):
            return value
        return _remake(value, items)

    def _wrapped(self, value: Any, wrapped: tuple[Any, Any], scrub: bool, depth: int) -> Any:
        """A value a framework class wraps (see :func:`~rollout_mock.batch.wrapped_value`), bare
        (not inside a TensorDict, whose parts already show their values): rebuilt around the
        walked value."""
        inner, rewrap = wrapped
        walked = self.value(inner, scrub, depth)
        return value if walked is inner else rewrap(walked)

    def _object(self, value: Any, scrub: bool, depth: int) -> Any:
        """An object of another class: its attribute dict, walked like a mapping (no code of the
        object runs; rebuilt with ``object.__new__``). Anything else is returned as it is, unless it
        is under a text key and is not a known text-free value (an object keeping its text in
        ``__slots__`` or in C): the placeholder then replaces it whole."""
        state = instance_state(value)
        if not state:
            if scrub and not _text_free(value):
                return PLACEHOLDER
            return value
        walked = {name: self._field(name, item, scrub, depth) for name, item in state.items()}
        if not _changed(state.values(), walked.values()):
            return value
        try:
            out = object.__new__(type(value))
            object.__getattribute__(out, "__dict__").update(walked)
        except (TypeError, AttributeError):  # a class object.__new__ cannot make: nothing of it is kept
            return PLACEHOLDER
        return out


def _text_free(value: Any) -> bool:
    """Values that hold no text of their own: numbers, tensors, dtypes, devices, enums' cousins
    (``range``, ``slice``, ``Ellipsis``), classes and functions (their name is code, not data)."""
    import enum
    import types

    if isinstance(value, (type, range, slice, types.FunctionType, types.BuiltinFunctionType,
                          types.ModuleType, np.generic, np.dtype)) or value is Ellipsis:
        return not isinstance(value, (np.str_, np.bytes_, np.void))
    if isinstance(value, enum.Enum):
        return True
    return type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device", "Size")


def _remake(value: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if type(value) is dict:
        return items
    try:
        return cast(Any, type(value))(items)
    except (TypeError, ValueError):  # a mapping type not built from a dict: a plain dict keeps the data
        return items


def _changed(before: Iterable[Any], after: Iterable[Any]) -> bool:
    """Whether any item was replaced."""
    return any(a is not b for a, b in zip(before, after))


def redact(batch: Any, *, keys: Iterable[str] = TEXT_KEYS) -> tuple[Any, list[str]]:
    """``(redacted batch, names of the fields redacted)``; the input batch is not changed (what holds
    no text is shared, not copied).

    Fields named in ``keys`` are scrubbed wherever they are: at the top of a dict batch, in the
    columns, non-tensor columns and ``meta_info`` of a DataProto, in a TensorDict (its non-tensor
    values too), in the items of an AReaL list, inside slime records (samples grouped in lists,
    evaluation data per dataset) and in the attributes of other objects, at any depth (see the
    module docstring for what is deeper than :data:`MAX_DEPTH`)."""
    walk = _Walk(frozenset(keys))
    return walk.value(batch, False), sorted(walk.hits)


#: The parts of a recorded call summary that hold the user's arguments (everything else of it is
#: the index's own structure: the request digest, and what the recorder keys a call by).
CALL_ARGUMENTS = ("args", "kwargs")


def redact_call(call: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A recorded call summary (``{"args": [...], "kwargs": {...}, "request": {...}}``, stored in
    manifest.json and the index) with **every** string of its arguments replaced, mapping keys
    below the top level included: positional arguments have no name to tell a prompt from a mode,
    and a call summary only serves a warning in mock mode.

    The rest is the index's own structure and is never rewritten: the request digest
    (:func:`redact_request`: its digests, argument names and node paths are kept, so a replay from
    a redacted dump still matches every call; only the values kept to explain a mismatch go) and
    any other field the recorder keys a call by."""
    if call is None:
        return None
    walk = _Walk(frozenset(), all_keys=True)
    out: dict[str, Any] = {}
    for name, value in call.items():
        if name in CALL_ARGUMENTS:
            out[name] = walk.value(value, True)
        elif name == "request":
            out[name] = redact_request(value)
        else:
            out[name] = value
    return out


def redact_request(request: Any) -> Any:
    """A recorded request digest (:class:`rollout_mock.wrap.matching.Request` as JSON) with the
    text of its kept node summaries replaced (a string's first characters ``"v"``, the first
    items of a list ``"head"``); digests, argument names, paths and key names stay as they are."""
    if not isinstance(request, Mapping) or not isinstance(request.get("n"), list):
        return request
    nodes = []
    for node in request["n"]:
        if isinstance(node, list) and len(node) == 3 and isinstance(node[2], Mapping):
            info = dict(node[2])
            if isinstance(info.get("v"), str | bytes):
                info["v"] = PLACEHOLDER
            if isinstance(info.get("head"), list):
                info["head"] = [PLACEHOLDER if isinstance(item, str | bytes) else item for item in info["head"]]
            node = [node[0], node[1], info]
        nodes.append(node)
    return {**request, "n": nodes}


#: The package-level name (``rollout_mock.debug.redact`` is this module).
redact_batch = redact
