"""Text of every thread's Python stack and of the pending asyncio tasks of running event loops."""

from __future__ import annotations

import asyncio
import gc
import inspect
import io
import os
import sys
import threading
import traceback
import types
from collections.abc import Iterable

__all__ = ["format_stacks", "running_loops"]


def running_loops(known: Iterable[asyncio.AbstractEventLoop] = ()) -> list[asyncio.AbstractEventLoop]:
    """Event loops running in this process: ``known`` ones plus any found by a (slow, rare) GC scan."""
    loops: dict[int, asyncio.AbstractEventLoop] = {}
    for loop in known:
        loops[id(loop)] = loop
    for obj in gc.get_objects():
        try:
            if issubclass(type(obj), asyncio.AbstractEventLoop):  # type(): no __class__ lookups
                loops.setdefault(id(obj), obj)
        except ReferenceError:  # a dead weakref proxy
            continue
    return [loop for loop in loops.values() if loop.is_running() and not loop.is_closed()]


def _await_chain(coro: object, limit: int = 64) -> list[str]:
    """Where a suspended coroutine waits: its frame, then the frames of what it awaits, innermost
    last (``Task.get_stack`` shows only the outermost frame, none for compiled coroutines)."""
    lines: list[str] = []
    for _ in range(limit):
        if coro is None:
            break
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines += traceback.format_list(traceback.extract_stack(frame, limit=1))
        else:
            name = getattr(coro, "__qualname__", type(coro).__name__)
            lines.append(f"  <{name}> (no Python frame)\n")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return lines


def _tasks_text(loop: asyncio.AbstractEventLoop, out: io.StringIO) -> None:
    try:
        tasks = asyncio.all_tasks(loop)
    except RuntimeError as exc:  # the set changed size too often under our feet
        out.write(f"  (could not list the tasks: {exc})\n")
        return
    out.write(f"\n--- asyncio loop {loop!r}: {len(tasks)} pending task(s)\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        try:
            chain = "".join(_await_chain(task.get_coro()))
        except Exception as exc:  # pragma: no cover - a task torn down while we read it
            chain = f"  (stack unavailable: {exc})\n"
        out.write(f"{task!r}\n  awaiting (outermost first):\n{chain}")


def _suspended_coroutines(out: io.StringIO) -> None:
    """Every suspended Python coroutine, grouped into await chains (a GC scan). Finds what compiled
    wrappers (Ray's async actors run methods through Cython coroutines) hide from ``Task.get_stack``."""
    coros = [o for o in gc.get_objects() if type(o) is types.CoroutineType
             and inspect.getcoroutinestate(o) == inspect.CORO_SUSPENDED]
    awaited = {id(getattr(c, "cr_await", None)) for c in coros}
    roots = [c for c in coros if id(c) not in awaited]
    if not roots:
        return
    out.write(f"\n--- {len(roots)} suspended coroutine chain(s) (outermost first)\n")
    for coro in roots:
        out.write(f"{coro.__qualname__}:\n{''.join(_await_chain(coro))}")


def format_stacks(known_loops: Iterable[asyncio.AbstractEventLoop] = (), *, skip_current: bool = True) -> str:
    """The stack of every Python thread (``sys._current_frames``) and every pending asyncio task."""
    out = io.StringIO()
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    frames = sys._current_frames()
    out.write(f"pid {os.getpid()}: {len(frames)} thread(s)\n")
    for ident, frame in sorted(frames.items(), key=lambda kv: (kv[0] != threading.main_thread().ident, kv[0])):
        if skip_current and ident == me:
            continue
        thread = names.get(ident)
        label = f"{thread.name} (daemon)" if thread is not None and thread.daemon else (thread.name if thread else "?")
        out.write(f"\n--- thread {label}, ident {ident}\n")
        out.write("".join(traceback.format_stack(frame)))
    del frames
    loops = running_loops(known_loops)
    for loop in loops:
        _tasks_text(loop, out)
    if loops:
        _suspended_coroutines(out)
    return out.getvalue()


