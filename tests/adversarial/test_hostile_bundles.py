"""Hostile bundles (issue 31, part 3): every reader of a ``.rmb`` keeps a dump's guarantees.

Each case starts from a real bundle and forges one thing (the table of contents is re-hashed so
that only the check under test can catch it): a truncated file, a bad magic or version, a huge
TOC, forged offsets and sizes, overlapping members, names with ``..``, absolute paths,
backslashes, NUL, a member count bomb, a member that fails its SHA-256, non-zero padding. Each is a
:class:`~rollout_mock.errors.BundleError` naming the file (CLI: exit 2, one line), from the
in-place reader (``open_dump``) and from ``unpack``; nothing is allocated from a forged number,
nothing is written outside (or at all under) the target directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import BundleError, MockScheduler, RolloutMockError, open_dump
from rollout_mock.cli import main as cli_main
from rollout_mock.storage.bundle import MAX_MEMBERS, Bundle

_FOOTER = struct.Struct("<QQ32s8s8s")


class Returns:
    def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
        return {"input_ids": torch.arange(12).view(3, 4) + global_step, "x": torch.full((3,), float(global_step))}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good")
    with MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": str(root / "dump")}) as scheduler:
        for step in range(3):
            scheduler.get_batch(None, step)
    assert cli_main(["pack", str(root / "dump"), "--steps", "1,2", "-o", str(root / "good.rmb")]) == 0
    return root / "good.rmb"


def parts(path: Path) -> tuple[bytes, int, dict[str, Any]]:
    data = path.read_bytes()
    toc_offset, toc_size, _, _, _ = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
    return data, toc_offset, json.loads(data[toc_offset:toc_offset + toc_size])


def with_toc(good: Path, out: Path, edit: Callable[[dict[str, Any]], Any] | bytes) -> Path:
    """``good`` with its table of contents replaced (edited, or raw bytes) and correctly hashed."""
    data, toc_offset, toc = parts(good)
    if isinstance(edit, bytes):
        body = edit
    else:
        edit(toc)
        body = json.dumps(toc).encode()
    out.write_bytes(data[:toc_offset] + body + _FOOTER.pack(toc_offset, len(body), hashlib.sha256(body).digest(),
                                                            bytes(8), b"RMB-END\n"))
    return out


def refused(path: Path, match: str, tmp_path: Path) -> None:
    """Refused by the in-place reader, by unpack and by the CLI, naming the file; unpack leaves
    nothing behind."""
    with pytest.raises(BundleError, match=match) as caught:
        open_dump(path).load(1)
    assert str(path) in str(caught.value) and caught.value.path is not None
    target = tmp_path / "target"
    with pytest.raises(RolloutMockError, match=match):
        from rollout_mock.cli.bundle import unpack

        unpack(path, target)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left


def test_the_good_bundle_opens(good: Path) -> None:
    Bundle.open(good).verify()
    assert torch.equal(open_dump(good).load(2)["x"], torch.full((3,), 2.0))


@pytest.mark.parametrize("keep", [0, 10, 40, 0.5, -1, -64, -65])
def test_truncated(good: Path, tmp_path: Path, keep: float) -> None:
    data = good.read_bytes()
    size = int(len(data) * keep) if isinstance(keep, float) else keep if keep >= 0 else len(data) + keep
    path = tmp_path / "cut.rmb"
    path.write_bytes(data[:size])
    refused(path, "too short|not a rollout_mock bundle|truncated|no bundle footer", tmp_path)


@pytest.mark.parametrize(("offset", "value", "match"), [
    (0, b"\x88", "not a rollout_mock bundle"),
    (8, struct.pack("<H", 2), "bundle format version 2.*upgrade rollout_mock"),
    (10, struct.pack("<H", 1), "malformed bundle header"),
    (12, struct.pack("<I", 3), "malformed bundle header"),
    (20, b"\x01", "malformed bundle header"),
])
def test_bad_header(good: Path, tmp_path: Path, offset: int, value: bytes, match: str) -> None:
    data = bytearray(good.read_bytes())
    data[offset:offset + len(value)] = value
    path = tmp_path / "bad.rmb"
    path.write_bytes(bytes(data))
    refused(path, match, tmp_path)


def test_appended_to_and_forged_footers(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    path = tmp_path / "f.rmb"
    path.write_bytes(data + b"junk")
    refused(path, "no bundle footer", tmp_path)
    _, toc_offset, _ = parts(good)
    for toc_off, toc_size, match in [(toc_offset, 1 << 40, "more than the"), (1 << 62, 100, "does not end where"),
                                     (0, len(data) - 64, "does not end where"), (toc_offset, 5, "does not end where")]:
        footer = _FOOTER.pack(toc_off, toc_size, bytes(32), bytes(8), b"RMB-END\n")
        path.write_bytes(data[:-64] + footer)
        refused(path, match, tmp_path)


def test_toc_failing_its_hash_or_not_json(good: Path, tmp_path: Path) -> None:
    data, toc_offset, _ = parts(good)
    flipped = bytearray(data)
    flipped[toc_offset + 5] ^= 0x20
    path = tmp_path / "t.rmb"
    path.write_bytes(bytes(flipped))
    refused(path, "table of contents fails its SHA-256", tmp_path)
    refused(with_toc(good, path, b"{not json"), "unreadable bundle table of contents", tmp_path)
    refused(with_toc(good, path, b"[" * 150 + b"]" * 150), "nested more than", tmp_path)
    refused(with_toc(good, path, b'{"format": "rollout_mock.bundle", "version": 1, "members": {}}'),
            "no member list", tmp_path)
    refused(with_toc(good, path, json.dumps({"format": "other", "version": 1, "members": []}).encode()),
            "not a rollout_mock.bundle", tmp_path)


def test_forged_sizes_and_offsets_allocate_nothing(good: Path, tmp_path: Path) -> None:
    cases: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
        (lambda toc: toc["members"][1].update(size=1 << 62), "overlaps|runs past"),
        (lambda toc: toc["members"][1].update(offset=1 << 62), "overlaps|runs past"),
        (lambda toc: toc["members"][1].update(size=-1), "bad offset, size"),
        (lambda toc: toc["members"][1].update(size=True), "bad offset, size"),
        (lambda toc: toc["members"][1].update(size="12"), "bad offset, size"),
        (lambda toc: toc["members"][1].update(offset=toc["members"][0]["offset"]), "overlaps"),
        (lambda toc: toc["members"][1].update(offset=toc["members"][0]["offset"] + 8), "overlaps"),
        (lambda toc: toc["members"][0].update(offset=0), "overlaps"),
        (lambda toc: toc["members"].reverse(), "overlaps"),
        (lambda toc: toc["members"][1].update(sha256="0" * 63), "bad offset, size or sha256"),
        (lambda toc: toc["members"][1].update(extra=1), "is not"),
        (lambda toc: toc["members"].append("x"), "is not"),
    ]
    path = tmp_path / "forged.rmb"
    for edit, match in cases:
        with_toc(good, path, edit)
        tracemalloc.start()
        try:
            with pytest.raises(BundleError, match=match):
                Bundle.open(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, (match, peak)
        refused(path, match, tmp_path)


@pytest.mark.parametrize("name", [
    "../evil", "../../etc/passwd", "/etc/passwd", "train/../../x", "a\\b", "..\\..\\x", "a\x00b", "", ".", "a//b",
    "./x", "x/", "bundle.json", "a b", "é", "x" * 600, 7, None,
])
def test_member_names_that_would_leave_the_dump(good: Path, tmp_path: Path, name: Any) -> None:
    path = with_toc(good, tmp_path / "n.rmb", lambda toc: toc["members"][1].update(name=name))
    refused(path, "member name", tmp_path)
    assert not (tmp_path.parent / "evil").exists() and not (tmp_path / "x").exists()


def test_duplicate_names_and_a_file_that_is_also_a_directory(good: Path, tmp_path: Path) -> None:
    def twice(toc: dict[str, Any]) -> None:
        toc["members"][2]["name"] = toc["members"][1]["name"]

    refused(with_toc(good, tmp_path / "d.rmb", twice), "listed twice", tmp_path)

    def file_and_dir(toc: dict[str, Any]) -> None:
        toc["members"][1]["name"] = "train"

    refused(with_toc(good, tmp_path / "d.rmb", file_and_dir), "both a file and the directory", tmp_path)


def test_member_count_bombs(good: Path, tmp_path: Path) -> None:
    def many(toc: dict[str, Any]) -> None:
        toc["members"] = [{"name": f"m{i}", "offset": 4096, "size": 0, "sha256": "0" * 64}
                          for i in range(MAX_MEMBERS + 1)]

    refused(with_toc(good, tmp_path / "m.rmb", many), "65,537 members, more than 65,536", tmp_path)
    bomb = b'{"format":"rollout_mock.bundle","version":1,"members":[' + b",".join([b"{}"] * 1_000_000) + b"]}"
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="more than 65,536 members"):
            Bundle.open(with_toc(good, tmp_path / "m.rmb", bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the 2 MB document itself, never a million dicts


def test_damaged_member_and_non_zero_padding(good: Path, tmp_path: Path) -> None:
    data, _, toc = parts(good)
    step = next(m for m in toc["members"] if m["name"] == "train/step_000001.pkl")
    damaged = bytearray(data)
    damaged[step["offset"] + step["size"] // 2] ^= 0xFF
    path = tmp_path / "dmg.rmb"
    path.write_bytes(bytes(damaged))
    refused(path, "'train/step_000001.pkl' fails its SHA-256", tmp_path)
    assert torch.equal(open_dump(path).load(2)["x"], torch.full((3,), 2.0))  # the other step is intact
    padded = bytearray(data)
    padded[step["offset"] - 1] = 1  # the alignment padding before the step
    path.write_bytes(bytes(padded))
    open_dump(path).load(1)  # in place: members are checked, padding is not read
    with pytest.raises(BundleError, match="non-zero bytes between members"):
        Bundle.open(path).verify()
    target = tmp_path / "u"
    assert cli_main(["unpack", str(path), "-o", str(target)]) == 2
    assert not target.exists()


def test_cli_says_one_line_naming_the_file(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = with_toc(good, tmp_path / "evil.rmb", lambda toc: toc["members"][1].update(name="../../evil"))
    capsys.readouterr()
    for argv in (["ls", str(path)], ["unpack", str(path), "-o", str(tmp_path / "u")],
                 ["pull", str(path), "-o", str(tmp_path / "p")], ["pack", str(path), "--steps", "1", "-o",
                                                                    str(tmp_path / "again.rmb")]):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and "member name" in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.rmb"]


def test_a_fifo_named_like_a_bundle_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.rmb"
    os.mkfifo(fifo)
    with pytest.raises(RolloutMockError, match="FIFO"):
        Bundle.open(fifo)
    assert cli_main(["unpack", str(fifo), "-o", str(tmp_path / "u")]) == 2
