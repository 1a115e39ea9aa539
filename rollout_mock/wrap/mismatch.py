"""Acting on request matching: compare a call with its recorded call, explain a difference, and
the rollout-settings pre-flight check.

:class:`RequestMatcher` belongs to one stream's interceptor. Dump mode asks it for the digest of
each call (:meth:`RequestMatcher.request`, stored with the step); mock and check mode also call
:meth:`RequestMatcher.check` before the recorded batch is served. A difference is explained from
the recorded structure (:mod:`rollout_mock.wrap.matching`), walked by the structural comparison
engine (:mod:`rollout_mock.codec.structure`) beside the live one: which argument (or field inside one)
differs and how — kind, dtype, shape, length, the first differing index with both values where
the recorded values are kept, else the first differing row block — whether the call equals the
recorded call of a *nearby* step (a shifted data loader), and the fixes. ``on_mismatch: error``
raises :class:`~rollout_mock.errors.ReplayMismatchError`; ``warn`` logs it (once per method).

Dumps recorded before request matching replay as before; one warning says they cannot be matched.
A call recorded with another digest format (:data:`~rollout_mock.wrap.matching.REQUEST_FORMAT`)
is never compared (equal calls would differ): ``on_mismatch: error`` raises
:class:`~rollout_mock.errors.FormatVersionError` ("recorded with another digest format; re-dump
or match_on: [step]"), ``warn`` says so once.

What is compared: ``match_on`` (:class:`~rollout_mock.config.MatchSettings`) names *matchers* or
dotted paths, as vcrpy's ``match_on`` does. A name registered with :func:`register_matcher` is
that matcher (a function of the recorded and the live :class:`~rollout_mock.wrap.matching.Request`:
``True``/``None`` when they match, ``False`` or an ``AssertionError`` with the reason when not);
any other entry is an argument name or a dotted path into the recorded structure
(``data.batch.input_ids``, ``data.a.b.c.d.e``). Built in: ``step`` (compares nothing: the step
alone picks the record) and ``request`` (the whole call, as ``match_on: null``).

Rollout settings (:func:`check_settings`): a flat mapping of the rollout side's settings (TRL's
``num_generations``, sampling parameters...; flattened by
:func:`rollout_mock.codec.structure.flatten_settings`), recorded with the stream's methods in dump
mode and compared, every one, by the engine's equality when a mock or check run wraps the
scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout_mock.codec.structure import compare_batches, differing_keys, flatten_settings
from rollout_mock.config import MatchSettings, MismatchPolicy, StoreSettings
from rollout_mock.errors import (
    ConfigError,
    CorruptStepError,
    FormatVersionError,
    ReplayMismatchError,
    RolloutSettingsMismatchError,
)
from rollout_mock.modes import Mode
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import Store, open_store
from rollout_mock.text import logger, short_repr, terminal_safe
from rollout_mock.wrap.calls import step_names
from rollout_mock.wrap.matching import (
    MAX_NODES,
    MAX_STRUCTURE_BYTES,
    REQUEST_FORMAT,
    Node,
    Request,
    block_bounds,
    digest_request,
)

__all__ = [
    "Difference", "KeyFunction", "Matcher", "RequestMatcher", "bind_arguments", "check_dump_settings",
    "check_settings", "differences", "matcher_names", "register_matcher",
]

#: A request key function: the call's named arguments (step left out) -> what is compared.
KeyFunction = Callable[[dict[str, Any]], Any]
#: A named matcher: ``(recorded, live) -> True/None`` when the calls match, ``False`` (or an
#: ``AssertionError`` whose message says why) when they do not.
Matcher = Callable[[Request, Request], "bool | None"]


#: Recorded steps searched (nearest first) for one equal to a mismatched call.
NEAREST_SEARCH = 32
_FIXES = (
    "Fixes: give this run the same inputs as the dump run (data seed, batch size, sampling "
    "arguments, the step it starts at); a run shifted against the dump (resumed, or a loader that "
    "skips) maps its steps with step_offset / step_map; compare fewer arguments with match_on: "
    "[<names or dotted paths>] (match_on: [step] compares none); or on_mismatch: warn serves the "
    "recorded batch anyway."
)


@dataclass(frozen=True)
class Difference:
    """How one argument (or a field inside it) differs: ``path``, a sentence, both values."""

    path: str
    what: str
    recorded: str
    live: str


def _summary(node: Node | None) -> str:
    if node is None:
        return "absent"
    info = node.info
    kind = str(info.get("k", "?"))
    if kind in ("tensor", "array"):
        return f"{kind} {info.get('dtype')} {info.get('shape')}"
    if kind == "str":
        return f"str {short_repr(info.get('v'), 60)} ({info.get('len')} chars)"
    if kind in ("list", "tuple", "set", "dict"):
        return f"{kind} of {info.get('len')}"
    if "v" in info:
        return f"{kind} {short_repr(info['v'], 60)}"
    return f"{kind} {info.get('t', '')}".strip()


_NON_FINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


def _value(info: Mapping[str, Any]) -> str:
    """A kept scalar as written in Python (non-finite floats as ``inf``/``nan``)."""
    value = info.get("v")
    if info.get("k") == "float" and isinstance(value, str):
        return _NON_FINITE.get(value, value)
    return short_repr(value)


def _index(flat: int, shape: Any) -> str:
    dims = [int(d) for d in shape if isinstance(d, int)] if isinstance(shape, list) else []
    if len(dims) <= 1:
        return f"[{flat}]"
    out = []
    for size in reversed(dims):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return "[" + ", ".join(str(i) for i in reversed(out)) + "]"


def _describe(path: str, rec: Node | None, live: Node | None, unkept: str = "") -> Difference:
    recorded, now = _summary(rec), _summary(live)
    if rec is None or live is None:
        where = "passed now, not in the dump run's call" if rec is None else "in the dump run's call, not passed now"
        return Difference(path, f"{where} ({recorded if live is None else now})", recorded, now)
    a, b = rec.info, live.info
    kind = a.get("k")
    if kind != b.get("k") or a.get("t") != b.get("t"):
        return Difference(path, f"a {recorded} in the dump run, a {now} now", recorded, now)
    for attribute in ("dtype", "shape", "batch_size", "len"):
        if a.get(attribute) != b.get(attribute):
            return Difference(path, f"{attribute} {a.get(attribute)} in the dump run, {b.get(attribute)} now",
                              str(a.get(attribute)), str(b.get(attribute)))
    if "v" in a and a.get("v") != b.get("v"):
        if kind == "str":
            first = next((i for i, (x, y) in enumerate(zip(str(a["v"]), str(b["v"]))) if x != y), None)
            at = "" if first is None else f", first difference at character {first}"
            return Difference(path, f"{short_repr(a['v'], 60)} in the dump run, {short_repr(b['v'], 60)} now{at}",
                              short_repr(a["v"], 60), short_repr(b["v"], 60))
        x, y = _value(a), _value(b)
        return Difference(path, f"{x} in the dump run, {y} now", x, y)
    row = _row_difference(path, a, b)
    if row is not None:
        return row
    head_a, head_b = a.get("head") or [], b.get("head") or []
    for i, (x, y) in enumerate(zip(head_a, head_b)):
        if x != y:
            where = _index(i, a.get("shape")) if kind in ("tensor", "array") else f"[{i}]"
            return Difference(path, f"first difference at {where}: {short_repr(x)} in the dump run, "
                                    f"{short_repr(y)} now", short_repr(x), short_repr(y))
    blocks_a, blocks_b = a.get("b") or [], b.get("b") or []
    raw_shape = a.get("shape")
    shape: list[Any] = raw_shape if isinstance(raw_shape, list) else []
    unit = "items" if kind in ("list", "tuple") else str(a.get("bu", "rows"))
    dims = [int(d) for d in shape if isinstance(d, int)]
    rows = a.get("len") if kind in ("list", "tuple") else dims[0] if unit == "rows" and dims else math.prod(dims)
    if isinstance(rows, int) and len(blocks_a) == len(blocks_b) and blocks_a:
        bounds = block_bounds(rows)
        for i, (x, y) in enumerate(zip(blocks_a, blocks_b)):
            if x != y and i < len(bounds):
                start = 0 if i == 0 else bounds[i - 1]
                why = "past the first values, which are equal: the recorded values there are not kept" \
                    if head_a else f"the recorded {unit[:24]} are not kept"
                return Difference(path, f"first difference in {unit[:24]} {start}-{bounds[i] - 1} of {rows} ({why})",
                                  recorded, now)
    if "keys" in a and a.get("keys") != b.get("keys"):
        only_a = [k for k in a["keys"] if k not in b.get("keys", [])]
        only_b = [k for k in b.get("keys", []) if k not in a["keys"]]
        return Difference(path, f"keys only in the dump run: {only_a or 'none'}; only now: {only_b or 'none'}",
                          recorded, now)
    return Difference(path, f"same {recorded}, other contents{unkept}", recorded, now)


#: Longest line of a mismatch message (values from the dump are cut: a recorded value is never echoed whole).
MAX_LINE = 500


def _line(text: str) -> str:
    """One line of a mismatch message: escapes for control characters (newlines included: a value
    cannot add lines), cut to :data:`MAX_LINE` characters."""
    text = terminal_safe(text, newlines=False)
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


#: Names of the fields that hold a request's prompts, most telling first: when several fields of
#: a request differ (a data-seed change alters verl's ``raw_prompt`` and the ``index`` inside its
#: ``extra_info``), the explanation names the prompts.
PROMPT_FIELDS = ("raw_prompt", "prompt", "prompts", "messages", "raw_prompt_ids", "prompt_ids", "input_ids",
                 "question", "problem", "data", "text")


def _window(x: str, y: str, width: int = 70) -> tuple[str, str]:
    """Both texts around their first differing character (``...`` where cut)."""
    first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    start = max(0, first - width // 3)

    def cut(text: str) -> str:
        part = text[start:start + width]
        return ("..." if start else "") + part + ("..." if start + width < len(text) else "")

    return cut(x), cut(y)


def _row_difference(path: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> Difference | None:
    """The first differing row of a list of containers (an object column), from the row CRCs
    kept with both nodes: the row and, for dict rows, the first differing key, with both values
    where the row's values are kept (the first rows); ``None`` when no row CRC differs."""
    crcs_a, crcs_b = a.get("rc"), b.get("rc")
    if not isinstance(crcs_a, list) or not isinstance(crcs_b, list):
        return None
    row = next((i for i, (x, y) in enumerate(zip(crcs_a, crcs_b)) if x != y), None)
    if row is None:
        return None
    values_a, values_b = a.get("rv") or [], b.get("rv") or []
    if row >= len(values_a) or row >= len(values_b):
        shown = len(values_a)
        return Difference(path, f"first difference in row {row} (only the first {shown} rows' values are kept)",
                          f"row {row}", f"row {row}")
    x, y = values_a[row], values_b[row]
    if isinstance(x, dict) and isinstance(y, dict):
        keys = {k: i for i, k in enumerate([*x, *(k for k in y if k not in x)])}
        key = next((k for k in sorted(keys, key=lambda k: (k not in PROMPT_FIELDS, keys[k]))
                    if x.get(k) != y.get(k)), None)
        if key is None:
            return Difference(path, f"first difference in row {row}, past the values kept", f"row {row}", f"row {row}")
        if key not in x or key not in y:
            where = "only now" if key not in x else "only in the dump run"
            return Difference(path, f"row {row}: key {key!r} {where}", f"row {row}", f"row {row}")
        x, y = _window(str(x[key]), str(y[key]))
        return Difference(path, f"row {row}, key {key!r}: {x} in the dump run, {y} now", x, y)
    x, y = _window(str(x), str(y))
    return Difference(path, f"row {row}: {x} in the dump run, {y} now", x, y)


def _unkept_field(parent: Node | None, child: str) -> bool:
    """Whether the field ``child`` is in the value of ``parent`` though not kept as a node (its
    name listed among the parent's keys, or the listing cut short)."""
    if parent is None:
        return False
    keys = parent.info.get("keys")
    if not isinstance(keys, list):
        return False
    length = parent.info.get("len")
    return child.rsplit(".", 1)[-1][:40] in keys or (isinstance(length, int) and length > len(keys))


class _Leaf:
    """A recorded node as a leaf of the structural comparison engine's walk: equal by digest,
    shown by its summary."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Leaf) and other.node.digest == self.node.digest

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return _summary(self.node)


def _tree(path: str, nodes: Mapping[str, Node]) -> Any:
    """The kept structure at ``path`` as nested dicts, a node without kept fields as a
    :class:`_Leaf`: what the engine walks."""
    prefix = path + "."
    heads = dict.fromkeys(p[len(prefix):].split(".", 1)[0] for p in nodes if p.startswith(prefix))
    if not heads:
        return _Leaf(nodes[path])
    return {head: _tree(prefix + head, nodes) for head in heads}


def _deepest(path: str, rec: dict[str, Node], live: dict[str, Node], unkept: str = "") -> Difference:
    """The deepest kept node under ``path`` that differs, described: the recorded and the live
    structure compared by the structural comparison engine
    (:func:`rollout_mock.codec.structure.compare_batches`); among several differing fields, the
    prompts (:data:`PROMPT_FIELDS`) first, then the recorded order. ``unkept``: why the recorded
    structure may stop above the field that differs (said when it ends at a container)."""
    found, _ = compare_batches(_tree(path, rec), _tree(path, live))
    order = {p: i for i, p in enumerate([*rec, *(p for p in live if p not in rec)])}
    candidates: list[tuple[str, str]] = []
    for diff in found:
        full = path if diff.key == "<batch>" else f"{path}.{diff.key}"
        parent = full.rsplit(".", 1)[0]
        if (diff.status == "only_in_b" and _unkept_field(rec.get(parent), full)) or (
                diff.status == "only_in_a" and _unkept_field(live.get(parent), full)):
            continue  # in that call, past what its structure kept: not compared
        candidates.append((full, diff.status))
    if not candidates:  # differing digests, equal kept fields: the deepest differing node, said why
        candidates = [(p, "different") for p in rec if (p == path or p.startswith(path + "."))
                      and p in live and rec[p].digest != live[p].digest]
        candidates = [c for c in candidates if c[0].count(".") == max(p.count(".") for p, _ in candidates)]
    full, status = min(candidates, key=lambda c: _rank(c[0], path, order))
    if status == "only_in_a":
        return _describe(full, rec.get(full), None)
    if status == "only_in_b":
        return _describe(full, None, live.get(full))
    return _describe(full, rec.get(full), live.get(full), unkept)


def _rank(full: str, root: str, order: Mapping[str, int]) -> list[tuple[bool, int]]:
    """Where a differing field comes among others: level by level, prompts first, then in the
    recorded order."""
    out: list[tuple[bool, int]] = []
    at = root
    for name in full[len(root) + 1:].split(".") if full != root else []:
        at = f"{at}.{name}"
        out.append((name not in PROMPT_FIELDS, order.get(at, len(order))))
    return out


def _whole(recorded: Request, live: Request) -> list[Difference]:
    """The built-in ``request`` matcher: every argument (the call's digest)."""
    if recorded.digest == live.digest:
        return []
    rec = {n.path: n for n in recorded.nodes}
    now = {n.path: n for n in live.nodes}
    out = _compared(sorted(set(recorded.arguments) | set(live.arguments)), rec, now, _unkept(recorded))
    if not out:  # equal kept nodes, other digests (a node past the bound)
        out.append(Difference("(request)", f"other contents than the dump run's call{_unkept(recorded)}", "", ""))
    return out


def _compared(paths: Sequence[str], rec: dict[str, Node], now: dict[str, Node], unkept: str) -> list[Difference]:
    out = []
    for path in paths:
        a, b = rec.get(path), now.get(path)
        if (a is None and b is None) or (a is not None and b is not None and a.digest == b.digest):
            continue
        out.append(_deepest(path, rec, now, unkept) if a is not None and b is not None else _describe(path, a, b))
    return out


def _unkept(recorded: Request) -> str:
    """Why the fields below a differing node may be missing from the recorded structure (the
    end of an explanation that cannot go deeper), or ``""`` when every field was kept."""
    if not recorded.deep:
        return ("; the dump run kept only 24 fields to depth 4 (an older rollout_mock): re-dump (mode: dump) "
                "with this version to see the field that differs")
    if recorded.dropped:
        return (f"; {recorded.dropped} field(s) of the dump run's call were past the {MAX_NODES} fields "
                f"({MAX_STRUCTURE_BYTES} bytes) it kept: name the path in match_on when dumping to keep it")
    return ""


_MATCHERS: dict[str, Matcher] = {}
_BUILT_IN = ("step", "request")


def register_matcher(name: str, matcher: Matcher) -> None:
    """Add a named matcher (as vcrpy's ``register_matcher``): ``match_on: [name, ...]`` then runs
    ``matcher(recorded, live)`` over the recorded and the live :class:`~rollout_mock.wrap.matching.Request`
    (:meth:`~rollout_mock.wrap.matching.Request.get` gives a path's node: ``digest``, ``info``).
    It returns ``True`` (or ``None``) when the calls match, ``False`` or raises ``AssertionError``
    with the reason when they do not. A registered name wins over an argument of that name; names
    are plain (no ``.``, ``[``), so a dotted path is never a matcher. Registering a name again
    replaces its matcher; the built-ins (``step``, ``request``) cannot be replaced."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in ".[] "):
        raise ConfigError(f"register_matcher: {name!r} is not a matcher name: a plain word without '.', '[' or "
                          f"spaces (dotted entries of match_on are paths)")
    if name in _BUILT_IN:
        raise ConfigError(f"register_matcher: {name!r} is a built-in matcher; register another name")
    if not callable(matcher):
        raise ConfigError(f"register_matcher({name!r}): expected a callable (recorded, live) -> bool, got {matcher!r}")
    _MATCHERS[name] = matcher


def matcher_names() -> list[str]:
    """The names ``match_on`` takes as matchers: the built-ins, then the registered ones."""
    return [*_BUILT_IN, *sorted(_MATCHERS)]


def _run_matcher(name: str, recorded: Request, live: Request) -> list[Difference]:
    if name == "step":
        return []
    if name == "request":
        return _whole(recorded, live)
    try:
        verdict = _MATCHERS[name](recorded, live)
    except AssertionError as exc:
        reason = str(exc) or "they differ"
        return [Difference(name, f"matcher {name!r}: {reason}", "", "")]
    if verdict is None or verdict is True:
        return []
    if verdict is False:
        return [Difference(name, f"matcher {name!r} says the calls differ", "", "")]
    raise ConfigError(f"matcher {name!r} returned {short_repr(verdict, 60)}; a matcher returns True/None "
                      f"(match) or False (no match), or raises AssertionError with the reason")


def _is_matcher(entry: str) -> bool:
    return entry in _BUILT_IN or entry in _MATCHERS


def differences(recorded: Request, live: Request, scope: Sequence[str] | None = None) -> list[Difference]:
    """What differs between two requests: empty when they are equal within ``scope``, the
    ``match_on`` entries (matcher names or argument names and dotted paths; ``None``: the whole
    call)."""
    if scope is None:
        return _whole(recorded, live)
    rec = {n.path: n for n in recorded.nodes}
    now = {n.path: n for n in live.nodes}
    out: list[Difference] = []
    paths: list[str] = []
    for entry in scope:
        if _is_matcher(entry):
            out += _compared(paths, rec, now, _unkept(recorded))
            paths = []
            out += _run_matcher(entry, recorded, live)
        else:
            paths.append(entry)
    return out + _compared(paths, rec, now, _unkept(recorded))


def bind_arguments(args: Sequence[Any], kwargs: Mapping[str, Any], params: Sequence[str] | None,
                   step_position: int | None) -> dict[str, Any]:
    """The call's arguments by parameter name (``args[i]`` where no name is known), the step left out."""
    named: dict[str, Any] = {}
    for index, value in enumerate(args):
        name = params[index] if params is not None and index < len(params) else f"args[{index}]"
        if index != step_position and name not in step_names():
            named[name] = value
    for name, value in kwargs.items():
        if name not in step_names():
            named[str(name)] = value
    return named


class RequestMatcher:
    """Request matching for one stream of a store (see the module docstring). ``keys``: per-method
    key functions (a key function gets the call's named arguments, step left out, and returns what
    is digested: a mapping's items become the compared names). ``context``: ``mode``, ``split``
    and ``path`` (the dump) for messages. ``framework``: whose volatile fields are left out
    (:func:`~rollout_mock.wrap.hooks.volatile_patterns`; ``None``: none)."""

    def __init__(self, settings: MatchSettings, store: Store, stream: StreamId, *,
                 keys: Mapping[str, KeyFunction] | None = None, context: Mapping[str, Any] | None = None,
                 framework: str | None = None) -> None:
        self.settings = settings
        self.framework = framework
        self.store = store
        self.stream = stream
        self.context = {**(context or {}), "stream": stream.key}
        self.keys: dict[str, KeyFunction] = dict(keys or {})
        self._warned_unmatched = False
        self._warned: set[str] = set()
        self._scope_checked = False

    def register_key(self, method: str, key: KeyFunction) -> None:
        """Digest ``key(arguments)`` instead of the arguments of ``method`` (in both modes)."""
        if not callable(key):
            raise ConfigError(f"match key of {method!r}: expected a callable of the named arguments, got {key!r}")
        self.keys[method] = key

    def request(self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any], params: Sequence[str] | None,
                step_position: int | None) -> Request | None:
        """The digest of a call (``None`` with ``match_on: [step]``)."""
        if not self.settings.enabled:
            return None
        arguments = bind_arguments(args, kwargs, params, step_position)
        key = self.keys.get(method)
        if key is not None:
            value = key(arguments)
            arguments = {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {"key": value}
        forced = [p for p in self.settings.match_on or () if not _is_matcher(p)]
        return digest_request(arguments, forced=forced, framework=self.framework)

    def recorded_settings(self, method: str) -> dict[str, Any] | None:
        """The rollout settings recorded with ``method`` of this stream, if any."""
        settings = self.store.methods(self.stream).get(method, {}).get("settings")
        return settings if isinstance(settings, dict) else None

    def check_settings(self, settings: Mapping[str, Any] | None, method: str) -> None:
        """The pre-flight check of ``settings`` against the recorded ones (:func:`check_settings`)."""
        if settings is not None:
            check_settings(self.recorded_settings(method), settings, policy=self.settings.policy, context=self.context)

    def _nearby(self, dump_step: int) -> list[tuple[int, Mapping[str, Any] | None]]:
        steps = sorted(self.store.steps(self.stream), key=lambda s: (abs(s - dump_step), s))[:NEAREST_SEARCH]
        out: list[tuple[int, Mapping[str, Any] | None]] = []
        for other in steps:
            entry = self.store.entry(self.stream, other)
            out.append((other, None if entry is None else entry.call))
        return out

    def check(self, live: Request | None, *, step: int, dump_step: int, method: str) -> None:
        """Compare a call with the recorded call of ``dump_step`` (its step file's); act on a
        difference."""
        if live is None:
            return
        entry = self.store.entry(self.stream, dump_step)
        raw = ((None if entry is None else entry.call) or {}).get("request")
        self.check_recorded(raw, live, step=step, dump_step=dump_step, method=method)

    def check_recorded(self, raw: Any, live: Request, *, step: int, dump_step: int, method: str,
                       call: int | None = None) -> None:
        """Compare a call with a recorded request (``raw``: its JSON); act on a difference.
        ``call``: the recorded call's index in its step, named in the error (``None``: a step of
        one call)."""
        context = self.context
        recorded = self._recorded(raw, step=step, dump_step=dump_step, method=method)
        if recorded is None and Request.format_of(raw) not in (None, REQUEST_FORMAT):
            self._other_format(Request.format_of(raw), step=step, dump_step=dump_step, method=method)
            return
        if recorded is None:
            if not self._warned_unmatched:
                self._warned_unmatched = True
                logger.warning(
                    "[RolloutMock] %s of %s was recorded without request digests (before rollout_mock "
                    "recorded them, or with match_on: [step]): its calls cannot be matched; the step alone "
                    "picks each recorded batch", context.get("stream"), context.get("path"))
            return
        scope = self.settings.match_on
        if scope is not None and not self._scope_checked:
            self._scope_checked = True
            kept = {n.path for n in recorded.nodes}
            unknown = [p for p in scope if p not in kept and p not in live.arguments and not _is_matcher(p)]
            if unknown:
                if not recorded.deep:
                    why = ("the dump was recorded by an older rollout_mock, which kept only 24 fields to depth 4 of "
                           "each call: re-dump (mode: dump) with this version, which records the call's structure")
                elif recorded.dropped:
                    why = (f"the dump run kept {len(kept)} fields of the call ({recorded.dropped} past its bound of "
                           f"{MAX_NODES} fields, {MAX_STRUCTURE_BYTES} bytes): re-dump with match_on naming these "
                           f"paths (the dump run then keeps them)")
                else:
                    why = "the dump run's call has no such field: name arguments or dotted paths of the call"
                raise ConfigError(
                    f"[RolloutMock] mode={context.get('mode')}, match_on: {unknown} not recorded with step {dump_step} "
                    f"of {context.get('stream')} (recorded: {sorted(kept)[:40]}); {why}; or match on registered "
                    f"matchers ({', '.join(matcher_names())})")
        found = differences(recorded, live, scope)
        if not found:
            return
        nearest = self._nearest(live, self._nearby(dump_step), dump_step) if call is None else None
        message = self._message(found, step=step, dump_step=dump_step, method=method, nearest=nearest, context=context,
                                call=call)
        if self.settings.policy is MismatchPolicy.WARN:
            if method not in self._warned:
                self._warned.add(method)
                logger.warning("%s\n(on_mismatch: warn: the recorded batch is served; further mismatches of %s "
                               "are not reported)", message, method)
            return
        first = found[0]
        raise ReplayMismatchError(
            message, method=method, argument=first.path, dump_step=dump_step, recorded=first.recorded,
            live=first.live, nearest=nearest, mode=context.get("mode"), split=context.get("split"), step=step,
            path=context.get("path"), call=call)

    def _recorded(self, raw: Any, *, step: int, dump_step: int, method: str) -> Request | None:
        """The recorded request of ``dump_step``; :class:`CorruptStepError` when it is of this
        format but malformed (never replayed as unmatched)."""
        problem = Request.problem(raw)
        if problem is not None:
            context = self.context
            mapped = "" if dump_step == step else f" (dump step {dump_step})"
            raise CorruptStepError(
                f"[RolloutMock] mode={context.get('mode')}, {context.get('stream')} step {step}{mapped}: the "
                f"recorded call of {method} is damaged ({problem}), so this call cannot be matched against it; "
                f"re-dump that step (mode: dump, overwrite: true) or restore the dump from a copy",
                mode=context.get("mode"), split=context.get("split"), step=step, path=context.get("path"))
        return Request.from_json(raw)

    def _other_format(self, version: Any, *, step: int, dump_step: int, method: str) -> None:
        """A call recorded with another digest format: its digest cannot be compared with this
        run's (equal calls would differ), so nothing is compared; ``on_mismatch: error`` says so
        with a FormatVersionError, ``warn`` once and serves."""
        context = self.context
        mapped = "" if dump_step == step else f" (dump step {dump_step})"
        message = (
            f"[RolloutMock] mode={context.get('mode')}, {context.get('stream')} step {step}{mapped}: {method}'s "
            f"call was recorded with another digest format (v{short_repr(version, 20)}; this rollout_mock "
            f"digests calls with v{REQUEST_FORMAT}), so it cannot be compared with this run's call. Fixes: "
            f"re-dump with this version (mode: dump), or match_on: [step] to pick each recorded batch by its "
            f"step alone; on_mismatch: warn replays without comparing.")
        if self.settings.policy is MismatchPolicy.WARN:
            if not self._warned_unmatched:
                self._warned_unmatched = True
                logger.warning("%s\n(on_mismatch: warn: the recorded batches are served unmatched)", message)
            return
        raise FormatVersionError(message, mode=context.get("mode"), split=context.get("split"), step=step,
                                 path=context.get("path"))

    @staticmethod
    def _nearest(live: Request, nearby: list[tuple[int, Mapping[str, Any] | None]], dump_step: int) -> int | None:
        for other, call in nearby:
            if other != dump_step:
                recorded = Request.from_json((call or {}).get("request"))
                if recorded is not None and recorded.digest == live.digest:
                    return other
        return None

    @staticmethod
    def _message(found: list[Difference], *, step: int, dump_step: int, method: str, nearest: int | None,
                 context: Mapping[str, Any], call: int | None = None) -> str:
        mapped = "" if dump_step == step else f" (dump step {dump_step})"
        which = "the dump run's call of that step" if call is None else (
            f"every call of that step the dump run made and this run has not been served yet; compared with "
            f"the first of them, call {call}")
        lines = [
            f"[RolloutMock] mode={context.get('mode')}, {context.get('stream')} step {step}{mapped}"
            f"{'' if call is None else f', call {call}'}: {method} asks for other data than {which}, so its "
            f"recorded batch is not what this run would train on; it is not served.",
        ]
        lines += [_line(f"  {d.path}: {d.what}") for d in found[:6]]
        if len(found) > 6:
            lines.append(f"  ... and {len(found) - 6} more argument(s)")
        if nearest is not None:
            shift = nearest - dump_step
            lines.append(f"The dump run's call of step {nearest} equals this one: is this run shifted by {shift:+d} "
                         f"step(s) against the dump (a resumed run, a loader that skips)? step_offset: "
                         f"{shift + dump_step - step} maps it.")
        lines.append(_FIXES)
        return terminal_safe("\n".join(lines))


# ----------------------------------------------------------------------------- rollout settings
def check_settings(recorded: Mapping[str, Any] | None, live: Mapping[str, Any] | None, *, policy: MismatchPolicy,
                   context: Mapping[str, Any]) -> None:
    """The pre-flight check: one :class:`~rollout_mock.errors.RolloutSettingsMismatchError` listing
    every setting that differs (``warn``: a warning): ``live`` flattened as the dump run's were
    (:func:`~rollout_mock.codec.structure.flatten_settings`), compared key by key with the
    structural comparison engine's equality (:func:`~rollout_mock.codec.structure.differing_keys`:
    same type, floats by bit pattern; ``1`` and ``1.0`` differ). Nothing happens without live settings; a
    dump recorded without settings is said once."""
    if live is None:
        return
    if recorded is None:
        logger.warning("[RolloutMock] %s of %s was recorded without rollout settings: this run's settings "
                       "cannot be checked against it", context.get("stream"), context.get("path"))
        return
    now = flatten_settings(live) or {}
    shown = [(k, recorded[k] if k in recorded else "<absent>", now[k] if k in now else "<absent>")
             for k in differing_keys(recorded, now)]
    if not shown:
        return
    lines = [f"  {k}: {short_repr(a)} in the dump run, {short_repr(b)} now" for k, a, b in shown[:40]]
    if len(shown) > 40:
        lines.append(f"  ... and {len(shown) - 40} more")
    message = (
        f"[RolloutMock] pre-flight check failed (mode={context.get('mode')}): the rollout settings of this run differ "
        f"from the ones {context.get('path')} was recorded with ({context.get('stream')}), so the recorded batches "
        f"are not what this run would generate:\n" + "\n".join(lines) +
        "\nFixes: run with the dump run's settings, or record a new dump with these (mode: dump); "
        "on_mismatch: warn replays anyway."
    )
    if policy is MismatchPolicy.WARN:
        logger.warning(message)
        return
    raise RolloutSettingsMismatchError(message, differences=shown, mode=context.get("mode"),
                                       split=context.get("split"), path=context.get("path"))


def check_dump_settings(store: StoreSettings, match: MatchSettings, settings: Mapping[str, Any] | None, *,
                        mode: Mode) -> None:
    """The pre-flight check against a whole dump, for wrappers that build their schedulers later
    (ROLL's actors): the first stream of the dump at ``store`` that recorded settings is compared
    with ``settings``, under ``match``'s policy. Nothing to check outside mock and check mode
    (``mode``) or without settings. A missing dump is left to the schedulers to report."""
    if settings is None or not mode.replays:
        return
    opened = open_store(store, mode=mode.value)
    try:
        if not opened.has_dump():  # the scheduler itself says so, where it always has
            return
        recorded, where = None, None
        for stream in opened.stream_ids():
            for info in opened.methods(stream).values():
                if isinstance(info.get("settings"), dict):
                    recorded, where = info["settings"], stream
                    break
            if recorded is not None:
                break
        context = {"mode": mode.value, "path": store.dump_dir, "stream": "any stream" if where is None
                   else where.key, "split": None if where is None else where.split}
        check_settings(recorded, settings, policy=match.policy, context=context)
    finally:
        opened.close()
