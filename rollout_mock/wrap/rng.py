"""Random number generator states: capture after a rollout call, restore after replaying it.

A rollout that runs in the training process (TRL's ``model.generate`` with sampling, a reward
function that draws random numbers, an in-process scheduler) advances the process's random
number generators. In mock mode that call does not run, so without help every later draw on
the training side (dropout, ``torch.randperm`` shuffles, sampling) would see another stream and
the replayed run would not be bit-identical. Dump mode therefore records the states *as the
call left them*, and mock mode restores them right after serving the call.

Covered, in this process only:

* torch's default CPU generator (``torch.get_rng_state``);
* torch's default CUDA generator of every visible device, when CUDA is initialised
  (``torch.cuda.get_rng_state_all``); restored only when the device count matches;
* numpy's legacy global generator (``numpy.random.get_state``: what ``np.random.*`` uses);
* Python's ``random`` module.

Not covered (documented in ``docs/determinism.md`` and ``docs/frameworks/trl.md``): other
processes' generators (Ray actors, data loader workers, inference servers), explicit
``torch.Generator`` / ``numpy.random.Generator`` objects a library owns, CUDA generators of
devices that are not visible here, and backends with their own state (MPS, XLA).

The state is plain data (a ``uint8`` tensor, lists of ints, floats), so it loads with the safe
(data-only) loader. :func:`changed` tells whether a call touched any generator, so callers record
a state only for calls that need it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from rollout_mock.errors import CorruptStepError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import BatchInfo, Store
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob
from rollout_mock.text import logger

__all__ = ["RNG_FORMAT", "RNG_NAME", "RngHook", "capture_rng", "changed", "restore_rng", "rng_stream", "validated_rng"]

#: Scheduler name (suffix) of the stream holding the states: ``{split}/rng`` or ``{split}/{name}.rng``.
RNG_NAME = "rng"

#: Value of the ``format`` key of a captured state.
RNG_FORMAT = "rollout_mock.rng/1"


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency, but keep rng usable without it
        return None
    return torch


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return None
    return numpy


def capture_rng() -> dict[str, Any]:
    """The current generator states of this process as plain data (see the module docstring)."""
    state: dict[str, Any] = {"format": RNG_FORMAT}
    version, internal, gauss = random.getstate()
    state["python"] = {"version": version, "state": list(internal), "gauss": gauss}
    np = _numpy()
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached": float(cached)}
    torch = _torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state().clone()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: Any, *, step: int | None = None, where: str = "replay_rng") -> None:
    """Set this process's generators to a state from :func:`capture_rng`: validate, then restore.

    Every field is checked against its generator's exact layout (:func:`validated_rng`) before
    anything is set, so a hostile or damaged state changes nothing and raises
    :class:`~rollout_mock.errors.CorruptStepError` naming ``step``, ``where`` and the field; it
    never reaches numpy, ``random`` or torch (numpy's ``set_state`` takes a position of ``10**8``
    and the process dies of SIGSEGV at its next draw). Parts that are absent (or ``None``) are
    left alone; CUDA states only when the recorded device count equals the visible one.
    """
    for restore in validated_rng(state, step=step, where=where):
        restore()


def validated_rng(state: Any, *, step: int | None = None,
                  where: str = "replay_rng") -> list[Callable[[], None]]:
    """The setters that restore ``state``, each of a state already checked (see :func:`restore_rng`).

    Layouts: ``python`` is ``{"version": 3, "state": 625 ints, "gauss": None or a float}`` whose
    first 624 ints are 32-bit words and whose last (the index) is in ``[0, 624]``; ``numpy`` is
    ``{"name": "MT19937", "keys": 624 uint32, "pos": 0..624, "has_gauss": 0 or 1, "cached": float}``
    or numpy's own dict form (``{"bit_generator": "MT19937", "state": {"key", "pos"}, "has_gauss",
    "gauss"}``); ``torch`` is a ``uint8`` tensor of the size of ``torch.get_rng_state()`` that
    torch accepts as an MT19937 state; ``cuda`` is a list of ``uint8`` tensors, one per device, each
    of the size of that device's state. Floats must be finite.
    """
    check = _Check(step, where)
    if not isinstance(state, dict):
        raise check.fail("the state", f"is a {type(state).__name__}, not a mapping")
    if state.get("format") != RNG_FORMAT:
        raise check.fail("format", f"is {_short(state.get('format'))}, not {RNG_FORMAT!r}")
    unknown = sorted(str(key)[:40] for key in state if key not in _PARTS)
    if unknown:
        raise check.fail(unknown[0], f"is not a part of a {RNG_FORMAT} state (parts: {', '.join(_PARTS[1:])})")
    setters: list[Callable[[], None]] = []
    if state.get("python") is not None:
        python = _python_state(check, state["python"])
        setters.append(lambda: random.setstate(python))
    np = _numpy()
    if state.get("numpy") is not None:
        legacy = _numpy_state(check, np, state["numpy"])
        setters.append(lambda: np.random.set_state(legacy))
    torch = _torch()
    if state.get("torch") is not None:
        cpu = _torch_state(check, torch, "torch", state["torch"], None if torch is None else torch.get_rng_state())
        setters.append(lambda: torch.set_rng_state(cpu))
    if state.get("cuda") is not None:
        cuda = _cuda_states(check, torch, state["cuda"])
        if cuda is not None:
            setters.append(lambda: torch.cuda.set_rng_state_all(cuda))
    return setters


#: The keys of a captured state, ``format`` first.
_PARTS = ("format", "python", "numpy", "torch", "cuda")
_WORD = 1 << 32
_MT_N = 624
#: Most CUDA devices a state may name, and most bytes of one device's state (both far above real ones).
_MAX_DEVICES = 1024
_MAX_CUDA_STATE = 1 << 16


class _Check:
    """Builds the error of a field that does not hold (step, where, field, why, fix)."""

    def __init__(self, step: int | None, where: str) -> None:
        self.step = step if isinstance(step, int) and not isinstance(step, bool) else None
        self.where = where

    def fail(self, field: str, why: str) -> CorruptStepError:
        at = f"step {self.step} of {self.where}" if self.step is not None else self.where
        return CorruptStepError(
            f"[RolloutMock] {at}: the recorded random number state is corrupt: {field} {why}; nothing was "
            f"restored. Re-dump the step (replay_rng: true), or replay without restoring generator "
            f"states (replay_rng: false)", mode="mock", step=self.step)


def _short(value: Any) -> str:
    """``repr`` of a hostile value, bounded (and never the int-string limit)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value.bit_length() < 200 else f"an int of {value.bit_length()} bits"
    text = repr(value) if isinstance(value, (str, float, bool, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _fields(check: _Check, part: str, value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``value`` as a mapping with exactly ``keys``."""
    if not isinstance(value, dict):
        raise check.fail(part, f"is a {type(value).__name__}, not a mapping")
    missing = [key for key in keys if key not in value]
    extra = sorted(str(key)[:40] for key in value if key not in keys)
    if missing or extra:
        raise check.fail(part, f"has keys {sorted(map(str, value))[:8]}, expected exactly {list(keys)}")
    return value


def _int(check: _Check, field: str, value: Any, low: int, high: int) -> int:
    """An ``int`` (numpy integers included, ``bool`` not) in ``[low, high]``."""
    np = _numpy()
    if np is not None and isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise check.fail(field, f"is {_short(value)}, not an int")
    if not low <= value <= high:
        raise check.fail(field, f"is {_short(value)}, outside [{low}, {high}]")
    return value


def _finite(check: _Check, field: str, value: Any) -> float:
    np = _numpy()
    if np is not None and isinstance(value, np.floating) and value.dtype.itemsize <= 8:
        value = float(value)
    if not isinstance(value, (float, int)) or isinstance(value, bool):
        raise check.fail(field, f"is {_short(value)}, not a float")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise check.fail(field, f"is {_short(value)}, not a finite float")
    return number


def _words(check: _Check, field: str, value: Any, count: int) -> list[int]:
    """Exactly ``count`` 32-bit unsigned words (a list, a tuple or a 1-D integer array)."""
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise check.fail(field, f"is an array of {value.dtype} {tuple(value.shape)[:4]}, not {count} uint32")
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise check.fail(field, f"is {_short(value)}, not a sequence of {count} ints")
    if len(value) != count:
        raise check.fail(field, f"holds {len(value):,} values, not {count}")
    return [_int(check, f"{field}[{i}]", word, 0, _WORD - 1) for i, word in enumerate(value)]


#: torch's CPU generator state (``CPUGeneratorImplState``): its size, and where its 624
#: Mersenne Twister words start (each a little-endian uint64 holding a 32-bit word).
_TORCH_CPU_STATE = 5056
_TORCH_MT_OFFSET = 24


def _not_degenerate(check: _Check, field: str, words: list[int]) -> list[int]:
    """Refuse the one invalid Mersenne Twister state: the top bit of the first word and every
    other word zero. It repeats zeros forever, so a sampler's rejection loop (numpy's
    ``normal``, ``random.normalvariate``, ``torch.poisson``) never returns."""
    if not words[0] & 0x80000000 and not any(words[1:]):
        raise check.fail(field, "is the all-zero Mersenne Twister state, which only ever draws 0 (a sampler "
                                "would loop forever)")
    return words


def _python_state(check: _Check, value: Any) -> tuple[Any, ...]:
    """Python ``random``: version 3, 624 words and the index, the cached gauss."""
    saved = _fields(check, "python", value, ("version", "state", "gauss"))
    _int(check, "python.version", saved["version"], 3, 3)
    internal = saved["state"]
    if not isinstance(internal, (list, tuple)) or len(internal) != _MT_N + 1:
        size = f"{len(internal):,} values" if isinstance(internal, (list, tuple)) else _short(internal)
        raise check.fail("python.state", f"holds {size}, not {_MT_N + 1} ints")
    words = _words(check, "python.state", internal[:_MT_N], _MT_N)
    _not_degenerate(check, "python.state", words)
    index = _int(check, f"python.state[{_MT_N}] (the index)", internal[_MT_N], 0, _MT_N)
    gauss = None if saved["gauss"] is None else _finite(check, "python.gauss", saved["gauss"])
    result = (3, (*words, index), gauss)
    try:
        random.Random().setstate(result)  # a throwaway generator: whatever else it refuses
    except (TypeError, ValueError, OverflowError) as exc:
        raise check.fail("python", f"is refused by random.setstate ({exc})") from None
    return result


def _numpy_state(check: _Check, np: Any, value: Any) -> tuple[Any, ...]:
    """numpy's legacy MT19937, from our form or numpy's dict form, as ``set_state``'s tuple."""
    if np is None:
        raise check.fail("numpy", "is recorded but numpy is not installed here")
    if isinstance(value, dict) and "bit_generator" in value:
        saved = _fields(check, "numpy", value, ("bit_generator", "state", "has_gauss", "gauss"))
        inner = _fields(check, "numpy.state", saved["state"], ("key", "pos"))
        name, keys, pos, has_gauss, cached = (saved["bit_generator"], inner["key"], inner["pos"],
                                              saved["has_gauss"], saved["gauss"])
        fields = ("numpy.bit_generator", "numpy.state.key", "numpy.state.pos", "numpy.has_gauss", "numpy.gauss")
    else:
        saved = _fields(check, "numpy", value, ("name", "keys", "pos", "has_gauss", "cached"))
        name, keys, pos, has_gauss, cached = (saved[k] for k in ("name", "keys", "pos", "has_gauss", "cached"))
        fields = ("numpy.name", "numpy.keys", "numpy.pos", "numpy.has_gauss", "numpy.cached")
    if name != "MT19937":
        raise check.fail(fields[0], f"is {_short(name)}, not 'MT19937'")
    words = np.asarray(_not_degenerate(check, fields[1], _words(check, fields[1], keys, _MT_N)), dtype=np.uint32)
    result = ("MT19937", words, _int(check, fields[2], pos, 0, _MT_N), _int(check, fields[3], has_gauss, 0, 1),
              _finite(check, fields[4], cached))
    try:
        np.random.RandomState().set_state(result)  # a throwaway generator
    except (TypeError, ValueError, OverflowError) as exc:
        raise check.fail("numpy", f"is refused by numpy ({exc})") from None
    return result


def _tensor_state(check: _Check, torch: Any, field: str, value: Any, size: int | None) -> Any:
    """A ``uint8`` strided 1-D tensor (of ``size`` bytes when given) in memory of its own."""
    if torch is None:
        raise check.fail(field, "is recorded but torch is not installed here")
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dtype != torch.uint8:
        kind = f"a tensor of {value.dtype} ({value.layout})" if isinstance(value, torch.Tensor) else _short(value)
        raise check.fail(field, f"is {kind}, not a uint8 tensor")
    if value.dim() != 1 or (size is not None and value.numel() != size):
        want = "a 1-D tensor" if size is None else f"{size} bytes (the size of this process's state)"
        raise check.fail(field, f"has shape {tuple(value.shape)[:8]}, not {want}")
    # a loaded tensor may be a view into a shared chunk, which the setters misread
    return value.detach().to(device="cpu").clone(memory_format=torch.contiguous_format)


def _torch_state(check: _Check, torch: Any, field: str, value: Any, current: Any, device: str = "cpu") -> Any:
    """A torch generator's state: exactly the current state's size, accepted by a throwaway
    generator of the same device."""
    owned = _tensor_state(check, torch, field, value, None if current is None else int(current.numel()))
    if device == "cpu" and owned.numel() == _TORCH_CPU_STATE:
        words = owned[_TORCH_MT_OFFSET:_TORCH_MT_OFFSET + 8 * _MT_N].numpy().view("<u8")
        _not_degenerate(check, field, [int(w) & (_WORD - 1) for w in words])
    try:
        torch.Generator(device=device).set_state(owned)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise check.fail(field, f"is refused by torch ({str(exc).splitlines()[0][:200]})") from None
    return owned


def _cuda_states(check: _Check, torch: Any, value: Any) -> list[Any] | None:
    """The CUDA states, one per device: checked always, returned only when this process has CUDA
    with the recorded device count (otherwise they are left alone, as documented)."""
    if not isinstance(value, (list, tuple)) or len(value) > _MAX_DEVICES:
        size = f"{len(value):,} states" if isinstance(value, (list, tuple)) else _short(value)
        raise check.fail("cuda", f"is {size}, not a list of one state per device")
    states = [_tensor_state(check, torch, f"cuda[{i}]", s, None) for i, s in enumerate(value)]
    for i, s in enumerate(states):
        if s.numel() > _MAX_CUDA_STATE:
            raise check.fail(f"cuda[{i}]", f"holds {s.numel():,} bytes, more than a CUDA generator's state")
    if not torch.cuda.is_available() or len(states) != torch.cuda.device_count():
        return None
    checked = []
    for i, s in enumerate(states):
        checked.append(_torch_state(check, torch, f"cuda[{i}]", s, torch.cuda.get_rng_state(i), f"cuda:{i}"))
    return checked


def changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether any generator differs between two :func:`capture_rng` results."""
    if set(before) != set(after):
        return True
    for key, value in before.items():
        other = after[key]
        if key == "torch":
            if not bool((value == other).all()):
                return True
        elif key == "cuda":
            if len(value) != len(other) or any(not bool((a == b).all()) for a, b in zip(value, other)):
                return True
        elif value != other:
            return True
    return False


def rng_stream(stream: StreamId) -> StreamId:
    """The stream that holds the generator states of ``stream``'s calls (same split and rank)."""
    name = RNG_NAME if stream.name is None else f"{stream.name}.{RNG_NAME}"
    return StreamId(stream.split, name, stream.rank)


class RngHook:
    """``replay_rng`` for an :class:`~rollout_mock.wrap.interceptor.Interceptor`'s plain and
    async calls (a Ray ``.remote()`` rollout runs in another process and leaves this one's
    generators alone).

    Dump mode: :meth:`before` captures the states before the real call, :meth:`after_call`
    records them as the call left them, in :func:`rng_stream`, only when the call changed them
    (so rollouts that draw no random numbers here record nothing). Mock mode: :meth:`after_replay`
    restores the states recorded for the served step, if there are any.
    """

    def __init__(self, *, enabled: bool, store: Store, stream: StreamId, overwrite: bool) -> None:
        self.enabled = enabled
        self.store = store
        self.stream = rng_stream(stream)
        self.overwrite = overwrite
        self._opened = False

    def before(self) -> dict[str, Any] | None:
        return capture_rng() if self.enabled else None

    def after_call(self, step: int, before: dict[str, Any] | None,
                   writer: BackgroundWriter | SyncWriter | None) -> None:
        if before is None or writer is None:
            return
        after = capture_rng()
        if not changed(before, after):
            return
        if not self._opened:
            self.store.open_writer(self.stream)
            self._opened = True

        def save() -> None:
            self.store.save(self.stream, step, after, BatchInfo.of(after), method="rng",
                            rollout_seconds=None, overwrite=self.overwrite)

        writer.submit(WriteJob(save, f"random number state of step {step} of {self.stream}"))

    def after_replay(self, source: int) -> None:
        if not self.enabled or not self.store.contains(self.stream, source):
            return
        restore_rng(self.store.load(self.stream, source), step=source, where=str(self.stream))
        logger.debug("[RolloutMock] restored the random number state of step %d (%s)", source, self.stream)
