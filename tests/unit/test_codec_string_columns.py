"""String columns (codec/decode.py ``read_strings``): every item is checked against its offsets
(a torn or reordered offset is refused even when the total still matches), a corrupt chunk is
reported by its CRC, and object columns keep their items as they are (lists stay items)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from rollout_mock import CorruptStepError, codec

sys.path.insert(0, str(Path(__file__).parents[1] / "adversarial"))
import adversarial_corpus as C  # noqa: E402


def _load(data: bytes, tmp_path: Path, from_file: bool, **kwargs: Any) -> Any:
    if not from_file:
        return codec.decode(data, **kwargs)
    path = tmp_path / "step.bin"
    path.write_bytes(data)
    return codec.decode(path, **kwargs)


def _column(items: list[bytes], offsets: list[int] | None = None, *, pieces: int = 1) -> bytes:
    """A string column of the msgpack ``items`` (their offsets unless given), its data split
    into ``pieces`` chunks."""
    head = bytes([0x90 | len(items)]) if len(items) < 16 else b"\xdc" + len(items).to_bytes(2, "big")
    data = head + b"".join(items)
    if offsets is None:
        offsets = [len(head)]
        for item in items:
            offsets.append(offsets[-1] + len(item))
    size = -(-len(data) // pieces)
    chunks = [data[i: i + size] for i in range(0, len(data), size)]
    raw = struct.pack(f"<{len(offsets)}q", *offsets)
    root = {"$": "strs", "shape": [len(offsets) - 1], "c": [1, len(chunks)], "o": [1 + len(chunks), 1]}
    return C.v4(root, b"\xc0", [*chunks, raw])


ITEMS = [msgpack.packb(t) for t in ("ab", "cde", "f" * 40, "gh")]


@pytest.mark.parametrize("from_file", [False, True])
@pytest.mark.parametrize("offsets", [
    [1, 3, 8, 50, 53],  # the first item said one byte short, the second one long: same total
    [1, 8, 4, 50, 53],  # out of order
    [1, 4, 4, 50, 53],  # an item of no bytes
    [1, 4, 8, 50, 52],  # ends before the data
    [0, 4, 8, 50, 53],  # starts at the array header
])
def test_offsets_that_do_not_frame_each_item_are_refused(tmp_path: Path, from_file: bool,
                                                         offsets: list[int]) -> None:
    good = _column(ITEMS, pieces=3)
    assert _load(good, tmp_path, from_file).tolist() == ["ab", "cde", "f" * 40, "gh"]
    with pytest.raises(CorruptStepError, match="string column"):
        _load(_column(ITEMS, offsets, pieces=3), tmp_path, from_file)


@pytest.mark.parametrize("item", [
    msgpack.packb(7), msgpack.packb({"k": "v" * 20}), msgpack.packb(["v" * 20]), msgpack.packb(b"v" * 20),
    msgpack.packb(msgpack.ExtType(5, b"v" * 20)), b"\xc1",
])
def test_an_item_that_is_not_one_string_is_refused(tmp_path: Path, item: bytes) -> None:
    with pytest.raises(CorruptStepError, match="string column"):
        _load(_column([ITEMS[0], item, ITEMS[2]], pieces=2), tmp_path, from_file=False)


@pytest.mark.parametrize("from_file", [False, True])
def test_a_corrupt_column_chunk_is_reported_by_its_crc(tmp_path: Path, from_file: bool) -> None:
    """Invalid UTF-8 planted in a column is reported as the corruption it is, not as a decode error."""
    column = np.array([f"row {i:05d} " + "text " * 200 for i in range(64)], dtype=object)
    data = bytearray(codec.encode_bytes({"s": column}))
    data[bytes(data).index(b"row 00001")] = 0xFF
    with pytest.raises(CorruptStepError, match="CRC-32"):
        _load(bytes(data), tmp_path, from_file)


def test_an_object_column_of_lists_keeps_one_dimension() -> None:
    """Items of an object array are kept as they are: equal-length lists never become a second
    dimension (what ``array[:] = items`` would make of them)."""
    column = np.empty(3, dtype=object)
    column[0], column[1], column[2] = [1, 2], [3, 4], (5, 6)
    out = codec.decode(codec.encode_bytes({"x": column}))["x"]
    assert out.shape == (3,) and out.dtype == object
    assert [type(x) for x in out] == [list, list, tuple] and out.tolist() == [[1, 2], [3, 4], (5, 6)]


def _big_column() -> np.ndarray:
    """A string column of more than ``VIEW_BYTES``: decoded from a map of the file."""
    from rollout_mock.codec.decode import VIEW_BYTES

    column = np.array([f"row {i:05d} " + "text " * 2000 for i in range(2 * VIEW_BYTES // 10_000 + 8)],
                      dtype=object)
    assert sum(len(s) for s in column) > VIEW_BYTES
    return column


def _mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_a_large_column_is_decoded_from_a_map_of_the_file_and_the_map_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient read of a local file of VIEW_BYTES or more is not copied: it is mapped
    (FileSource.view_range), CRC-checked in place and unmapped once decoded."""
    from rollout_mock.codec.safe import FileSource

    column = _big_column()
    path = tmp_path / "step.bin"
    path.write_bytes(codec.encode_bytes({"s": column, "small": np.array(["a", "b"], dtype=object)}))
    views: list[tuple[int, int]] = []
    seen_mapped: list[bool] = []
    real = FileSource.view_range

    def spy(self: FileSource, offset: int, length: int) -> memoryview:
        views.append((offset, length))
        view = real(self, offset, length)
        seen_mapped.append(_mapped(path))
        return view

    monkeypatch.setattr(FileSource, "view_range", spy)
    out = codec.decode(path)
    assert out["s"].tolist() == column.tolist() and out["small"].tolist() == ["a", "b"]
    assert len(views) == 1 and views[0][1] > 1 << 20  # the large column only (the small one is read)
    assert seen_mapped == [True]
    assert not _mapped(path)  # nothing returned points into the map


@pytest.mark.parametrize("plant", [b"\xff", b"X"])
def test_a_corrupt_large_column_is_reported_by_its_crc_not_by_the_decode(tmp_path: Path, plant: bytes) -> None:
    """The map's CRC checks run beside the decode; a failed one is the error raised, also when
    the decode itself failed first (invalid UTF-8) or succeeded (a changed letter)."""
    data = bytearray(codec.encode_bytes({"s": _big_column()}))
    data[bytes(data).index(b"row 00003") + 2] = plant[0]
    path = tmp_path / "step.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStepError, match="CRC-32"):
        codec.decode(path)


def test_a_large_column_with_torn_offsets_is_refused_from_the_map(tmp_path: Path) -> None:
    items = [msgpack.packb(f"{i:04d}" + "y" * 40_000) for i in range(40)]
    offsets = [3]
    for item in items:
        offsets.append(offsets[-1] + len(item))
    offsets[5] -= 1
    path = tmp_path / "step.bin"
    path.write_bytes(_column(items))
    assert codec.decode(path).tolist()[:1] == [items[0][3:].decode()]
    path.write_bytes(_column(items, offsets))
    with pytest.raises(CorruptStepError, match="string column"):
        codec.decode(path)


@pytest.mark.parametrize("where", [None, "first", "last"])
def test_a_column_of_several_chunks_is_checked_by_one_crc_of_the_run(tmp_path: Path, where: str | None) -> None:
    """A mapped run of several chunks is checked by one CRC-32 over it, compared with the chunks'
    CRCs combined: a good file loads, a byte changed in its first or last chunk is named as the
    corrupt chunk."""
    from rollout_mock.codec.format import CHUNK_BYTES

    column = np.array([f"{i:05d} " + "word " * 4000 for i in range(3 * CHUNK_BYTES // 20_000 + 2)], dtype=object)
    data = bytearray(codec.encode_bytes({"s": column}))
    if where is not None:
        marker = b"00000 " if where == "first" else f"{len(column) - 1:05d} ".encode()
        data[bytes(data).index(marker) + 10] = ord("X")
    path = tmp_path / "step.bin"
    path.write_bytes(bytes(data))
    if where is None:
        assert codec.decode(path)["s"].tolist() == column.tolist()
    else:
        with pytest.raises(CorruptStepError, match=r"chunk \d+ fails its CRC-32"):
            codec.decode(path)


def _packed_with_length(text: str, form: int, length: int) -> bytes:
    """``text`` as a msgpack string of header ``form`` (0xA0: fixstr, 0xD9/0xDA/0xDB) whose
    length field says ``length``."""
    data = text.encode()
    if form == 0xA0:
        return bytes([0xA0 | length]) + data
    width = {0xD9: 1, 0xDA: 2, 0xDB: 4}[form]
    return bytes([form]) + length.to_bytes(width, "big") + data


@pytest.mark.parametrize("form", [0xA0, 0xD9, 0xDA, 0xDB])
def test_a_column_of_one_header_form_checks_every_items_length(tmp_path: Path, form: int) -> None:
    """A column whose items share one header form (the fast check): a good one loads, and one
    item whose length field is off by one (its offsets still frame it) is refused."""
    texts = [f"{i:02d}" + "w" * (5 + i) for i in range(20)]
    good = [_packed_with_length(t, form, len(t)) for t in texts]
    assert _load(_column(good, pieces=2), tmp_path, from_file=True).tolist() == texts
    for wrong in (len(texts[7]) - 1, len(texts[7]) + 1):
        bad = list(good)
        bad[7] = _packed_with_length(texts[7], form, wrong)
        with pytest.raises(CorruptStepError, match="string column item is not a string"):
            _load(_column(bad, pieces=2), tmp_path, from_file=True)


@pytest.mark.parametrize("form", [0xD9, 0xDA, 0xDB])
def test_items_shorter_than_their_header_form_are_refused(form: int) -> None:
    """Every item starts with a str16 marker (say) but one is a single byte: its length field
    would lie in the next item; the check refuses it without reading past its bytes."""
    items = [_packed_with_length("abcdef", form, 6) for _ in range(4)]
    items.insert(2, bytes([form]))
    with pytest.raises(CorruptStepError, match="string column item is not a string"):
        codec.decode(_column(items))
    with pytest.raises(CorruptStepError, match="string column item is not a string"):
        codec.decode(_column([*items[:4], bytes([form])]))  # the last item: at the end of the data


@pytest.mark.parametrize("error", [OSError(19, "No such device"), ValueError("mmap length is too large")])
@pytest.mark.parametrize("corrupt", [False, True])
def test_a_file_that_cannot_be_mapped_is_read_into_memory_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, corrupt: bool) -> None:
    """A file system without mmap support (mmap raises): view_range reads the bytes instead,
    tries the map once per source, and the columns load (a corrupt one is still refused by
    its CRC)."""
    import mmap
    import types

    from rollout_mock.codec import safe

    column = _big_column()
    data = bytearray(codec.encode_bytes({"s": column, "t": column[::-1].copy()}))
    if corrupt:
        data[bytes(data).index(b"row 00003") + 2] = ord("X")
    path = tmp_path / "step.bin"
    path.write_bytes(bytes(data))
    attempts: list[int] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        raise error

    monkeypatch.setattr(safe, "mmap", types.SimpleNamespace(
        mmap=refuse, ALLOCATIONGRANULARITY=mmap.ALLOCATIONGRANULARITY, ACCESS_READ=mmap.ACCESS_READ))
    if corrupt:
        with pytest.raises(CorruptStepError, match="CRC-32"):
            codec.decode(path)
        return
    out = codec.decode(path)
    assert out["s"].tolist() == column.tolist() and out["t"].tolist() == column[::-1].tolist()
    assert len(attempts) == 1  # the second column is read without trying the map again
    with safe.FileSource(path) as source:
        view = source.view_range(10, 1 << 20)
        assert view.readonly and bytes(view) == bytes(data[10: 10 + (1 << 20)])


def _column_data(data: bytes) -> bytes:
    """The joined data chunks of the string column ``s`` of a step file's bytes."""
    import json

    from rollout_mock.codec.format import CONTAINER_HEAD, PREFIX_LEN

    _, header_len, data_offset, *_ = CONTAINER_HEAD.unpack_from(data, PREFIX_LEN)
    start = PREFIX_LEN + CONTAINER_HEAD.size
    header = json.loads(data[start: start + header_len])
    first, count = header["root"]["s"]["c"]
    base = PREFIX_LEN + data_offset
    return b"".join(data[base + row[0]: base + row[0] + row[1]] for row in header["chunks"][first: first + count])


def _mixed_texts(n: int, seed: int) -> list[str]:
    """Strings of every msgpack header form, some multi-byte, one longer than a chunk."""
    from rollout_mock.codec.format import CHUNK_BYTES

    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 5, 31, 32, 255, 256, 4_000, 65_535, 65_536, 300_000], n)
    texts = [("é" if i % 7 == 0 else "a") * int(k) + f"#{i}" for i, k in enumerate(lengths)]
    texts[n // 2] = "z" * (CHUNK_BYTES + 12_345)
    return texts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_column_packed_a_chunk_at_a_time_is_msgpacks_bytes(tmp_path: Path, seed: int) -> None:
    """A string column is packed a chunk at a time into reused buffers as the step is written
    (items across a chunk's edge packed for both): the file holds exactly ``msgpack.packb`` of the
    items, in a file written head last and in memory, and loads back equal."""
    from rollout_mock import DirectoryStore
    from rollout_mock.storage import BatchInfo
    from rollout_mock.storage.manifest import StreamId

    texts = _mixed_texts(120, seed)
    column = np.array(texts, dtype=object)
    batch = {"s": column}
    store = DirectoryStore(tmp_path)
    for step in range(2):  # the second write reuses the first one's buffers
        store.save(StreamId("train"), step, batch, BatchInfo.of(batch))
        written = store.path_of(StreamId("train"), step).read_bytes()
        assert _column_data(written) == msgpack.packb(texts)
        assert store.load(StreamId("train"), step)["s"].tolist() == texts
    in_memory = codec.encode_bytes(batch)
    assert _column_data(in_memory) == msgpack.packb(texts)
    assert codec.decode(in_memory)["s"].tolist() == texts
    captured = codec.capture(batch)
    texts[0] += "changed"  # the capture holds its own list of the strings
    assert codec.decode(codec.encode_bytes(captured))["s"].tolist() == column.tolist()
    store.close()


def test_the_buffers_a_column_is_packed_into_are_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A column is packed into the writer's buffers, which the next write takes again (memory
    already resident) instead of packing the whole column into new memory."""
    from rollout_mock import DirectoryStore
    from rollout_mock.codec import format as fmt
    from rollout_mock.storage import BatchInfo
    from rollout_mock.storage.manifest import StreamId

    monkeypatch.setattr(fmt, "_MADE", fmt._MakeBuffers())  # none kept from other tests' writes
    batch = {"s": np.array([f"{i} " + "word " * 2000 for i in range(2000)], dtype=object)}  # 20 MB
    store = DirectoryStore(tmp_path)
    store.save(StreamId("train"), 0, batch, BatchInfo.of(batch))
    kept = {id(buffer) for buffer in fmt._MADE._free}
    assert len(kept) == 2
    store.save(StreamId("train"), 1, batch, BatchInfo.of(batch))
    assert {id(buffer) for buffer in fmt._MADE._free} == kept
    assert store.load(StreamId("train"), 1)["s"].tolist() == batch["s"].tolist()
    store.close()


def test_an_item_longer_than_a_chunk_is_packed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 8 MiB string spans three chunks: it is packed once and its bytes are kept for the next
    chunks, not packed again for each (a 100 MB string would otherwise be packed 25 times); no
    item is packed twice."""
    import msgspec

    from rollout_mock.codec.format import CHUNK_BYTES

    encode_module = sys.modules["rollout_mock.codec.encode"]
    calls: list[int] = []
    real = msgspec.msgpack.Encoder()

    class Counting:
        def encode(self, items: list[str]) -> bytes:
            calls.append(sum(map(len, items)))
            return real.encode(items)

    monkeypatch.setattr(encode_module, "_FAST", Counting())
    texts = ["a" * 100, "b" * (2 * CHUNK_BYTES + 12_345), "c" * 100]
    data = codec.encode_bytes({"s": np.array(texts, dtype=object)})
    assert _column_data(data) == msgpack.packb(texts)
    assert sum(calls) == sum(map(len, texts))  # every item packed once
