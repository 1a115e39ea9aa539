"""Text of every thread's Python stack and of the pending asyncio tasks of running event loops."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import sys
import threading
import traceback
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


def _tasks_text(loop: asyncio.AbstractEventLoop, out: io.StringIO) -> None:
    try:
        tasks = asyncio.all_tasks(loop)
    except RuntimeError as exc:  # the set changed size too often under our feet
        out.write(f"  (could not list the tasks: {exc})\n")
        return
    out.write(f"\n--- asyncio loop {loop!r}: {len(tasks)} pending task(s)\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        buffer = io.StringIO()
        try:
            task.print_stack(file=buffer)
        except Exception as exc:  # pragma: no cover - a task torn down while printing
            buffer.write(f"  (stack unavailable: {exc})\n")
        out.write(f"{task!r}\n{buffer.getvalue()}")


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
    for loop in running_loops(known_loops):
        _tasks_text(loop, out)
    return out.getvalue()


