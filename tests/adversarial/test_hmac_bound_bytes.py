"""Issue 22, items 1-3: with an HMAC key, what a load returns is exactly what was authenticated.

The attack: the step file (or S3 object) is changed *right after* the loader authenticated it
and before it is decoded, with a forged chunk whose CRC-32 still matches (CRCs are forgeable:
:func:`forge_crc` solves for four bytes). A loader that authenticates one read and decodes a
second read (or a memory mapping of the file) returns the attacker's bytes; a correct loader
returns the authenticated bytes. The window is hit deterministically: the forgery runs inside
``Digest.finish``, the moment the MAC of a load is computed.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from storage_conformance import s3_server  # noqa: F401  (the moto S3 server fixture)

from rollout_mock import CorruptStepError, MockScheduler, RolloutMockConfig, open_dump
from rollout_mock.codec import BytesSource, open_step
from rollout_mock.storage import BatchInfo, DirectoryStore, FsspecStore
from rollout_mock.storage import digest as digest_module
from rollout_mock.storage.manifest import StreamId

KEY = b"k" * 32
TRAIN = StreamId("train")
GOOD, EVIL = 7, 9


def batch() -> dict[str, Any]:
    return {"x": torch.full((1 << 20,), GOOD, dtype=torch.uint8), "y": torch.arange(8)}


def forge_crc(data: bytearray, start: int, end: int, target: int) -> None:
    """Set ``data[end-4:end]`` so that ``crc32(data[start:end]) == target`` (CRC-32 is affine in
    its input bits: solve 32 linear equations over GF(2))."""
    data[end - 4:end] = b"\0\0\0\0"
    base = zlib.crc32(data[start:end])
    columns = []
    for bit in range(32):
        probe = bytearray(data[start:end])
        probe[-4 + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(probe) ^ base)
    want = target ^ base
    # Gaussian elimination: find x (32 bits) with XOR of columns[i] for set bits i == want
    rows = [(columns[i], 1 << i) for i in range(32)]
    basis: dict[int, tuple[int, int]] = {}
    for value, combo in rows:
        for pivot in sorted(basis, reverse=True):
            if value >> pivot & 1:
                value ^= basis[pivot][0]
                combo ^= basis[pivot][1]
        if value:
            basis[value.bit_length() - 1] = (value, combo)
    solution = 0
    for pivot in sorted(basis, reverse=True):
        if want >> pivot & 1:
            want ^= basis[pivot][0]
            solution ^= basis[pivot][1]
    assert want == 0, "the 32 suffix bits span CRC-32's space"
    for bit in range(32):
        if solution >> bit & 1:
            data[end - 4 + bit // 8] ^= 1 << (bit % 8)
    assert zlib.crc32(data[start:end]) == target


def forged(original: bytes) -> bytes:
    """The step with the ``GOOD`` tensor's chunk rewritten to ``EVIL``, every chunk CRC intact
    (so the whole-file CRC-32 the index holds still matches)."""
    view = open_step(BytesSource(original), verify=True)
    layout = view._layout
    data = bytearray(original)
    pattern = bytes([GOOD]) * 4096
    for offset, stored, _raw, crc, codec, _shuf in layout.table:
        start = layout.data_base + offset
        if codec == 0 and pattern in data[start:start + stored]:
            data[start:start + stored - 4] = data[start:start + stored - 4].replace(bytes([GOOD]), bytes([EVIL]))
            forge_crc(data, start, start + stored, crc)
            return bytes(data)
    raise AssertionError("no chunk holds the tensor")


@pytest.fixture
def local_dump(tmp_path: Path) -> Path:
    store = DirectoryStore(tmp_path / "dump", hmac_key=KEY)
    b = batch()
    store.save(TRAIN, 0, b, BatchInfo.of(b), method="get_batch")
    store.set_methods(TRAIN, {"get_batch": {"convention": "sync", "step_arg": None, "step_kwarg": "step"}})
    store.close()
    return tmp_path / "dump"


def arm(monkeypatch: pytest.MonkeyPatch, attack: Callable[[], None]) -> list[int]:
    """Run ``attack`` once, right after the first keyed MAC of a load is computed."""
    real = digest_module.Digest.finish
    fired: list[int] = []

    def finish(self: Any) -> Any:
        result = real(self)
        if self._mac is not None and not fired:
            fired.append(1)
            attack()
        return result

    monkeypatch.setattr(digest_module.Digest, "finish", finish)
    return fired


def overwrite_in_place(path: Path) -> Callable[[], None]:
    evil = forged(path.read_bytes())

    def attack() -> None:
        with open(path, "r+b") as file:  # same inode: a mapping of the file sees it too
            file.write(evil)
    return attack


def x_of(loaded: Any) -> torch.Tensor:
    return loaded["x"] if isinstance(loaded, dict) else loaded


def check_returned(value: Callable[[], Any], fired: list[int]) -> None:
    try:
        x = x_of(value())
    except CorruptStepError:
        return  # refusing is fine; serving the attacker's bytes is not
    assert fired, "the attack never ran: the test would prove nothing"
    assert int(x.max()) == GOOD and int(x.min()) == GOOD, "returned bytes that were not authenticated"


LOADS: dict[str, Callable[[Path], Any]] = {
    "store.load": lambda d: DirectoryStore(d, hmac_key=KEY).load(TRAIN, 0),
    "Dump.load": lambda d: open_dump(d, hmac_key=KEY).load(0),
    "Dump.load mapped": lambda d: open_dump(d, hmac_key=KEY).load(0, mapped=True),
    "Dump.load keys": lambda d: open_dump(d, hmac_key=KEY).load(0, keys=["x"]),
    "Dump.load rows mapped": lambda d: open_dump(d, hmac_key=KEY).load(0, rows=range(3), mapped=True),
    "open mapped": lambda d: open_dump(d, hmac_key=KEY).open(0).load(),
    "open unmapped": lambda d: open_dump(d, hmac_key=KEY).open(0, mapped=False).load(),
    "open verify=False": lambda d: open_dump(d, hmac_key=KEY).open(0, verify=False).load(),
}


@pytest.mark.parametrize("entry_point", sorted(LOADS))
def test_local_loads_return_only_authenticated_bytes(local_dump: Path, monkeypatch: pytest.MonkeyPatch,
                                                     entry_point: str) -> None:
    fired = arm(monkeypatch, overwrite_in_place(local_dump / "train" / "step_000000.pkl"))
    check_returned(lambda: LOADS[entry_point](local_dump), fired)


def test_keyed_lazy_view_is_marked_verified(local_dump: Path) -> None:
    view = open_dump(local_dump, hmac_key=KEY).open(0, verify=False)
    assert view.verified  # authenticated whatever verify says


def test_forged_file_is_refused_with_key_and_accepted_by_crc(local_dump: Path) -> None:
    """The forgery itself: CRC-32 checks (the unkeyed path) cannot see it; the HMAC must."""
    path = local_dump / "train" / "step_000000.pkl"
    path.write_bytes(forged(path.read_bytes()))
    assert bool((open_dump(local_dump).load(0)["x"][:4096] == EVIL).all())  # CRC-only: fooled, as documented
    with pytest.raises(CorruptStepError, match="HMAC"):
        open_dump(local_dump, hmac_key=KEY).load(0)
    with pytest.raises(CorruptStepError, match="HMAC"):
        open_dump(local_dump, hmac_key=KEY).open(0, verify=False)


def test_mock_replay_returns_only_authenticated_bytes(local_dump: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_TEST_HMAC", KEY.decode())
    fired = arm(monkeypatch, overwrite_in_place(local_dump / "train" / "step_000000.pkl"))
    config = RolloutMockConfig(enable=True, mode="mock", dump_dir=str(local_dump), hmac_key_env="RM_TEST_HMAC",
                               prefetch=False)
    rollout = MockScheduler(None, config)
    check_returned(lambda: rollout.get_batch(step=0), fired)


@pytest.fixture
def s3_url(s3_server: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    url = f"s3://{s3_server['bucket']}/{uuid.uuid4().hex[:10]}"
    store = FsspecStore(url, storage_options=s3_server["storage_options"], hmac_key=KEY)
    b = batch()
    store.save(TRAIN, 0, b, BatchInfo.of(b))
    store.close()
    yield url, s3_server["storage_options"]


@pytest.mark.parametrize("entry_point", ["open", "open verify=False", "load", "load keys"])
def test_s3_views_return_only_authenticated_bytes(s3_url: tuple[str, dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch, entry_point: str) -> None:
    url, options = s3_url
    writer = FsspecStore(url, storage_options=options)
    rel = TRAIN.relpath(0)
    evil = forged(writer.backend.read(rel) or b"")
    fired = arm(monkeypatch, lambda: writer.backend.replace(rel, evil))  # the object replaced after the MAC
    dump = open_dump(url, hmac_key=KEY, storage_options=options)
    loads = {"open": lambda: dump.open(0).load(), "open verify=False": lambda: dump.open(0, verify=False).load(),
             "load": lambda: dump.load(0), "load keys": lambda: dump.load(0, keys=["x"])}
    check_returned(loads[entry_point], fired)
