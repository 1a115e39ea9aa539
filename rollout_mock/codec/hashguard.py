"""Hash-flooding guard for sets and maps rebuilt from hostile files.

Python hashes ``str`` and ``bytes`` with a per-process random key, but ints, floats, tuples and
frozensets hash deterministically: a file can hold thousands of distinct keys with one hash value
(``k * (2**61 - 1) + c``), and inserting n of them into a set or dict costs n**2 comparisons.
Every decoder (format 1 interpreter, format-2 nodes, the msgpack body) builds sets and non-string
keyed maps through :func:`check_keys` / :class:`KeyBudget`: the keys' hashes are taken once
(linear), and more than :data:`MAX_COLLISIONS` keys sharing a hash with another key is refused
before anything is inserted. Data rollout_mock writes never comes close (its sets and maps hold
no duplicates and colliding distinct keys are rare).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_COLLISIONS", "KeyBudget", "check_keys"]

#: At most this many keys of one set/map may share their hash with an earlier key: the cost of
#: building it stays under ~MAX_COLLISIONS**2 / 2 comparisons (well under a second).
MAX_COLLISIONS = 1024
_SMALL = 64


def check_keys(keys: Any) -> None:
    """Raise ValueError when ``keys`` (a sized collection) would flood a set or dict."""
    n = len(keys)
    if n <= _SMALL:
        return
    # hash(h) == h for every value hash() returns, so this set has no collisions of its own
    distinct = len(set(map(hash, keys)))
    if n - distinct > MAX_COLLISIONS:
        raise ValueError(f"a set or map of {n} keys has {n - distinct} hash collisions "
                         f"(more than {MAX_COLLISIONS}): refusing a hash-flooding file")


class KeyBudget:
    """Collision accounting across many insertions into the same containers (format 1 builds
    sets and dicts item batch by item batch)."""

    def __init__(self) -> None:
        self._counts: dict[int, collections.Counter[int]] = {}
        self._total: dict[int, int] = {}

    def add(self, container: Any, keys: Iterable[Any]) -> None:
        counts = self._counts.setdefault(id(container), collections.Counter())
        hashes = list(map(hash, keys))
        counts.update(hashes)
        total = self._total.get(id(container), 0) + len(hashes)
        self._total[id(container)] = total
        if total - len(counts) > MAX_COLLISIONS:
            raise ValueError(f"a set or map of {total} keys has {total - len(counts)} hash collisions "
                             f"(more than {MAX_COLLISIONS}): refusing a hash-flooding file")
