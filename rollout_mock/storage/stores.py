"""Picking the backend for a ``dump_dir``: a local path (or ``file://``) gets the
:class:`~rollout_mock.storage.directory.LocalBackend` (atomic rename, fsync, flock: fastest), any
other fsspec URL the :class:`~rollout_mock.storage.objectstore.FsspecBackend`; either way the
store above it is the one :class:`~rollout_mock.storage.store.Store`."""

from __future__ import annotations

import os
from typing import Any

from rollout_mock.storage.directory import DirectoryStore
from rollout_mock.storage.paths import is_url
from rollout_mock.storage.store import Store

__all__ = ["open_store"]


def open_store(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
               hmac_key: bytes | None = None, verify: bool = True) -> Store:
    """The store for ``location`` (a path or an fsspec URL such as ``s3://bucket/prefix``)."""
    text = os.fspath(location)
    if is_url(text):
        if text.startswith("file://"):
            return DirectoryStore(text.removeprefix("file://"), hmac_key=hmac_key, verify=verify)
        from rollout_mock.storage.objectstore import FsspecStore

        return FsspecStore(text, storage_options=storage_options, hmac_key=hmac_key, verify=verify)
    return DirectoryStore(text, hmac_key=hmac_key, verify=verify)
