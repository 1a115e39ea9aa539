"""Device memory: CUDA batches recorded through pinned host buffers, replayed batches placed on a
device. The one module that talks to ``torch.cuda``; everything it needs of it goes through a
:class:`DeviceBackend` (:data:`CUDA` in a run, a fake in the CPU tests).

**Dump mode** (:class:`StagedCopies`, used by :func:`~rollout_mock.codec.encode.capture` with a
:class:`BufferPool`): a CUDA tensor's bytes are copied into a pinned
host buffer of the pool with ``non_blocking=True`` on a side stream of its device (one per device
and direction, created once). The side stream first waits for the stream that is current on the
calling thread (the producer's: the rollout's kernels that wrote the batch are queued there), and
each source tensor is ``record_stream``-ed on it, so the caching allocator does not hand its
memory out again before the copy ran. The capture then records one event per device on the side
stream and makes the producer's stream wait for it: every kernel the caller queues on that stream
after the dump-mode call returns (an in-place write into the batch included) runs after the copy
has read the bytes. The call returns once the copies are queued; the writer thread waits for the
events (:meth:`StagedCopies.wait`) before anything reads the bytes (CRC-32, packing, writing).
Tensors on other devices (``mps``, ``xpu``...) and CPU tensors are copied as before.

**Mock mode** (:class:`DevicePlacement`, the ``device:`` option): the step is read into pinned
host memory (the decoder allocates through :func:`host_empty`), its tensors are copied to the
device with ``non_blocking=True`` on a side stream (on the prefetch thread: step N+1 is copied
while step N trains), the copies are waited for on that thread, and :meth:`DevicePlacement.hand_off`
(on the caller's thread) makes the caller's current stream wait on the copy event and
``record_stream``-s each tensor on it before the batch is returned. ``auto`` puts each tensor back
on the CUDA device it was recorded on (the decoder notes it: :func:`note_device`; rows the reader
selects after decoding are views, placed like the tensor they view); tensors recorded on the CPU,
and everything in a dump written before devices were recorded, stay on the CPU.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from rollout_mock.batch import batch_parts, batch_type_of, rebuild
from rollout_mock.errors import ConfigError
from rollout_mock.text import logger

__all__ = ["CUDA", "BufferPool", "CudaBackend", "DeviceBackend", "DevicePlacement", "StagedCopies", "cuda_index",
           "flat_values", "host_empty", "note_device", "parse_device"]


# --------------------------------------------------------------------------- the backend
class DeviceBackend(Protocol):
    """What staging and placement need of a device runtime. Streams and events are used through
    torch.cuda's methods: ``stream.wait_stream``, ``stream.wait_event``, ``event.record(stream)``,
    ``event.synchronize()``."""

    def stages(self, tensor: torch.Tensor) -> bool:
        """Whether a capture copies this tensor through pinned memory (CUDA tensors)."""
        ...

    def available(self) -> bool: ...

    def device_count(self) -> int: ...

    def current_device(self) -> int:
        """The calling thread's current device index."""
        ...

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A page-locked uint8 host buffer."""
        ...

    def current_stream(self, device: Any) -> Any: ...

    def side_stream(self, device: Any, direction: str) -> Any:
        """The side stream of ``device`` for copies to the host (``"d2h"``) or to it (``"h2d"``)."""
        ...

    def event(self) -> Any: ...

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        """Queue ``dst.copy_(src)`` on ``stream`` without blocking; keep ``src`` alive for it."""
        ...

    def to_device(self, src: torch.Tensor, device: Any, stream: Any) -> torch.Tensor:
        """Queue a copy of host tensor ``src`` to ``device`` on ``stream``; returns it."""
        ...

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None: ...


class CudaBackend:
    """torch.cuda: side streams created once per device and direction (thread-safe)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CudaBackend({len(self._streams)} side streams)"

    def stages(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cuda"

    def available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def current_stream(self, device: Any) -> Any:
        return torch.cuda.current_stream(device)

    def side_stream(self, device: Any, direction: str) -> Any:
        key = (device if isinstance(device, int) else torch.device(device).index or 0, direction)
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = torch.cuda.Stream(device=key[0])
            return stream

    def event(self) -> Any:
        return torch.cuda.Event()

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(stream)

    def to_device(self, src: torch.Tensor, device: Any, stream: Any) -> torch.Tensor:
        with torch.cuda.stream(stream):  # allocated on the side stream: hand_off records its use elsewhere
            return src.to(torch.device("cuda", device), non_blocking=True)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)


#: The backend of every pool and placement unless one is given.
CUDA: DeviceBackend = CudaBackend()


def cuda_index(tensor: torch.Tensor) -> int | None:
    """The index of the CUDA device ``tensor`` is on (what a step records of it), else None."""
    device = tensor.device
    return (device.index or 0) if device.type == "cuda" else None


# --------------------------------------------------------------------------- dump mode
def flat_values(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``tensor``'s values as a flat, C-contiguous tensor on its own device (conjugate/negative
    bits resolved), and whether that is a fresh copy (else a view of ``tensor``)."""
    source, made = tensor.detach(), False
    if source.is_conj():
        source, made = source.resolve_conj(), True
    if source.is_neg():
        source, made = source.resolve_neg(), True
    if not source.is_contiguous():
        source, made = source.contiguous(), True
    flat = source.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat, made = flat.clone(memory_format=torch.contiguous_format), True
    return flat, made


class StagedCopies:
    """The device-to-host copies of one capture (see the module docstring). Not thread-safe: one
    capture is made on one thread; :meth:`wait` may run on another once :meth:`close` returned."""

    def __init__(self, backend: DeviceBackend) -> None:
        self.backend = backend
        #: per device: (the producer's stream, the side stream)
        self._streams: dict[Any, tuple[Any, Any]] = {}
        #: devices whose side stream waited for everything queued on the producer's stream so far
        self._ordered: set[Any] = set()
        self.events: list[Any] = []
        self.copies = 0

    def __repr__(self) -> str:
        return f"StagedCopies({self.copies} copies, {len(self._streams)} devices, {len(self.events)} events pending)"

    def device_bytes(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s values as a flat, C-contiguous uint8 tensor on its device: a view, or a
        copy made there (conjugate/negative bits, strides) on the producer's stream."""
        flat, made = flat_values(tensor)
        if made:  # queued on the producer's stream after the side stream last waited for it
            self._ordered.discard(tensor.device)
        return flat.view(torch.uint8)

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Queue ``dst.copy_(src)`` (``src`` on its device, ``dst`` pinned) on the side stream."""
        device = src.device
        pair = self._streams.get(device)
        if pair is None:
            pair = self._streams[device] = (self.backend.current_stream(device),
                                            self.backend.side_stream(device, "d2h"))
        producer, side = pair
        if device not in self._ordered:
            side.wait_stream(producer)
            self._ordered.add(device)
        self.backend.to_host(dst, src, side)
        self.copies += 1

    def close(self) -> None:
        """Record one event per device after its copies, and make the producer's stream wait for it."""
        for producer, side in self._streams.values():
            event = self.backend.event()
            event.record(side)
            producer.wait_event(event)
            self.events.append(event)
        self._streams.clear()

    def wait(self) -> None:
        """Block until every copy has landed in host memory (idempotent)."""
        events, self.events = self.events, []
        for event in events:
            event.synchronize()


# --------------------------------------------------------------------------- mock mode: reads
# --------------------------------------------------------------------------- capture buffers (host memory)
class BufferPool:
    """Byte buffers for captures, reused across steps (thread-safe): the dump-mode call copies a
    batch into memory that is already mapped, instead of fresh memory whose first touch costs a
    page fault per 4 KiB.

    :meth:`take` hands out byte tensors (best fit, at most twice the size asked for);
    :meth:`Capture.release` gives them back once the writer has written the step. The pool keeps
    at most ``keep`` captures' worth of bytes (``max_pending`` of the writer): the memory a dump
    run holds anyway while steps wait to be written. Pinned (page-locked) buffers, for the bytes of
    CUDA tensors (:mod:`~rollout_mock.codec.device`), are kept apart under the same bound; they are
    allocated with 1/8 headroom, so that a batch that grows a little from step to step still fits
    the buffers of the step before. ``backend``: the device runtime (CUDA's; a fake in tests).
    (Lent by :func:`~rollout_mock.codec.encode.capture`; here with the pinned memory it holds.)
    """

    def __init__(self, keep: int = 2, *, backend: DeviceBackend | None = None) -> None:
        self.keep = max(1, keep)
        self.backend = backend if backend is not None else CUDA
        #: free buffers, pageable (False) and pinned (True)
        self._free: dict[bool, list[torch.Tensor]] = {False: [], True: []}
        self._lock = threading.Lock()
        self._largest_set = {False: 0, True: 0}

    def __repr__(self) -> str:
        return (f"BufferPool(keep={self.keep}, free={len(self._free[False])} buffers, {self.free_bytes} bytes, "
                f"{len(self._free[True])} pinned, {self.pinned_bytes} bytes)")

    @property
    def free_bytes(self) -> int:
        return sum(buffer.numel() for buffer in self._free[False])

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the free pinned buffers."""
        return sum(buffer.numel() for buffer in self._free[True])

    def take(self, nbytes: int, *, pinned: bool = False) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes`` (callers use its first ``nbytes``)."""
        with self._lock:
            free = self._free[pinned]
            best = None
            for index, buffer in enumerate(free):
                size = buffer.numel()
                if nbytes <= size <= 2 * nbytes and (best is None or size < free[best].numel()):
                    best = index
            if best is not None:
                return free.pop(best)
        if pinned:
            return self.backend.pinned(-(-(nbytes + nbytes // 8) // 4096) * 4096)
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffers: list[torch.Tensor], *, pinned: bool = False) -> None:
        """Take back the buffers of one capture; beyond ``keep`` captures' worth, drop the oldest."""
        if not buffers:
            return
        with self._lock:
            free = self._free[pinned]
            self._largest_set[pinned] = max(self._largest_set[pinned], sum(b.numel() for b in buffers))
            free.extend(buffers)
            limit = self.keep * self._largest_set[pinned]
            while free and sum(b.numel() for b in free) > limit:
                free.pop(0)


class _Reads(threading.local):
    """How the decoder on this thread allocates host memory and where it notes recorded devices."""

    def __init__(self) -> None:
        self.alloc: Callable[[int], torch.Tensor] | None = None
        #: id(tensor) -> (cuda index, the tensor: held so that its id stays its own during the load)
        self.recorded: dict[int, tuple[int, torch.Tensor]] | None = None


_READS = _Reads()


def host_empty(nbytes: int) -> torch.Tensor:
    """Host memory for ``nbytes`` of step data (the decoder's chunk reads): pinned while this
    thread reads a step for a device (:meth:`DevicePlacement.load`), else ordinary."""
    alloc = _READS.alloc
    return torch.empty(nbytes, dtype=torch.uint8) if alloc is None else alloc(nbytes)


def note_device(tensor: torch.Tensor, index: int) -> None:
    """The decoder read ``tensor``, recorded on ``cuda:index`` (kept for ``device: auto``)."""
    recorded = _READS.recorded
    if recorded is not None:
        recorded[id(tensor)] = (index, tensor)


@contextmanager
def _reading(alloc: Callable[[int], torch.Tensor] | None) -> Iterator[dict[int, tuple[int, torch.Tensor]]]:
    saved = _READS.alloc, _READS.recorded
    recorded: dict[int, tuple[int, torch.Tensor]] = {}
    _READS.alloc, _READS.recorded = alloc, recorded
    try:
        yield recorded
    finally:
        _READS.alloc, _READS.recorded = saved


# --------------------------------------------------------------------------- mock mode: placement
DEVICE_CHOICES = "cpu, cuda, cuda:N (N a device index) or auto (where each tensor was recorded)"


def parse_device(value: str) -> tuple[str, int | None]:
    """``("cpu"|"cuda"|"auto", index or None)``; ValueError naming the choices otherwise."""
    text = value.strip().lower()
    if text in ("cpu", "cuda", "auto"):
        return text, None
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit() and len(index) <= 4:
        return "cuda", int(index)
    raise ValueError(f"must be {DEVICE_CHOICES}")


@dataclass
class Placed:
    """A step read for a device on the prefetch thread, waiting to be handed off."""

    batch: Any
    #: per device: the copy event and the tensors copied there
    events: dict[Any, Any] = field(default_factory=dict)
    moved: dict[Any, list[torch.Tensor]] = field(default_factory=dict)


_MAX_DEPTH = 64


class DevicePlacement:
    """Replayed batches on a device (``device:`` other than ``cpu``; see the module docstring).

    Build it with :meth:`for_setting` when a replay starts: ``cuda``/``cuda:N`` without CUDA (or
    an index beyond the visible devices) is a ConfigError then, not at the first step.
    """

    def __init__(self, setting: str, *, backend: DeviceBackend | None = None) -> None:
        self.setting = setting
        self.kind, self.index = parse_device(setting)
        self.backend = backend if backend is not None else CUDA
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"DevicePlacement({self.setting!r})"

    @classmethod
    def for_setting(cls, setting: str, *, mode: str = "mock",
                    backend: DeviceBackend | None = None) -> DevicePlacement | None:
        """The placement for a ``device:`` value (None for ``cpu``), checked against this machine."""
        placement = cls(setting, backend=backend)
        if placement.kind == "cpu":
            return None
        if placement.kind == "cuda":
            if not placement.backend.available():
                raise ConfigError(
                    f"rollout_mock.device: {setting!r} but CUDA is not available here "
                    f"(torch {torch.__version__}, torch.cuda.is_available() is False); set `device: cpu` to "
                    f"replay on the CPU, or `device: auto` to use CUDA where there is one", mode=mode)
            count = placement.backend.device_count()
            if placement.index is not None and placement.index >= count:
                raise ConfigError(
                    f"rollout_mock.device: {setting!r} but only {count} CUDA device(s) are visible "
                    f"(cuda:0..cuda:{count - 1}); pick one of them, or `device: cuda` for the current one",
                    mode=mode)
        return placement

    def target(self) -> int | None:
        """The device tensors go to, resolved on the calling thread (``cuda``: its current device);
        ``auto``'s fallback for an index this machine does not have; None without CUDA."""
        if not self.backend.available():
            return None
        return self.index if self.index is not None else self.backend.current_device()

    def load(self, load: Callable[[int], Any], step: int, target: int | None) -> Placed:
        """Read ``step`` (``load(step)``) into pinned memory and copy its tensors to the device;
        returns once the copies have landed (this runs on the prefetch thread)."""
        cuda = self.backend.available() and target is not None
        with _reading(self.backend.pinned if cuda else None) as recorded:
            batch = load(step)
        if self.kind == "auto" and not recorded:
            return Placed(batch)
        if not cuda:  # auto without CUDA: the CPU, said once
            self._warn_once("no-cuda", f"device: auto, but step {step} was recorded on CUDA and CUDA is not "
                            f"available here: its tensors stay on the CPU (set `device: cpu` to silence this)")
            return Placed(batch)
        assert target is not None
        placed = Placed(batch)
        count = self.backend.device_count()
        by_storage = {t.untyped_storage().data_ptr(): (i, t) for i, t in recorded.values() if t.numel()}

        def where(tensor: torch.Tensor) -> int | None:
            if self.kind != "auto":
                return target
            noted = recorded.get(id(tensor))
            if noted is None and tensor.numel():  # rows taken after decoding: a view of a noted tensor
                noted = by_storage.get(tensor.untyped_storage().data_ptr())
            if noted is None or noted[0] < count:
                return None if noted is None else noted[0]
            index = noted[0]
            self._warn_once("index", f"device: auto: step {step} was recorded on cuda:{index}, which this "
                            f"machine does not have ({count} visible): those tensors go to cuda:{target}")
            return target

        def move(tensor: torch.Tensor) -> torch.Tensor:
            device = where(tensor)
            if device is None or tensor.device.type != "cpu":
                return tensor
            side = self.backend.side_stream(device, "h2d")
            out = self.backend.to_device(tensor, device, side)
            if type(tensor) is torch.nn.Parameter and type(out) is not torch.nn.Parameter:
                out = torch.nn.Parameter(out, requires_grad=False)
            placed.moved.setdefault(device, []).append(out)
            return out

        placed.batch = _map_tensors(batch, move, 0)
        recorded.clear()
        for device in placed.moved:
            event = self.backend.event()
            event.record(self.backend.side_stream(device, "h2d"))
            placed.events[device] = event
        for event in placed.events.values():
            event.synchronize()  # the pinned host copies may be freed (and reused) from here on
        return placed

    def hand_off(self, placed: Placed) -> Any:
        """The batch, safe to use on the calling thread's current stream of each device."""
        for device, event in placed.events.items():
            stream = self.backend.current_stream(device)
            stream.wait_event(event)
            for tensor in placed.moved[device]:  # allocated on the side stream, used on this one
                self.backend.record_stream(tensor, stream)
        return placed.batch

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("[RolloutMock] %s", message)


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor], depth: int) -> Any:
    """``value`` with every tensor ``t`` it holds replaced by ``fn(t)``: inside dicts, lists,
    tuples, object arrays and the batch types (their own ``map_tensors``, else the parts that can
    be rebuilt: :func:`rollout_mock.batch.batch_parts`); a container holding no replaced tensor is returned
    as it is. Tensors inside other objects (trusted pickles) are left where they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if depth > _MAX_DEPTH or value is None or isinstance(value, str | bytes | int | float | bool):
        return value
    cls = type(value)
    batch_type = None if cls is dict or cls is list or cls is tuple else batch_type_of(value)
    if batch_type is not None and batch_type.map_tensors is not None:  # (a TensorDict keeps its device)
        return batch_type.map_tensors(value, fn)
    if isinstance(value, Mapping):
        items = {k: _map_tensors(v, fn, depth + 1) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        if cls is dict:
            return items
        if isinstance(value, collections.defaultdict):
            return collections.defaultdict(value.default_factory, items)
        try:
            return cls(items)  # OrderedDict, Counter...
        except (TypeError, ValueError):  # a mapping type not built from a dict: a plain dict keeps the data
            return items
    if cls is list:
        out_list = [_map_tensors(v, fn, depth + 1) for v in value]
        return value if all(a is b for a, b in zip(out_list, value)) else out_list
    if cls is tuple:
        out_tuple = tuple(_map_tensors(v, fn, depth + 1) for v in value)
        return value if all(a is b for a, b in zip(out_tuple, value)) else out_tuple
    if isinstance(value, np.ndarray):
        if value.dtype != object:
            return value
        out_array = np.empty(value.shape, dtype=object)
        any_moved = False
        for idx, item in np.ndenumerate(value):
            out_array[idx] = moved = _map_tensors(item, fn, depth + 1)
            any_moved = any_moved or moved is not item
        return out_array if any_moved else value
    if batch_type is not None:
        parts = batch_parts(value) or {}
        new = {name: _map_tensors(part, fn, depth + 1) for name, part in parts.items()}
        changed = {name: part for name, part in new.items() if part is not parts[name]}
        return rebuild(value, changed) if changed else value
    return value

