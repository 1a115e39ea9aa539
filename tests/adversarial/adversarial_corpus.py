"""A corpus of malicious step files (format 1 pickles and format 2 containers).

Used by the adversarial tests in-process and by a subprocess under an address-space limit.
Every payload here must make the safe loader raise a RolloutMockError subclass.
"""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MARK, STOP, REDUCE, BUILD, NEWOBJ, NEWOBJ_EX = b"(", b".", b"R", b"b", b"\x81", b"\x92"
PROTO5 = b"\x80\x05"

#: Every global the old safe loader admitted (rebuild functions, builtins, torch, batch classes).
OLD_ALLOWED = [
    *(("rollout_mock.codec", n) for n in ("_rebuild_tensor", "_rebuild_parameter", "_rebuild_ndarray",
                                          "_rebuild_object_array", "_rebuild_np_scalar",
                                          "_rebuild_tensordict", "_rebuild_object")),
    *(("builtins", n) for n in ("set", "frozenset", "complex", "slice", "range", "bytearray", "list",
                                "dict", "tuple", "int", "float", "str", "bool")),
    *(("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")),
    ("torch", "Size"), ("torch", "device"), ("torch", "float32"),
    *(("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")),
    ("tensordict._td", "TensorDict"), ("tensordict.tensordict", "TensorDict"),
    ("verl.protocol", "DataProto"), ("rollout_mock.demo", "RolloutBatch"),
]


#: Groups of cases that could not be built here (group -> reason): the tests report them as skipped.
SKIPPED: dict[str, str] = {}


def optional(group: str, cases: Callable[[], Iterator[tuple[str, bytes]]]) -> Iterator[tuple[str, bytes]]:
    """The cases of ``cases()``, or none (recorded in :data:`SKIPPED`) when an optional package that
    building them needs (zstandard, ...) is not installed. Wrap any generator that imports one."""
    try:
        built = list(cases())
    except ModuleNotFoundError as exc:
        SKIPPED[group] = f"building these cases needs {exc.name} (pip install -e '.[compress]')"
        built = []
    return iter(built)


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def binunicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def long1(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def hostile_args() -> bytes:
    """(b"", "float32", (4 GiB,)): an empty buffer with a huge shape, as a REDUCE argument tuple."""
    return MARK + b"C\x00" + binunicode("float32") + long1(1 << 32) + b"\x85" + b"t"


def call_programs(marker: Path) -> Iterator[tuple[str, bytes]]:
    """Every old-allowed global x every opcode that calls, builds or instantiates."""
    state = b"N}" + binunicode("pwned_attr") + binunicode(str(marker)) + b"s\x86"  # (None, {attr: path})
    for module, name in OLD_ALLOWED:
        g = glob(module, name)
        tag = f"{module}.{name}"
        yield f"REDUCE {tag}", PROTO5 + g + hostile_args() + REDUCE + STOP
        yield f"NEWOBJ {tag}", PROTO5 + g + b")" + NEWOBJ + STOP
        yield f"NEWOBJ_EX {tag}", PROTO5 + g + b")}" + NEWOBJ_EX + STOP
        yield f"BUILD {tag}", PROTO5 + g + state + BUILD + STOP
        yield f"INST {tag}", PROTO5 + MARK + b"i" + module.encode() + b"\n" + name.encode() + b"\n" + STOP
        yield f"OBJ {tag}", PROTO5 + MARK + g + b"o" + STOP
    yield "EXT1", PROTO5 + b"\x82\x01" + STOP
    yield "EXT2", PROTO5 + b"\x83\x01\x00" + STOP
    yield "EXT4", PROTO5 + b"\x84\x01\x00\x00\x00" + STOP
    yield "PERSID", PROTO5 + b"P0\n" + STOP
    yield "BINPERSID", PROTO5 + binunicode("x") + b"Q" + STOP
    yield "os.system", PROTO5 + glob("os", "system") + binunicode(f"touch {marker}") + b"\x85" + REDUCE + STOP
    yield "builtins.eval", PROTO5 + glob("builtins", "eval") + binunicode(f"open({str(marker)!r},'w')") + b"\x85" + REDUCE + STOP


def named_attacks(marker: Path) -> Iterator[tuple[str, bytes]]:
    """The concrete attacks of the campaign (issue 10), as regression cases."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    verl_state = b"}" + binunicode("batch") + b"C\x00s"  # any dict: BUILD would call __setstate__
    yield "verl DataProto NEWOBJ+BUILD", PROTO5 + glob("verl.protocol", "DataProto") + b")" + NEWOBJ + verl_state + BUILD + STOP
    yield "verl DataProto REDUCE+BUILD", PROTO5 + glob("verl.protocol", "DataProto") + b")" + REDUCE + verl_state + BUILD + STOP
    yield "Counter.most_common BUILD", (PROTO5 + glob("collections", "Counter") + b"N}" + binunicode("most_common")
                                       + glob("builtins", "str") + b"s\x86" + BUILD + STOP)
    bomb32 = PROTO5 + glob("builtins", "bytearray") + long1(1 << 32) + b"\x85" + REDUCE + STOP
    yield f"{len(bomb32)}-byte 4 GiB bytearray", bomb32
    uninit = PROTO5 + glob("rollout_mock.codec", "_rebuild_tensor") + MARK + b"C\x00" + b"\x8c\x07float32" \
        + b"J\x00\x40\x00\x00" + b"\x85" + b"t" + REDUCE + STOP
    yield f"{len(uninit)}-byte uninitialised tensor", uninit
    tup: Any = ()
    for _ in range(60):
        tup = (tup, tup)
    bomb = pickle.dumps(tup, protocol=5)
    yield f"{len(bomb)}-byte shared-tuple bomb", bomb
    yield "deep tuple nesting", PROTO5 + b")" + b"\x85" * 5000 + STOP
    yield "self-referencing list", PROTO5 + b"]\x94h\x00a" + STOP
    yield "huge BYTEARRAY8 length", PROTO5 + b"\x96" + struct.pack("<Q", 1 << 40) + b"abc" + STOP
    yield "huge BINBYTES8 length", PROTO5 + b"\x8e" + struct.pack("<Q", 1 << 40) + b"abc" + STOP
    yield "huge memo index", PROTO5 + b"N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b"j" + struct.pack("<I", 0) + STOP
    yield "out-of-band buffer", PROTO5 + b"\x97" + STOP
    yield "huge LONG4", PROTO5 + b"\x8b" + struct.pack("<i", 1 << 30) + STOP


# --------------------------------------------------------------------------- format 2 forging
def forge(doc: Any, data: bytes = b"", *, header_bytes: bytes | None = None, crc: int | None = None) -> bytes:
    """A format-2 file with a correct prefix, suffix and header CRC around ``doc`` and ``data``."""
    # the format-2 layout, spelled out here (independent of the code under test)
    CONTAINER_HEAD, DATA_MAGIC = struct.Struct("<8sQQQII"), b"RMSTEP\x00\x02"
    PREFIX_HEAD, SUFFIX = b"\x80\x05crollout_mock.codec\n_load_v2\n\x8e", b"\x85R."
    PREFIX_LEN = len(PREFIX_HEAD) + 8

    def PREFIX(n: int) -> bytes:  # noqa: N802
        return PREFIX_HEAD + struct.pack("<Q", n)

    header = header_bytes if header_bytes is not None else json.dumps(doc).encode()
    data_offset = CONTAINER_HEAD.size + len(header)
    data_offset += (-(PREFIX_LEN + data_offset)) % 64
    head = CONTAINER_HEAD.pack(DATA_MAGIC, len(header), data_offset, len(data),
                               zlib.crc32(header) if crc is None else crc, 0)
    container = head + header + bytes(data_offset - len(head) - len(header)) + data
    return PREFIX(len(container)) + container + SUFFIX


def doc(root: Any, table: list[list[int]]) -> dict[str, Any]:
    return {"format": "rollout_mock.step", "version": 2, "root": root, "chunks": table}


def tensor(dtype: str, shape: list[int], first: int = 0, count: int = 1) -> dict[str, Any]:
    return {"$": "tensor", "dtype": dtype, "shape": shape, "c": [first, count]}


def format2_lies() -> Iterator[tuple[str, bytes]]:
    data = bytes(64)
    ok_chunk = [0, 64, 64, zlib.crc32(data), 0, 0]
    yield "shape larger than data", forge(doc(tensor("float32", [1 << 30]), [ok_chunk]), data)
    yield "empty data, huge shape", forge(doc(tensor("float32", [1 << 40], 0, 0), []))
    yield "offset outside data", forge(doc(tensor("float32", [16]), [[1 << 40, 64, 64, 0, 0, 0]]), data)
    yield "stored length outside data", forge(doc(tensor("float32", [16]), [[0, 1 << 40, 64, 0, 0, 0]]), data)
    yield "raw size lie (uncompressed)", forge(doc(tensor("float32", [1 << 20]), [[0, 64, 4 << 20, 0, 0, 0]]), data)
    yield "object dtype array", forge(doc({"$": "ndarray", "dtype": "|O", "shape": [8], "c": [0, 1]}, [ok_chunk]), data)
    yield "void dtype array", forge(doc({"$": "ndarray", "dtype": "|V64", "shape": [1], "c": [0, 1]}, [ok_chunk]), data)
    yield "structured dtype", forge(doc({"$": "ndarray", "dtype": "[('a','O')]", "shape": [1], "c": [0, 1]}, [ok_chunk]), data)
    yield "unknown torch dtype", forge(doc(tensor("qint8", [64]), [ok_chunk]), data)
    yield "chunk count beyond table", forge(doc(tensor("float32", [16], 0, 1 << 30), [ok_chunk]), data)
    big = bytes(1 << 16)
    yield "one chunk referenced by many tensors", forge(
        doc([tensor("uint8", [1 << 16]) for _ in range(5000)], [[0, 1 << 16, 1 << 16, zlib.crc32(big), 0, 0]]), big)
    yield from optional("zstd-compressed chunks that lie", zstd_lies)
    yield "deep nesting", forge(None, header_bytes=b'{"format":"rollout_mock.step","version":2,"chunks":[],"root":'
                                + b"[" * 50_000 + b"]" * 50_000 + b"}")
    yield "deep tagged nesting", forge(doc(_nest_tuples(200), []))
    yield "objarray count lie", forge(doc({"$": "objarray", "shape": [1 << 40], "items": []}, []))
    yield "huge int digits", forge(doc({"$": "int", "v": "9" * 100_000}, []))
    yield "pickle blob (safe mode)", forge(doc({"$": "pickle", "what": "os.system", "path": "x", "c": [0, 1]}, [ok_chunk]), data)
    yield "bad header CRC", forge(doc(None, []), crc=1)
    yield "truncated", forge(doc(tensor("float32", [16]), [ok_chunk]), data)[:-10]
    yield "length field lie", forge(doc(None, []))[:31] + struct.pack("<Q", 1 << 50) + forge(doc(None, []))[39:]
    yield "not JSON", forge(None, header_bytes=b"{not json")
    yield "bad chunk CRC", forge(doc(tensor("float32", [16]), [[0, 64, 64, 12345, 0, 0]]), data)
    yield "bool bytes", forge(doc(tensor("bool", [64]), [[0, 64, 64, zlib.crc32(b"\x07" * 64), 0, 0]]), b"\x07" * 64)
    yield "batch class with __del__", forge(doc({"$": "batch", "kind": "object", "class": "tempfile:_TemporaryFileCloser",
                                                 "layout": "dict", "extra": [["name", "/etc/passwd"], ["delete", True]]}, []))
    yield "unknown tag", forge(doc({"$": "eval", "v": "1"}, []))
    yield "nested tensors of huge components", forge(doc({"$": "nested", "layout": "strided",
                                                          "items": [tensor("float32", [1 << 30], 0, 0)]}, []))
    yield from json_items_lies()


def zstd_lies() -> Iterator[tuple[str, bytes]]:
    """zstd frames that decompress far beyond, or differently from, what the chunk table declares."""
    import zstandard

    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(64 << 20))
    pad = bomb + bytes(-len(bomb) % 64)
    yield "zstd bomb", forge(doc(tensor("uint8", [64 << 20]), [[0, len(bomb), 64 << 20, zlib.crc32(bomb), 1, 0]]), pad)
    small = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1000))
    yield "zstd without content size", forge(doc(tensor("uint8", [1000]), [[0, len(small), 1000, zlib.crc32(small), 1, 0]]),
                                             small + bytes(-len(small) % 64))
    lie = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(4000))
    yield "zstd frame larger than declared", forge(doc(tensor("uint8", [1000]), [[0, len(lie), 1000, zlib.crc32(lie), 1, 0]]),
                                                   lie + bytes(-len(lie) % 64))


def json_items_lies() -> Iterator[tuple[str, bytes]]:
    """Object arrays whose items live in a JSON data chunk (header version 3)."""

    def objarray(items: bytes, shape: list[int]) -> bytes:
        padded = items + bytes((-len(items)) % 64)
        table = [[0, len(items), len(items), zlib.crc32(items), 0, 0]]
        root = {"$": "objarray", "shape": shape, "c": [0, 1]}
        return forge({"format": "rollout_mock.step", "version": 3, "root": root, "chunks": table}, padded)

    yield "json items: count differs from shape", objarray(b'["a","b"]', [3])
    yield "json items: shape far larger than the items", objarray(b'["a"]', [1 << 40])
    yield "json items: a nested list", objarray(b'[["a"],"b"]', [2])
    yield "json items: a tagged node", objarray(b'[{"$":"pickle","c":[0,1]},"b"]', [2])
    yield "json items: deep nesting", objarray(b"[" * 100_000 + b"]" * 100_000, [1])
    yield "json items: not JSON", objarray(b"\xff\xfe not json", [1])
    yield "json items: an object, not a list", objarray(b'{"a":1}', [1])
    yield "json items: NaN", objarray(b"[NaN,1]", [2])
    yield "json items: 5000-digit integer", objarray(b"[" + b"9" * 5000 + b"]", [1])
    yield "json items: both items and a chunk", forge(
        {"format": "rollout_mock.step", "version": 3, "chunks": [[0, 5, 5, zlib.crc32(b'["a"]'), 0, 0]],
         "root": {"$": "objarray", "shape": [1], "c": [0, 1], "items": [{"$": "pickle", "c": [0, 1]}]}},
        b'["a"]' + bytes(59))
    yield "header version from the future", forge({"format": "rollout_mock.step", "version": 99, "root": 1, "chunks": []})


def round3_denials() -> Iterator[tuple[str, bytes]]:
    """Issue 22 items 8-10: small files that cost memory or time far beyond their size."""
    import zstandard

    def v3(root: Any, table: list[list[int]], data: bytes) -> bytes:
        return forge({"format": "rollout_mock.step", "version": 3, "root": root, "chunks": table}, data)

    def zchunk(raw: bytes) -> tuple[list[int], bytes]:
        packed = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
        return [0, len(packed), len(raw), zlib.crc32(packed), 1, 0], packed + bytes(-len(packed) % 64)

    # 8: JSON item chunks whose parse allocates ~20x their (declared, bounded) text
    row, data = zchunk(b"[" + b"[]," * ((4 << 20) // 3) + b"[]]")
    yield "item chunk of nested empty lists (allocation before refusal)", v3(  # within 64x + 1 MiB
        {"$": "objarray", "shape": [1], "c": [0, 1]}, [row], data + bytes(64 << 10))
    n = (4 << 20) // 5
    row, data = zchunk(b"[" + b'"ab",' * (n - 1) + b'"ab"]')
    yield "item chunk of a million short strings in a small file", v3(
        {"$": "objarray", "shape": [n], "c": [0, 1]}, [row], data + bytes(64 << 10))
    # 9: every node references the whole run of (empty) chunks: references x run length
    count = 2000
    empty = [[0, 0, 0, 0, 0, 0]] * count
    yield "chunk references quadratic in the header size", forge(doc(
        [{"$": "bytes", "c": [0, count]} for _ in range(count)], empty))
    # 10: set items that all share one hash (hash flooding)
    modulus = (1 << 61) - 1
    members = [{"$": "int", "v": str(7 + k * modulus)} for k in range(1, 24_000)]
    yield "set of colliding ints (hash flooding)", forge(doc({"$": "set", "v": members}, []))
    yield "map of colliding int keys (hash flooding)", forge(doc(
        {"$": "map", "items": [[m, 0] for m in members]}, []))
    items = b"".join(long1(7 + k * modulus) for k in range(1, 24_000))
    yield "format 1: set of colliding ints (hash flooding)", PROTO5 + b"\x8f" + MARK + items + b"\x90" + STOP


def v4(root: Any, body: bytes, chunks: list[bytes] = (), *, codec: int = 0, **extra: Any) -> bytes:  # type: ignore[assignment]
    """A version-4 file: ``body`` (chunk 0, msgpack) then ``chunks``, each 64-byte aligned."""
    data, table = b"", []
    for i, raw in enumerate([body, *chunks]):
        table.append([len(data), len(raw), len(raw), zlib.crc32(raw), codec if i == 0 else 0, 0])
        data += raw + bytes(-len(raw) % 64)
    doc = {"format": "rollout_mock.step", "version": 4, "root": root, "chunks": table, "body": [0, 1], **extra}
    return forge(doc, data)


def mp(body: bytes, offset: int = 0, length: int | None = None) -> dict[str, Any]:
    return {"$": "mp", "o": offset, "n": len(body) - offset if length is None else length}


def body_lies() -> Iterator[tuple[str, bytes]]:
    """Header version 4 (msgpack body, string columns, shared tensor chunks)."""
    import msgpack

    def ext(code: int, payload: bytes) -> bytes:
        return msgpack.packb(msgpack.ExtType(code, payload))

    def one(name: str, body: bytes) -> tuple[str, bytes]:
        return f"body: {name}", v4(mp(body), body)

    yield one("array length lie", b"\xdd\xff\xff\xff\xff\xc0")
    yield one("map length lie", b"\xdf\xff\xff\xff\xff\xa1a\xc0")
    yield one("str length lie", b"\xdb\x7f\xff\xff\xffabc")
    yield one("bin length lie", b"\xc6\x7f\xff\xff\xffabc")
    yield one("ext length lie", b"\xc9\x7f\xff\xff\xff\x05abc")
    yield one("deep nesting", b"\x91" * 100_000 + b"\xc0")
    yield one("deep map nesting", b"\x81\xa1k" * 50_000 + b"\xc0")
    yield one("invalid UTF-8", b"\x92\xa2\xff\xfe\xa1a")
    yield one("encoded surrogate without the flag", b"\xa3\xed\xa0\x80")
    yield one("unknown extension", ext(99, b"x"))
    yield one("marker with a payload", b"\x92" + ext(1, b"x") + b"\x01")
    yield one("huge int extension", ext(2, b"\x01" * 70_000))
    yield one("empty int extension", ext(2, b""))
    yield one("node extension with a pickle blob", ext(8, msgpack.packb({"$": "pickle", "what": "os.system", "c": [0, 0]})))
    yield one("node extension pointing back into the body", ext(8, msgpack.packb({"$": "mp", "o": 0, "n": 1})))
    yield one("node extension that is not a node", ext(8, b"\xc1"))
    yield one("object array shape lie", b"\x93" + ext(6, b"") + b"\x91\xce\x00\x01\x00\x00\xc0")
    yield one("object array negative shape", b"\x93" + ext(6, b"") + b"\x91\xff\xc0")
    yield one("set of unhashable items", b"\x93" + ext(3, b"") + b"\x90\x90")
    modulus = (1 << 61) - 1
    keys = [7 + k * modulus for k in range(1, 4)]  # ints msgpack holds natively that share a hash
    flood = [msgpack.ExtType(2, (7 + k * modulus).to_bytes(16, "little", signed=True)) for k in range(4, 24_000)]
    yield one("set of colliding ints (hash flooding)", msgpack.packb([msgpack.ExtType(3, b""), *keys, *flood]))
    pairs = b"".join(msgpack.packb(msgpack.ExtType(2, (7 + k * modulus).to_bytes(16, "little", signed=True))) + b"\xc0"
                     for k in range(1, 24_001))  # 24,000 keys with one hash, each mapped to None
    yield one("map of colliding int keys (hash flooding)", b"\xde" + (24_000).to_bytes(2, "big") + pairs)
    head = struct.Struct("<BBBBIIQ")
    chunk = bytes(64)
    yield "body: tensor past its chunk", v4(mp(b := ext(5, head.pack(7, 0, 1, 0, 1, 1, 32) + struct.pack("<Q", 16))), b, [chunk])
    yield "body: tensor in a chunk past the table", v4(mp(b := ext(5, head.pack(7, 0, 1, 0, 9, 1, 0) + struct.pack("<Q", 1))), b, [chunk])
    yield "body: tensor run size lie", v4(mp(b := ext(5, head.pack(7, 0, 1, 0, 1, 2, 0) + struct.pack("<Q", 1 << 40))), b, [chunk, chunk])
    yield "body: tensor with a huge dimension", v4(mp(b := ext(5, head.pack(7, 0, 1, 0, 1, 1, 0) + struct.pack("<Q", 1 << 60))), b, [chunk])
    yield "body: tensor with 200 dimensions", v4(mp(b := ext(5, head.pack(7, 0, 200, 0, 1, 1, 0) + bytes(1600))), b, [chunk])
    yield "body: tensor dtype code out of range", v4(mp(b := ext(5, head.pack(250, 0, 1, 0, 1, 1, 0) + struct.pack("<Q", 1))), b, [chunk])
    yield "body: misaligned tensor view", v4(mp(b := ext(5, head.pack(7, 0, 1, 0, 1, 1, 3) + struct.pack("<Q", 2))), b, [chunk])
    yield "body: bool tensor bytes", v4(mp(b := ext(5, head.pack(0, 0, 1, 0, 1, 1, 0) + struct.pack("<Q", 64))), b, [b"\x07" * 64])
    yield "body: object-dtype array extension", v4(mp(b := ext(7, head.pack(0, 0, 1, 0, 1, 1, 0) + struct.pack("<Q", 8) + b"|O")), b, [chunk])
    yield "body: truncated tensor extension", v4(mp(b := ext(5, b"\x07\x00")), b, [chunk])
    body = msgpack.packb([1, 2, 3])
    yield "body: value outside the body", v4(mp(body, 0, len(body) + 10), body)
    yield "body: overlapping values (decoded twice)", v4([mp(body), mp(body)], body)
    yield "body: value in a version-3 header", forge({"format": "rollout_mock.step", "version": 3, "root": mp(body),
                                                    "chunks": [[0, len(body), len(body), zlib.crc32(body), 0, 0]]},
                                                   body + bytes(-len(body) % 64))
    yield from optional("compressed body", body_zstd_lies)
    yield "body: snapshot node in a file", v4({"$": "snap", "i": 0}, body)
    # string columns

    def column(data: bytes, offsets: list[int], shape: list[int], **flags: Any) -> bytes:
        raw = struct.pack(f"<{len(offsets)}q", *offsets)
        root = {"$": "strs", "shape": shape, "c": [1, 1], "o": [2, 1], **flags}
        return v4(root, b"\xc0", [data, raw])

    ok = msgpack.packb(["ab", "cd"])  # b"\x92\xa2ab\xa2cd": offsets 1, 4, 7
    yield "strings: offsets past the buffer", column(ok, [1, 4, 400], [2])
    yield "strings: offsets out of order", column(msgpack.packb(["ab", "c", "d"]), [1, 5, 3, 7], [3])
    yield "strings: offsets not at the array header", column(ok, [0, 4, 7], [2])
    yield "strings: negative offsets", column(ok, [1, -8, 7], [2])
    yield "strings: count differs from shape", column(ok, [1, 4, 7], [5])
    yield "strings: array header count lie", column(b"\x93" + ok[1:], [1, 4, 7], [2])
    yield "strings: item that is not a string", column(b"\x92\x90\xa2cd", [1, 2, 5], [2])
    yield "strings: nested array bomb in an item", column(b"\x92\xdc\xff\xff" + b"\x90" * 100 + b"\xa2cd",
                                                           [1, 104, 107], [2])
    yield "strings: item length lie", column(b"\x92\xa5ab\xa2cd", [1, 4, 7], [2])
    yield "strings: invalid UTF-8", column(b"\x92\xa2\xff\xfe\xa2cd", [1, 4, 7], [2])
    yield "strings: encoded surrogate without the flag", column(b"\x92\xa3\xed\xa0\x80\xa2cd", [1, 5, 8], [2])
    yield "strings: huge shape", column(ok, [1, 4, 7], [1 << 40])
    yield "strings: shape far beyond its offsets", v4({"$": "strs", "shape": [1 << 22], "c": [1, 1], "o": [2, 1]},
                                                      b"\xc0", [ok, bytes(64)])


def _nest_tuples(depth: int) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = {"$": "tuple", "v": [node]}
    return node


def body_zstd_lies() -> Iterator[tuple[str, bytes]]:
    import zstandard

    packed = zstandard.ZstdCompressor(write_content_size=True).compress(b"\x90" * 100_000)
    yield "body: compressed body (a memory bomb)", v4({"$": "mp", "o": 0, "n": 100_000}, packed, codec=1)


def small_maps_lies() -> Iterator[tuple[str, bytes]]:
    """Body values that ormsgpack decodes (a long column of small maps of scalars, as verl's
    ``extra_info``) with the lie in their 400th map, past what the path choice looks at."""
    import msgpack

    rows = [msgpack.packb({"index": i, "split": "train", "answer": str(i % 97)}) for i in range(600)]
    modulus = (1 << 61) - 1
    lies = {
        "deep nesting": b"\x91" * 100_000 + b"\xc0",
        "invalid UTF-8": b"\xa2\xff\xfe",
        "unknown extension": msgpack.packb(msgpack.ExtType(99, b"x")),
        "node extension with a pickle blob": msgpack.packb(msgpack.ExtType(8, msgpack.packb(
            {"$": "pickle", "what": "os.system", "c": [0, 0]}))),
        "map of colliding int keys (hash flooding)": msgpack.packb({msgpack.ExtType(2, (7 + k * modulus).to_bytes(
            11, "little", signed=True)): 0 for k in range(1, 24_000)}),
        "a tuple marker with a payload": msgpack.packb([msgpack.ExtType(1, b"x"), 1]),
        "an object array whose shape lies": msgpack.packb([msgpack.ExtType(6, b""), [5], 1]),
        "a length past the value": b"\xdb\x7f\xff\xff\xffabc",
    }
    for name, lie in lies.items():
        body = b"\xdd" + struct.pack(">I", 600) + b"".join(rows[:400]) + lie + b"".join(rows[401:])
        yield f"small maps: {name}", v4(mp(body), body)
    body = msgpack.packb([msgpack.unpackb(r) for r in rows]) + b"\xc0"
    yield "small maps: a byte after the value", v4(mp(body), body)


def round4_codec() -> Iterator[tuple[str, bytes]]:
    """Round 4 (issue 28): decode work must be bounded by the file, not by what it references."""
    import msgpack

    head = struct.Struct("<BBBBIIQ")
    size = 16 << 20
    chunk = bytes(size - 64) + b"\x07" * 64  # the last bytes are not bools: refused, once checked

    def bool_view(offset: int, n: int) -> msgpack.ExtType:
        return msgpack.ExtType(5, head.pack(0, 0, 1, 0, 1, 1, offset) + struct.pack("<Q", n))

    # 4,000 bool views of one shared 16 MiB chunk (each once checked on its own: 4,000 passes
    # over 16 MiB, minutes of work), then the one that fails
    views = [bool_view(0, size - 64)] * 4000 + [bool_view(size - 64, 64)]
    body = msgpack.packb(views)
    yield f"shared chunk: {len(views)} bool views of one 16 MiB chunk (CPU bomb)", v4(mp(body), body, [chunk])
    body = msgpack.packb([bool_view(64 * (i % 1024), size - 64 * 1024) for i in range(4000)] + [bool_view(size - 64, 64)])
    yield "shared chunk: 4,000 overlapping bool views at different offsets (CPU bomb)", v4(mp(body), body, [chunk])


def corpus(marker: Path) -> list[tuple[str, bytes]]:
    return [*call_programs(marker), *named_attacks(marker), *format2_lies(),
            *optional("round-3 denials of service", round3_denials), *body_lies(), *small_maps_lies(), *round4_codec()]
