"""``pull``/``pack``/``unpack`` writing over their own input, and ``--overwrite`` deleting files
they did not create (issue 37, round 5 items 1 and 2).

Before: ``pull DIR/x.rmb -o DIR --overwrite`` exited 0 having deleted DIR's contents (the bundle it
read and ``precious.txt``); ``pack D -o D/manifest.json --overwrite`` replaced the manifest of the
dump it read, and D no longer opened; ``--overwrite`` replaced any directory or file. Now the
output may not be the input, lie inside it or hold it (symlinks resolved), and ``--overwrite``
replaces only what the command makes: a dump directory, a bundle file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_numbers import make_dump, run

from rollout_mock import open_dump

PRECIOUS = b"do not delete"


def ids(step: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.full((2, 3), step)}


@pytest.fixture()
def dump(tmp_path: Path) -> Path:
    return make_dump(tmp_path / "d", ids, steps=2)


def refused(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err


def bundle(dump: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, _, err = run("pack", dump, "--steps", "0-1", "-o", out, capsys=capsys)
    assert code == 0, err
    return out


def test_pull_into_the_folder_of_its_bundle(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    rmb = bundle(dump, folder / "x.rmb", capsys)
    (folder / "precious.txt").write_bytes(PRECIOUS)
    refused(*run("pull", rmb, "-o", folder, "--overwrite", capsys=capsys), "holds the input")
    assert (folder / "precious.txt").read_bytes() == PRECIOUS and open_dump(rmb).load(0) is not None


def test_pack_over_the_manifest_it_reads(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (dump / "manifest.json").read_bytes()
    refused(*run("pack", dump, "--steps", "0", "-o", dump / "manifest.json", "--overwrite", capsys=capsys),
            "inside the input")
    assert (dump / "manifest.json").read_bytes() == before and open_dump(dump).load(1) is not None


@pytest.mark.parametrize("redact", [False, True])
def test_pack_into_the_dump(dump: Path, redact: bool, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--redact"] if redact else []
    refused(*run("pack", dump, "--steps", "0", "-o", dump / "train" / "x.rmb", *extra, capsys=capsys),
            "inside the input")
    assert not (dump / "train" / "x.rmb").exists()


def test_pack_a_bundle_over_itself(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rmb = bundle(dump, tmp_path / "b.rmb", capsys)
    before = rmb.read_bytes()
    refused(*run("pack", rmb, "--steps", "0", "-o", rmb, "--overwrite", capsys=capsys), "is the input")
    assert rmb.read_bytes() == before


@pytest.mark.parametrize("where", ["itself", "inside", "parent", "symlink"])
def test_pull_over_its_own_dump(tmp_path: Path, dump: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(p.relative_to(dump) for p in dump.rglob("*"))
    out = {"itself": dump, "inside": dump / "sub", "parent": tmp_path, "symlink": tmp_path / "link"}[where]
    if where == "symlink":
        os.symlink(dump, out)
    code, stdout, err = run("pull", dump, "-o", out, "--overwrite", capsys=capsys)
    refused(code, stdout, err, "refusing")
    assert sorted(p.relative_to(dump) for p in dump.rglob("*")) == before
    assert open_dump(dump).load(1) is not None


def test_unpack_over_a_folder_that_is_not_a_dump(tmp_path: Path, dump: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rmb = bundle(dump, tmp_path / "b.rmb", capsys)
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "precious.txt").write_bytes(PRECIOUS)
    refused(*run("unpack", rmb, "-o", folder, "--overwrite", capsys=capsys), "not a dump")
    assert (folder / "precious.txt").read_bytes() == PRECIOUS


def test_pull_over_a_dump_holding_another_file(tmp_path: Path, dump: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    other = make_dump(tmp_path / "other", ids, steps=1)
    (other / "notes.txt").write_bytes(PRECIOUS)
    refused(*run("pull", dump, "-o", other, "--overwrite", capsys=capsys), "notes.txt")
    assert (other / "notes.txt").read_bytes() == PRECIOUS


def test_pack_over_a_file_that_is_not_a_bundle(tmp_path: Path, dump: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "precious.txt"
    target.write_bytes(PRECIOUS)
    refused(*run("pack", dump, "--steps", "0", "-o", target, "--overwrite", capsys=capsys), "not a bundle")
    assert target.read_bytes() == PRECIOUS


def test_pack_over_a_symlink(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "precious.txt"
    target.write_bytes(PRECIOUS)
    os.symlink(target, tmp_path / "out.rmb")
    refused(*run("pack", dump, "--steps", "0", "-o", tmp_path / "out.rmb", "--overwrite", capsys=capsys))
    assert target.read_bytes() == PRECIOUS and (tmp_path / "out.rmb").is_symlink()


def test_overwrite_still_replaces_what_the_command_made(tmp_path: Path, dump: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rmb = bundle(dump, tmp_path / "b.rmb", capsys)
    code, _, err = run("pack", dump, "--steps", "1", "-o", rmb, "--overwrite", capsys=capsys)
    assert code == 0, err
    assert open_dump(rmb).steps(open_dump(rmb).streams()[0]) == [1]
    for command, source in (("pull", dump), ("unpack", rmb)):
        out = tmp_path / f"{command}-out"
        assert run(command, source, *(["--steps", "0"] if command == "pull" else []), "-o", out,
                   capsys=capsys)[0] == 0
        code, _, err = run(command, source, "-o", out, "--overwrite", capsys=capsys)
        assert code == 0, err
        assert open_dump(out).load(1) is not None


def test_overwrite_replaces_a_cut_dump(tmp_path: Path, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump made by ``cut`` (it holds provenance.json) is a dump: --overwrite replaces it."""
    assert run("cut", dump, tmp_path / "cut", "--steps", "0", capsys=capsys)[0] == 0
    assert (tmp_path / "cut" / "provenance.json").is_file()
    code, _, err = run("pull", dump, "-o", tmp_path / "cut", "--overwrite", capsys=capsys)
    assert code == 0, err
    assert open_dump(tmp_path / "cut").load(1) is not None
