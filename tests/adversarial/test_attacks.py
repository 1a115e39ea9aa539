"""Standing adversarial suite (issue 10.6): malicious step files must be refused, without side
effects, in bounded memory and time.

Loads go through ``rollout_mock.codec.decode`` (the safe loader of every format) on the step's bytes.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import HANG_S, cpu_seconds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_mock import RolloutMockError, codec

sys.path.insert(0, str(Path(__file__).parent))
import adversarial_corpus as C  # noqa: E402

MARKER = Path("/tmp/rollout_mock_adversarial_PWNED")


def _classes() -> list[Any]:
    found = []
    for module, name in C.OLD_ALLOWED:
        try:
            value = getattr(importlib.import_module(module), name)
        except Exception:
            continue
        if isinstance(value, type):
            found.append(value)
    return found


CLASSES = _classes()


def _warm_up() -> None:
    """Decode legitimate files of both formats once, so lazy imports inside torch/tensordict that
    any load triggers do not count as side effects of the hostile ones."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    import rollout_mock.codec as codec

    batch = {"t": TensorDict({"a": torch.ones(2, 2)}, batch_size=[2]), "n": np.zeros(2),
             "o": np.array([1, "x"], dtype=object), "p": torch.nn.Parameter(torch.ones(1)),
             "s": np.float32(1), "z": torch.zeros(0), "b": torch.ones(2, dtype=torch.bool),
             "j": np.array([f"item {i}" for i in range(40)], dtype=object)}  # items in a JSON chunk
    for name in ("dumps_v1", "encode_bytes", "dumps"):  # (older code has only dumps)
        writer = getattr(codec, name, None)
        if writer is not None:
            load(writer(batch))




def _state() -> tuple[Any, ...]:
    return (
        {cls: {k: id(v) for k, v in vars(cls).items()} for cls in CLASSES},
        frozenset(sys.modules),
    )


def load(data: bytes) -> Any:
    return codec.decode(codec.BytesSource(data, "<adversarial>"))


def refused(data: bytes) -> RolloutMockError:
    before = _state()
    try:
        load(data)
    except RolloutMockError as exc:
        error = exc
    else:
        raise AssertionError("the safe loader accepted a malicious step file")
    assert _state() == before, "decoding changed class attributes or imported modules"
    assert not MARKER.exists()
    chain: BaseException | None = error
    while chain is not None:  # a refusal must come from a check, not from running out of memory
        assert not isinstance(chain, MemoryError), chain
        chain = chain.__cause__ or chain.__context__
    return error


_warm_up()
CASES = C.corpus(MARKER)


@pytest.mark.parametrize(("name", "data"), CASES, ids=[name for name, _ in CASES])
def test_malicious_step_is_refused(name: str, data: bytes) -> None:
    MARKER.unlink(missing_ok=True)
    tracemalloc.start()
    try:
        seconds = cpu_seconds(lambda: refused(data))  # CPU time: a busy machine does not inflate it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 5, f"{name}: {seconds:.1f} CPU s to refuse a {len(data)}-byte file"
    assert peak <= 8 * len(data) + (16 << 20), f"{name}: {peak} bytes traced for a {len(data)}-byte file"


@pytest.mark.parametrize("mapped", [False, True], ids=["file", "mapped"])
@pytest.mark.parametrize(("name", "data"), CASES, ids=[name for name, _ in CASES])
def test_malicious_step_file_is_refused_read_or_mapped(name: str, data: bytes, mapped: bool, tmp_path: Path) -> None:
    """The same files on disk, through the positional-read source of verified loads and through
    the mapped source of lazy opens (``Dump.open``, ``show``, ``diff``)."""
    from rollout_mock.codec import open_step

    MARKER.unlink(missing_ok=True)
    path = tmp_path / "step_000000.pkl"
    path.write_bytes(data)
    before = _state()

    def load() -> None:
        with pytest.raises(RolloutMockError):
            open_step(path, mapped=mapped).load()

    assert cpu_seconds(load) < 5  # CPU time: a busy machine does not inflate it
    assert _state() == before and not MARKER.exists()


@pytest.mark.parametrize("group", sorted(C.SKIPPED) or ["none"])
def test_cases_that_need_an_optional_package(group: str) -> None:
    """Reports, as a skip with the reason, each group of cases the corpus could not build here;
    with every optional package present, the optional cases are in the corpus."""
    if group in C.SKIPPED:
        pytest.skip(f"{group}: {C.SKIPPED[group]}")
    assert {"zstd bomb", "zstd frame larger than declared"} <= {name for name, _ in CASES}


def test_named_attack_sizes_match_the_report() -> None:
    names = [name for name, _ in C.named_attacks(MARKER)]
    assert "32-byte 4 GiB bytearray" in names, names
    assert "59-byte uninitialised tensor" in names, names
    assert any(name.endswith("-byte shared-tuple bomb") and int(name.split("-")[0]) < 300 for name in names), names


def test_corpus_under_an_address_space_limit(tmp_path: Path) -> None:
    """All payloads decoded in a child with RLIMIT_AS = its size after imports + 512 MiB."""
    script = tmp_path / "run.py"
    script.write_text(
        "import io, json, resource, sys, time\n"
        "from pathlib import Path\n"
        "sys.path.insert(0, %r)\n"
        "import torch, numpy, tensordict\n"
        "from rollout_mock import codec\n"
        "from rollout_mock.errors import RolloutMockError\n"
        "import adversarial_corpus as C\n"
        "cases = C.corpus(Path(%r))\n"
        "vm = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))\n"
        "out = []\n"
        "for name, data in cases:\n"
        "    t = time.process_time()  # CPU time: a busy machine does not inflate it\n"
        "    try:\n"
        "        codec.decode(data)\n"
        "        result = 'accepted'\n"
        "    except RolloutMockError as exc:\n"
        "        result, chain = 'refused', exc\n"
        "        while chain is not None:\n"
        "            if isinstance(chain, MemoryError) or \"can't allocate\" in str(chain):\n"
        "                result = 'out of memory'\n"
        "            chain = chain.__cause__ or chain.__context__\n"
        "    except BaseException as exc:\n"
        "        result = 'leaked ' + type(exc).__name__\n"
        "    out.append([name, len(data), result, round(time.process_time() - t, 3)])\n"
        "print(json.dumps(out))\n" % (str(Path(__file__).parent), str(MARKER))
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_S, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = [r for r in results if r[2] != "refused" or r[3] > 5]
    assert not bad, bad
    assert not MARKER.exists()


# --------------------------------------------------------------------------- property-based
_GLOBALS = st.sampled_from(C.OLD_ALLOWED)
_ATOMS = st.one_of(
    st.just(b"N"), st.just(b")"), st.just(b"}"), st.just(b"]"), st.just(b"C\x00"),
    st.integers(-(1 << 70), 1 << 70).map(C.long1),
    st.text(max_size=8).map(C.binunicode),
    st.binary(max_size=16).map(lambda b: b"C" + bytes([len(b)]) + b),
    st.sampled_from(["float32", "bool", "<f4", "|O", "object"]).map(C.binunicode),
)


@st.composite
def _args(draw: Any) -> bytes:
    items = draw(st.lists(_ATOMS, max_size=4))
    return C.MARK + b"".join(items) + b"t"


_CALLS = st.sampled_from([b"\x81", b"\x92", b"b", b"o", b"i", b"\x82\x01", b"P0\n"])


@st.composite
def _attack_program(draw: Any) -> bytes:
    module, name = draw(_GLOBALS)
    opcode = draw(_CALLS)
    g = C.glob(module, name)
    args = draw(_args())
    if opcode == b"\x81":
        body = g + args + opcode
    elif opcode == b"\x92":
        body = g + args + b"}" + opcode
    elif opcode == b"b":
        body = g + b"N" + args + opcode
    elif opcode == b"o":
        body = C.MARK + g + args[1:-1] + opcode
    elif opcode == b"i":
        body = C.MARK + args[1:-1] + b"i" + module.encode() + b"\n" + name.encode() + b"\n"
    else:
        body = opcode
    prefix = draw(st.sampled_from([b"", b"N0", b"\x95\x00\x00\x00\x00\x00\x00\x00\x00"]))
    return C.PROTO5 + prefix + body + C.STOP


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(_attack_program())
def test_generated_call_programs_are_refused(program: bytes) -> None:
    refused(program)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(module_name=_GLOBALS, args=_args())
def test_generated_reduce_programs_are_refused_or_plain_data(module_name: tuple[str, str], args: bytes) -> None:
    program = C.PROTO5 + C.glob(*module_name) + args + C.REDUCE + C.STOP
    before = _state()
    try:
        value = load(program)
    except RolloutMockError:
        pass
    else:  # only the validating factories of plain data types may succeed
        assert type(value).__module__ in ("builtins", "collections", "datetime", "torch")
    assert _state() == before and not MARKER.exists()




@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(["float32", "int64", "bool", "bfloat16", "complex128", "qint8", "object", 7, None]),
    shape=st.lists(st.integers(-2, 1 << 45), max_size=6),
    table=st.lists(st.tuples(st.integers(-1, 1 << 41), st.integers(-1, 1 << 41), st.integers(-1, 1 << 41),
                             st.integers(0, 2), st.integers(0, 9)), max_size=4),
    ref=st.tuples(st.integers(-1, 8), st.integers(-1, 1 << 32)),
    data_len=st.sampled_from([0, 64, 4096]),
)
def test_generated_header_lies_are_refused(dtype: Any, shape: list[int], table: list[Any], ref: tuple[int, int],
                                           data_len: int) -> None:
    import math

    chunks = [[o, s, r, 0, c, sh] for o, s, r, c, sh in table]
    # make it a lie for sure: the tensor's size never matches the bytes it references
    raw = sum(chunks[i][2] for i in range(ref[0], ref[0] + ref[1]) if 0 <= i < len(chunks)) if ref[1] < 10 else -1
    sizes = {"float32": 4, "int64": 8, "bool": 1, "bfloat16": 2, "complex128": 16}
    if dtype in sizes and all(d >= 0 for d in shape) and math.prod(shape) * sizes[dtype] == raw:
        shape = [*shape, 3]
        if math.prod(shape) * sizes[dtype] == raw:  # raw == 0
            shape = [*shape[:-1], 1, 1] if raw else [1]
    node = {"$": "tensor", "dtype": dtype, "shape": shape, "c": list(ref)}
    data = C.forge(C.doc(node, chunks), bytes(data_len))
    tracemalloc.start()
    try:
        refused(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 8 * len(data) + (16 << 20)


_NODES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4),
              st.fixed_dictionaries({"$": st.sampled_from(["tensor", "ndarray", "bytes", "pickle", "objarray",
                                                           "tensordict", "batch", "nested", "int", "float",
                                                           "npscalar", "map", "tuple", "bogus"])},
                                    optional={"shape": st.lists(st.integers(0, 1 << 40), max_size=3),
                                              "c": st.lists(st.integers(0, 3), min_size=2, max_size=2),
                                              "dtype": st.sampled_from(["float32", "<f4", "|O", "uint8"]),
                                              "hex": st.text("0123456789abcdef", max_size=20)})),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=3), children, max_size=4),
                               st.builds(lambda v: {"$": "tuple", "v": v}, st.lists(children, max_size=3)),
                               st.builds(lambda v: {"$": "objarray", "shape": [len(v) + 1], "items": v},
                                         st.lists(children, max_size=3))),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(root=_NODES)
def test_random_headers_decode_or_fail_cleanly(root: Any) -> None:
    """Random node trees: a rollout_mock error or a value; never another error, never big memory."""
    data = bytes(256)
    table = [[0, 64, 64, 0x758D6336, 0, 0], [64, 64, 64, 0x758D6336, 0, 0], [0, 256, 256, 0x0D968558, 0, 0]]
    blob = C.forge(C.doc(root, table), data)
    before = _state()
    tracemalloc.start()
    try:
        try:
            load(blob)
        except RolloutMockError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _state() == before
    assert peak <= 8 * len(blob) + (16 << 20)


# --------------------------------------------------------------------------- header version 4
_EXT_PAYLOADS = st.one_of(st.binary(max_size=40), st.builds(
    lambda head, dims: head + dims,
    st.tuples(st.integers(0, 255), st.integers(0, 7), st.integers(0, 40), st.integers(0, 255), st.integers(0, 9),
              st.integers(0, 3), st.integers(0, 1 << 20)).map(lambda t: __import__("struct").pack("<BBBBIIQ", *t)),
    st.binary(max_size=24)))
_BODY_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(), st.text(max_size=6),
              st.binary(max_size=6), st.builds(lambda code, data: __import__("msgpack").ExtType(code, data),
                                               st.integers(0, 12), _EXT_PAYLOADS)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-(1 << 63), (1 << 64) - 1)), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=_BODY_VALUES, cut=st.integers(0, 8), junk=st.binary(max_size=8))
def test_random_bodies_decode_or_fail_cleanly(value: Any, cut: int, junk: bytes) -> None:
    """Random msgpack bodies (any extension code and payload, truncated or with junk after):
    a value or a rollout_mock error, in bounded memory, with no side effect."""
    import msgpack

    body = msgpack.packb(value, use_bin_type=True)
    body = body[: max(1, len(body) - cut)] + junk if cut else body
    blob = C.v4(C.mp(body), body, [bytes(range(64)), bytes(64)])
    before = _state()
    tracemalloc.start()
    try:
        try:
            load(blob)
        except RolloutMockError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _state() == before and not MARKER.exists()
    assert peak <= 8 * len(blob) + (16 << 20)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(min_size=1, max_size=64) | st.lists(st.text(max_size=40), min_size=1, max_size=5).map(
           lambda items: __import__("msgpack").packb(items)),
       offsets=st.lists(st.integers(-100, 200), min_size=1, max_size=6) | st.lists(st.integers(0, 12), min_size=2,
                                                                                    max_size=6).map(sorted),
       shape=st.lists(st.integers(0, 8), max_size=2), flip=st.integers(-1, 63))
def test_random_string_columns_decode_or_fail_cleanly(data: bytes, offsets: list[int], shape: list[int],
                                                      flip: int) -> None:
    import struct

    if 0 <= flip < len(data):
        data = data[:flip] + bytes([data[flip] ^ 0x5A]) + data[flip + 1:]
    raw = struct.pack(f"<{len(offsets)}q", *offsets)
    root = {"$": "strs", "shape": shape, "c": [1, 1], "o": [2, 1]}
    blob = C.v4(root, b"\xc0", [data, raw])
    for rows in (None, slice(0, 2), range(1, 5, 2)):
        try:
            out = load(blob) if rows is None else codec_decode(blob, rows)
        except RolloutMockError:
            continue
        assert all(type(x) is str for x in out.reshape(-1))


def codec_decode(blob: bytes, rows: Any) -> Any:
    from rollout_mock.codec import decode

    return decode(blob, rows=rows)


# --------------------------------------------------------------------------- the allocation bound
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "0", "-1", "lots", "1e999"])
def test_the_allocation_bound_cannot_be_switched_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ROLLOUT_MOCK_MAX_EXPANSION=nan`` used to disable the bound (every comparison with NaN is
    false): a setting that is not a finite number > 0 is an error naming the variable."""
    from rollout_mock import ConfigError

    data = codec.encode_bytes({"x": codec.Batch()})
    monkeypatch.setenv("ROLLOUT_MOCK_MAX_EXPANSION", value)
    with pytest.raises(ConfigError, match="ROLLOUT_MOCK_MAX_EXPANSION"):
        codec.decode(data)
    monkeypatch.delenv("ROLLOUT_MOCK_MAX_EXPANSION")
    with pytest.raises(ConfigError, match="max_expansion="):
        codec.decode(data, max_expansion=float(value) if value != "lots" else value)
    monkeypatch.setenv("ROLLOUT_MOCK_MAX_EXPANSION", "128")
    assert isinstance(codec.decode(data)["x"], codec.Batch)


def test_a_compression_bomb_stays_refused_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    zstandard = pytest.importorskip("zstandard")
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(64 << 20))
    data = C.forge(C.doc(C.tensor("uint8", [64 << 20]), [[0, len(bomb), 64 << 20, C.zlib.crc32(bomb), 1, 0]]),
                   bomb + bytes(-len(bomb) % 64))
    for value in ("nan", "inf"):
        monkeypatch.setenv("ROLLOUT_MOCK_MAX_EXPANSION", value)
        with pytest.raises(RolloutMockError, match="ROLLOUT_MOCK_MAX_EXPANSION"):
            codec.decode(data)
    monkeypatch.delenv("ROLLOUT_MOCK_MAX_EXPANSION")
    with pytest.raises(RolloutMockError, match="refusing to allocate"):
        codec.decode(data)
