"""What the codec writes a step into: the declared interfaces, so that a backend knows what to
offer (``Store`` hands ``codec.encode`` its hashing sink over the backend's upload).

Every sink has ``write``. A sink that also checksums what it writes and writes at offsets (a
local file: :class:`~rollout_mock.storage.digest.HashingWriter`) is a :class:`FileSink`: the
codec then writes small steps in one vectored call, passes each chunk's CRC-32 (computed once)
instead of letting the sink hash the chunk again, and writes large steps body first and head
last, overlapping the CRCs with the writes (see :mod:`~rollout_mock.codec.container`). Any other
sink (an upload buffer, ``io.BytesIO``) gets the plain in-order ``write`` calls.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["FileSink", "Sink"]


@runtime_checkable
class Sink(Protocol):
    """Takes the step's bytes in order; returns how many it took (or None: all of them)."""

    def write(self, data: Any) -> int | None: ...


@runtime_checkable
class FileSink(Protocol):
    """A checksumming sink with ranged writes (see the module docstring)."""

    #: the running checksum (:class:`~rollout_mock.storage.digest.Digest`: ``update``,
    #: ``update_known``) the body's chunk CRCs are fed to when written head last
    digest: Any

    def write(self, data: Any) -> int: ...

    def write_vector(self, pieces: list[tuple[Any, int | None]]) -> int:
        """Write ``(data, crc or None)`` pieces in order in one call; a given CRC is trusted."""
        ...

    def write_known(self, data: Any, crc: int) -> int:
        """Write ``data`` whose CRC-32 the caller computed already."""
        ...

    def reserve_head(self, length: int) -> bool:
        """Leave ``length`` bytes for a head written last; False if the sink cannot."""
        ...

    def write_unhashed(self, data: Any) -> int:
        """Write body bytes whose CRCs the caller will hand to :meth:`write_head`'s digest."""
        ...

    def write_head(self, data: Any) -> None:
        """Write the reserved head (after the body)."""
        ...
