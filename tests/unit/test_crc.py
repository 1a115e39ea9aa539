"""The fast CRC-32 (ISA-L) gives zlib's values, alone, chunked and through Digest; zlib is the fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import HANG_S
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_mock.crc as _crc
from rollout_mock.storage.digest import Digest, HashingWriter, read_hashed
from rollout_mock.storage.directory import TempFile

isal_zlib = pytest.importorskip("isal.isal_zlib")


def test_isal_is_the_implementation_when_installed() -> None:
    assert _crc.FAST and _crc.IMPLEMENTATION == "isal"


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=20_000), cuts=st.lists(st.integers(0, 20_000), max_size=6))
def test_same_values_as_zlib_whole_and_chunked(data: bytes, cuts: list[int]) -> None:
    assert isal_zlib.crc32(data) == zlib.crc32(data)
    assert _crc.crc32(data) == zlib.crc32(data)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    value = 0
    for start, end in zip(bounds, bounds[1:]):
        value = _crc.crc32(memoryview(data)[start:end], value)
    assert value == zlib.crc32(data)


def test_same_values_on_large_random_buffers() -> None:
    # several MiB: the GIL-releasing, vectorised paths of both libraries, and a non-zero start
    data = os.urandom(5 << 20) + b"tail"
    assert _crc.crc32(data) == zlib.crc32(data)
    assert _crc.crc32(data, 0x12345678) == zlib.crc32(data, 0x12345678)
    view = memoryview(data)
    assert _crc.crc32(view[3 << 20 :], _crc.crc32(view[: 3 << 20])) == zlib.crc32(data)


@pytest.mark.parametrize("threaded", [False, True])
def test_digest_matches_zlib_for_mixed_update_sizes(threaded: bool) -> None:
    pieces = [os.urandom(n) for n in (0, 7, 3 << 20, 100, 2 << 20, 1, (1 << 20) - 1)]
    digest = Digest(threaded=threaded)
    for piece in pieces:
        digest.update(piece)
    checksum, mac = digest.finish()
    assert checksum == f"crc32:{zlib.crc32(b''.join(pieces)):08x}"
    assert mac is None


def test_digest_defaults_inline_with_isal_and_threaded_with_hmac() -> None:
    assert Digest().threaded is False
    assert Digest(b"key").threaded is True


@pytest.mark.parametrize("threaded", [False, True])
def test_writer_and_reader_checksums_agree_with_zlib(tmp_path: Path, threaded: bool) -> None:
    data = os.urandom((5 << 20) + 12345)
    path = tmp_path / "f.bin"
    upload = TempFile(path)
    writer = HashingWriter(upload, Digest(threaded=threaded))
    writer.write(data[:10])
    writer.write(memoryview(data)[10:])
    written, _ = writer.finish()
    upload.commit()
    assert path.read_bytes() == data and writer.size == len(data)
    expected = f"crc32:{zlib.crc32(data):08x}"
    assert written == expected
    half, result = read_hashed(path, lambda r: r.read(len(data) // 2))
    assert len(half) == len(data) // 2 and result.trailing == len(data) - len(half)
    assert result.checksum == expected


def test_zlib_fallback_when_isal_is_missing(tmp_path: Path) -> None:
    script = (
        "import sys, os, zlib\n"
        "sys.modules['isal'] = None  # makes `import isal...` raise ImportError\n"
        "import rollout_mock.crc as _crc\n"
        "from rollout_mock.storage.digest import Digest\n"
        "data = os.urandom(3 << 20)\n"
        "assert not _crc.FAST and _crc.IMPLEMENTATION == 'zlib', _crc.IMPLEMENTATION\n"
        "assert _crc.crc32(data, 5) == zlib.crc32(data, 5)\n"
        "d = Digest(); assert d.threaded\n"
        "d.update(data); assert d.finish()[0] == f'crc32:{zlib.crc32(data):08x}'\n"
        # every write path with the zlib digest (threaded): one writev (small step), body first
        # and head last (large step), in-order bytes (HMAC); the index checksum is the file's
        "import torch\n"
        "from rollout_mock.storage import BatchInfo, DirectoryStore\n"
        "from rollout_mock.storage.manifest import StreamId\n"
        "from rollout_mock.storage.digest import file_digest\n"
        f"root = {str(tmp_path)!r}\n"
        "for key in (None, b'k' * 32):\n"
        "    store = DirectoryStore(os.path.join(root, 'k' if key else 'n'), hmac_key=key)\n"
        "    for step, n in enumerate([10, 3_000_000]):\n"
        "        b = {'a': torch.randn(n), 'b': torch.arange(n), 's': ['x'] * 3}\n"
        "        e = store.save(StreamId('train'), step, b, BatchInfo.of(b))\n"
        "        assert e.checksum == file_digest(store.path_of(StreamId('train'), step))[0]\n"
        "        out = store.load(StreamId('train'), step)\n"
        "        assert torch.equal(out['a'], b['a']) and torch.equal(out['b'], b['b'])\n"
        "    store.close()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_crc32_combine_equals_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    import zlib

    import rollout_mock.crc as _crc

    whole = zlib.crc32(a + b)
    assert _crc.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == whole
    assert _crc._py_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == whole  # the no-ISA-L fallback


def test_a_saved_step_reports_the_checksum_of_its_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The whole-file CRC the writer records without a second pass equals the file's real CRC,
    and the loader's table-based CRC equals both."""
    import zlib

    import torch

    from rollout_mock import DirectoryStore
    from rollout_mock.codec import FileSource, open_step
    from rollout_mock.storage.manifest import StreamId
    from rollout_mock.storage.store import BatchInfo

    batch = {"x": torch.randn(3000, 1000), "ids": torch.arange(7), "text": ["a", "b"]}
    store = DirectoryStore(tmp_path)
    stream = StreamId("train")
    store.open_writer(stream)
    entry = store.save(stream, 0, batch, BatchInfo.of(batch))
    store.close()
    path = tmp_path / entry.file
    real = f"crc32:{zlib.crc32(path.read_bytes()):08x}"
    assert entry.checksum == real
    with FileSource(path) as source:
        assert f"crc32:{open_step(source).file_crc32():08x}" == real
