"""Chunk payloads of format-2 step files: CRC-32, compression, byte shuffling.

Every chunk carries the CRC-32 (zlib's polynomial; computed with ``isal`` when installed, which
is several times faster, else ``zlib``) of its *stored* bytes, so corruption is caught before a
decompressor sees the data. Compression (``zstd`` or ``lz4``, extra ``rollout_mock[compress]``)
is per chunk; multi-byte dtypes are byte-shuffled first (all first bytes, then all second
bytes, ...) when that makes the chunk smaller. Decompression never produces more than the
chunk's declared raw size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import rollout_mock.crc as _crc
from rollout_mock.errors import MissingExtraError

__all__ = ["CODECS", "crc32", "compress", "decompress", "shuffle", "unshuffle"]

#: Codec ids as stored in the chunk table.
CODECS: dict[str, int] = {"none": 0, "zstd": 1, "lz4": 2}
_CODEC_NAMES = {v: k for k, v in CODECS.items()}


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a chunk (:func:`rollout_mock.crc.crc32`: ISA-L when installed, else zlib)."""
    return _crc.crc32(data, value) & 0xFFFFFFFF


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingExtraError(
            "zstd compression needs the zstandard package: pip install 'rollout_mock[compress]'"
        ) from None
    return zstandard


def _lz4() -> Any:
    try:
        import lz4.block
    except ImportError:
        raise MissingExtraError(
            "lz4 compression needs the lz4 package: pip install 'rollout_mock[compress]'"
        ) from None
    return lz4.block


def shuffle(raw: memoryview, itemsize: int) -> bytes:
    array = np.frombuffer(raw, dtype=np.uint8)
    return array.reshape(-1, itemsize).T.tobytes()


def unshuffle(data: Any, itemsize: int) -> bytes:
    array = np.frombuffer(data, dtype=np.uint8)
    return array.reshape(itemsize, -1).T.tobytes()


def compress(raw: memoryview, codec: str, itemsize: int) -> tuple[Any, int, int]:
    """Compress one chunk. Returns (stored bytes, codec id, shuffle itemsize or 0).

    Falls back to storing the raw bytes when compression does not pay. ``itemsize`` 0 marks a
    chunk that is never compressed (a version-4 body: its decoded size bounds the decoder's work).
    """
    if codec == "none" or raw.nbytes < 256 or itemsize == 0:
        return raw, 0, 0
    if codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}; choose one of {sorted(CODECS)}")
    candidates = [(raw, 0)]
    if itemsize > 1 and raw.nbytes % itemsize == 0:
        candidates.append((memoryview(shuffle(raw, itemsize)), itemsize))
    best: tuple[Any, int, int] = (raw, 0, 0)
    best_len = raw.nbytes * 0.9  # compress only when it saves at least 10%
    for data, shuf in candidates:
        if codec == "zstd":
            packed = _zstd().ZstdCompressor(level=3, write_content_size=True).compress(data)
        else:
            packed = _lz4().compress(data, store_size=False)
        if len(packed) < best_len:
            best, best_len = (packed, CODECS[codec], shuf), len(packed)
    return best


def decompress(stored: Any, codec_id: int, shuf: int, raw_size: int) -> Any:
    """Inverse of :func:`compress`; raises ValueError when the data does not fit ``raw_size``."""
    if codec_id == 0:
        if shuf:
            raise ValueError("shuffled chunk stored without compression")
        if len(memoryview(stored)) != raw_size:
            raise ValueError("stored size differs from raw size")
        return stored
    if codec_id == 1:
        zstandard = _zstd()
        declared = zstandard.frame_content_size(bytes(stored[:18]) if len(stored) > 18 else bytes(stored))
        if declared != raw_size:
            raise ValueError(f"zstd frame declares {declared} bytes, chunk table says {raw_size}")
        out = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_size)
    elif codec_id == 2:
        out = _lz4().decompress(stored, uncompressed_size=raw_size)
    else:
        raise ValueError(f"unknown codec id {codec_id}")
    if len(out) != raw_size:
        raise ValueError(f"chunk decompressed to {len(out)} bytes, expected {raw_size}")
    if shuf:
        if shuf < 2 or raw_size % shuf:
            raise ValueError("bad shuffle item size")
        out = unshuffle(out, shuf)
    return out


def codec_name(codec_id: int) -> str:
    return _CODEC_NAMES.get(codec_id, f"unknown({codec_id})")
