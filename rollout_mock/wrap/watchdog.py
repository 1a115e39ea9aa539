"""Stall detection around intercepted calls: stacks of everything when a call or a gap hangs.

A :class:`StallWatchdog` is told when an intercepted call starts and ends. A *call* that runs,
or a *gap* between two calls (the training step, in practice) that lasts, longer than
``max(min_seconds, factor × median of recent durations of that kind)`` — or than
``absolute_seconds`` whatever the history — is a stall: the stack of every thread and the pending
asyncio tasks of running loops are written to the log and to
``{dump_dir}/stalls/stall-<time>-<pid>.txt`` (atomic write), once per stall.

Cost when nothing stalls: a lock and a ``notify`` per call start/end; one daemon thread (started
at the first call) sleeps on a condition until the current deadline — it never polls.

:func:`format_stacks` (the report's body) is usable on its own: the text of every thread's Python
stack and of the pending asyncio tasks of running event loops.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import io
import os
import statistics
import sys
import threading
import time
import traceback
import types
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rollout_mock.config.model import WatchdogConfig
from rollout_mock.config.parts import WatchdogSettings
from rollout_mock.storage.directory import write_inside
from rollout_mock.storage.paths import is_url
from rollout_mock.text import logger

__all__ = ["STALLS_DIR", "StallWatchdog", "format_stacks", "running_loops"]


STALLS_DIR = "stalls"


class StallWatchdog:
    """Watches one stream's calls (see the module docstring). Thread-safe; :meth:`close` stops it."""

    def __init__(self, settings: WatchdogSettings | WatchdogConfig | None = None, *,
                 directory: str | os.PathLike[str] | None = None, label: str = "rollout_mock") -> None:
        #: the limits (a ``watchdog`` block given on its own is read into them; none: its defaults)
        self.settings = settings if isinstance(settings, WatchdogSettings) else \
            WatchdogSettings.of(settings or WatchdogConfig())
        # stall reports are local files: none for an object-store dump_dir (s3://...)
        self.directory = None if directory is None or is_url(directory) else Path(directory)
        self.label = label
        self._cond = threading.Condition()
        self._calls: deque[float] = deque(maxlen=self.settings.history)
        self._gaps: deque[float] = deque(maxlen=self.settings.history)
        self._active: list[str] = []
        self._phase: str | None = None  # None (before the first call), "call" or "gap"
        self._since = 0.0
        self._what = ""
        self._token = 0
        self._reported = -1
        self._thread: threading.Thread | None = None
        self._closed = False
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        #: paths of the stall files written so far
        self.reports: list[Path] = []

    def __repr__(self) -> str:
        return f"StallWatchdog({self.label}, {self.settings})"

    # ------------------------------------------------------------------ events (hot path)
    def _switch(self, phase: str, what: str) -> None:
        now = time.monotonic()
        if self._phase == "call":
            self._calls.append(now - self._since)
        elif self._phase == "gap":
            self._gaps.append(now - self._since)
        self._phase, self._since, self._what = phase, now, what
        self._token += 1
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="rollout-mock-watchdog", daemon=True)
            self._thread.start()
        self._cond.notify()

    def enter(self, what: str) -> None:
        """An intercepted call starts (``what`` names it in the report)."""
        with self._cond:
            self._active.append(what)
            if len(self._active) == 1:
                self._switch("call", what)

    def leave(self, what: str) -> None:
        with self._cond:
            if what in self._active:
                self._active.remove(what)
            if not self._active:
                self._switch("gap", f"after {what}")

    @contextmanager
    def watch(self, what: str) -> Iterator[None]:
        self.enter(what)
        try:
            yield
        finally:
            self.leave(what)

    def note_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember an event loop whose tasks a report should list (found by a GC scan otherwise)."""
        self._loops.add(loop)

    # ------------------------------------------------------------------ monitor thread
    def limit(self, phase: str | None = None) -> tuple[float | None, str]:
        """The current limit in seconds for ``phase`` (default: the current one) and why."""
        phase = phase or self._phase
        history = self._calls if phase == "call" else self._gaps
        candidates: list[tuple[float, str]] = []
        if history:
            median = statistics.median(history)
            relative = max(self.settings.min_seconds, self.settings.factor * median)
            candidates.append((relative, f"{self.settings.factor:g} x median {median:.3g} s of the last "
                                         f"{len(history)}, at least {self.settings.min_seconds:g} s"))
        if self.settings.absolute_seconds is not None:
            candidates.append((self.settings.absolute_seconds, "absolute limit"))
        if not candidates:
            return None, "no limit yet"
        return min(candidates)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                limit, why = self.limit() if self._phase is not None else (None, "")
                if limit is None or self._reported == self._token:
                    self._cond.wait()
                    continue
                remaining = self._since + limit - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._reported = token = self._token
                phase, what, elapsed = self._phase, self._what, time.monotonic() - self._since
                self._cond.release()
                try:
                    self._report(phase or "", what, elapsed, limit, why, token)
                except Exception:  # the watchdog must never take the run down
                    logger.exception("[RolloutMock] watchdog: writing the stall report failed")
                finally:
                    self._cond.acquire()

    def _report(self, phase: str, what: str, elapsed: float, limit: float, why: str, token: int) -> None:
        if phase == "call":
            headline = f"intercepted call {what} of {self.label} has run for {elapsed:.2f} s"
        else:
            headline = f"no intercepted call of {self.label} for {elapsed:.2f} s ({what})"
        text = (f"[RolloutMock] STALL: {headline} (limit {limit:.3g} s: {why}); stacks of every thread and "
                f"pending asyncio task follow\n{format_stacks(list(self._loops))}")
        path = None
        if self.directory is not None:
            now = time.time()
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
            path = write_inside(self.directory, f"{STALLS_DIR}/stall-{stamp}-{os.getpid()}.txt", text.encode("utf-8"))
            self.reports.append(path)
        logger.warning("%s%s", text, "" if path is None else f"\n[RolloutMock] stall report written to {path}")

    def close(self) -> None:
        """Stop the monitor thread (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


# --------------------------------------------------------------------------- stacks

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
