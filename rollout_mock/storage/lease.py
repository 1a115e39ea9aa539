"""Writer leases on object stores, which have no flock: a small lock object holding an owner id
and an expiry, taken with a conditional put and renewed by a heartbeat thread.

* **take**: create ``.writer[-rankR].lease`` only if absent (S3 ``If-None-Match: *``). If it
  exists and has not expired, the stream has a live writer: :class:`LockedError` naming it. If it
  has expired (its writer died without releasing it), it is removed and the create retried once.
* **heartbeat**: every ``ttl / 3`` seconds the owner re-reads the lease; if it still names this
  owner it is rewritten with a new expiry, otherwise the lease is *lost* (another writer took it
  after an expiry) and the next save raises :class:`LockedError` instead of writing.
* **release**: removed on close, if it still names this owner.

Limits (documented, best-effort): expiry compares the writer's and the taker's wall clocks, so
clocks must agree to well within ``ttl``; a writer stalled for longer than ``ttl`` (e.g. a
suspended VM) can lose its lease and notice only at its next heartbeat or save; taking over an
expired lease is remove-then-create, so two takers racing for the same expired lease are
serialised by the create, but a taker that read the old lease could remove a lease renewed in
that instant. Without conditional puts (filesystems other than S3 and memory://) the create is an
exists-check followed by a put.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rollout_mock.errors import LockedError
from rollout_mock.text import logger, short_repr

__all__ = ["Lease"]


class Lease:
    """One lease object. ``create(rel, data) -> bool``, ``read``, ``replace``, ``remove`` are the
    store's primitives; ``what`` names the locked thing in errors."""

    def __init__(self, rel: str, *, what: str, where: str, ttl: float,
                 create: Callable[[str, bytes], bool], read: Callable[[str], bytes | None],
                 replace: Callable[[str, bytes], None], remove: Callable[[list[str]], None]) -> None:
        self.rel, self.what, self.where, self.ttl = rel, what, where, ttl
        self._create, self._read, self._replace, self._remove = create, read, replace, remove
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({"owner": self.owner, "pid": os.getpid(), "host": socket.gethostname(),
                           "renewed_at": now, "expires_at": now + self.ttl}).encode()

    @staticmethod
    def _expiry(record: dict[str, Any]) -> float:
        """The record's ``expires_at`` as a float; anything else (a string, a bool, NaN, an int
        too large for a float: a forged or damaged lease) counts as expired (0.0)."""
        value = record.get("expires_at")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0
        try:
            number = float(value)
        except OverflowError:
            return 0.0
        return number if math.isfinite(number) else 0.0

    def _current(self) -> dict[str, Any] | None:
        data = self._read(self.rel)
        if data is None:
            return None
        try:
            value = json.loads(data.decode("utf-8"))
            return value if isinstance(value, dict) else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            return {}  # garbage: treated as expired

    def try_take(self) -> dict[str, Any] | None:
        """Take the lease; None on success, else the live holder's record."""
        for _ in range(2):
            if self._create(self.rel, self._body()):
                return None
            current = self._current()
            if current is None:
                continue  # released between our create and read: try again
            if self._expiry(current) > time.time():
                return current
            logger.warning("[RolloutMock] %s: taking over the expired lease %s (held by %s)",
                           self.what, self.where, short_repr(current.get("owner", "unknown"), 80))
            self._remove([self.rel])
        current = self._current()
        return current if current is not None else {"owner": "unknown"}

    def take(self, *, wait: float = 0.0, heartbeat: bool = True) -> Lease:
        """Take the lease, waiting up to ``wait`` seconds for a live holder to release it."""
        deadline = time.monotonic() + wait
        delay = 0.02
        while True:
            holder = self.try_take()
            if holder is None:
                break
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"[RolloutMock] another writer holds {self.what} ({self.where}: owner "
                    f"{short_repr(holder.get('owner', 'unknown'), 80)}, expires in "
                    f"{max(self._expiry(holder) - time.time(), 0):.0f} s). Two schedulers on "
                    f"one dump_dir and split must each have a distinct `name`; two runs need two dump_dirs. "
                    f"A writer that died releases it when the lease expires.",
                    mode="dump", path=self.where,
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name="rollout-mock-lease", daemon=True)
            self._thread.start()
        return self

    def renew(self) -> bool:
        """Extend the lease if it is still ours; otherwise mark it lost and return False."""
        current = self._current()
        if current is None or current.get("owner") != self.owner:
            self.lost = (f"{self.where} now names {None if current is None else short_repr(current.get('owner'), 80)}, "
                         f"not this writer ({self.owner}): it expired and was taken over")
            return False
        self._replace(self.rel, self._body())
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # a transient store error: try again next beat
                logger.warning("[RolloutMock] renewing %s failed: %s", self.where, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost is None:
            current = self._current()
            if current is not None and current.get("owner") == self.owner:
                self._remove([self.rel])

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
