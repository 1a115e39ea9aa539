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

import random
from typing import Any

from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import BatchInfo, StepStore
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob
from rollout_mock.text import logger

__all__ = ["RNG_FORMAT", "RNG_NAME", "RngHook", "capture_rng", "changed", "restore_rng", "rng_stream"]

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


def restore_rng(state: Any) -> None:
    """Set this process's generators to a state from :func:`capture_rng` (parts that are absent
    are left alone; CUDA only when the recorded device count equals the visible one)."""
    if not isinstance(state, dict) or state.get("format") != RNG_FORMAT:
        raise ValueError(f"not a rollout_mock random number state: {type(state).__name__}")
    python = state.get("python")
    if python is not None:
        random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    np = _numpy()
    saved = state.get("numpy")
    if np is not None and saved is not None:
        keys = np.asarray(saved["keys"], dtype=np.uint32)
        np.random.set_state((saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached"]))
    torch = _torch()
    if torch is not None and state.get("torch") is not None:
        torch.set_rng_state(_owned_state(torch, state["torch"], torch.get_rng_state()))
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([_owned_state(torch, s, torch.cuda.get_rng_state(i))
                                          for i, s in enumerate(cuda)])


def _owned_state(torch: Any, value: Any, current: Any) -> Any:
    """A generator state as torch's setters need it: a uint8 CPU tensor of the current state's size
    in memory of its own (a loaded tensor may be a view into a shared chunk, which the setters
    misread), checked so that a hostile dump cannot hand torch a state of another size."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.shape != current.shape:
        raise ValueError(f"not a torch generator state: {type(value).__name__} "
                         f"{getattr(value, 'dtype', '')} {tuple(getattr(value, 'shape', ()))}")
    return value.detach().to(device="cpu").clone(memory_format=torch.contiguous_format)


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

    def __init__(self, *, enabled: bool, store: StepStore, stream: StreamId, overwrite: bool) -> None:
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
        restore_rng(self.store.load(self.stream, source))
        logger.debug("[RolloutMock] restored the random number state of step %d (%s)", source, self.stream)
