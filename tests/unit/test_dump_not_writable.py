"""Dumping where nothing can be written (issue 30 item 4): a read-only file system, a directory
without write permission, a disk that is full when the dump opens. Each is one error of ours
(DumpNotWritableError, DiskFullError) naming the dump directory and the fix, raised without the
OS error chained behind it (no second traceback). S3 (access denied, a missing bucket) is in
tests/integration/test_s3_store.py.

Real file systems where ``mount`` is permitted (root in a container): a read-only tmpfs and a
full one; the same refusals injected into ``os.open``/``os.mkdir`` run everywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

from rollout_mock import DiskFullError, MockScheduler
from rollout_mock.errors import DumpNotWritableError

REPO = Path(__file__).resolve().parents[2]


class Scheduler:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": torch.full((4,), float(global_step))}


def dump_into(dump_dir: Path) -> None:
    with MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": str(dump_dir)}) as scheduler:
        scheduler.get_batch(None, 0)


def assert_one_clean_error(error: BaseException, dump_dir: Path, *words: str) -> None:
    message = str(error)
    assert "\n" not in message and str(dump_dir) in message, message
    assert all(word in message for word in words), message
    assert "point dump_dir" in message.lower(), message
    assert error.__cause__ is None and error.__suppress_context__, "the OS error must not be chained"


def refuse(monkeypatch: pytest.MonkeyPatch, under: Path, code: int) -> None:
    """Make every creation or write of a file or directory under ``under`` fail with ``code``."""
    real_open, real_mkdir = os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def inside(path: Any, dir_fd: int | None) -> bool:
        return dir_fd is None and str(os.fspath(path)).startswith(str(under))

    def fake_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & writes and inside(path, dir_fd):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if inside(path, dir_fd):
            raise OSError(code, os.strerror(code), os.fspath(path))
        real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


@pytest.mark.parametrize("existing", [False, True], ids=["to-create", "existing"])
def test_read_only_file_system_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    dump_dir = tmp_path / "ro" / "dump"
    if existing:
        dump_dir.mkdir(parents=True)
    refuse(monkeypatch, tmp_path / "ro", errno.EROFS)
    with pytest.raises(DumpNotWritableError) as info:
        dump_into(dump_dir)
    assert_one_clean_error(info.value, dump_dir, "read-only file system")
    assert info.value.errno == errno.EROFS and isinstance(info.value, PermissionError)


def test_permission_denied_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump_dir = tmp_path / "locked" / "dump"
    refuse(monkeypatch, tmp_path / "locked", errno.EACCES)
    with pytest.raises(DumpNotWritableError) as info:
        dump_into(dump_dir)
    assert_one_clean_error(info.value, dump_dir, "permission denied")


def test_full_disk_at_open_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump_dir = tmp_path / "full" / "dump"
    refuse(monkeypatch, tmp_path / "full", errno.ENOSPC)
    with pytest.raises(DiskFullError) as info:
        dump_into(dump_dir)
    message = str(info.value)
    assert "\n" not in message and str(dump_dir) in message and "free some space" in message, message
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Any]:
    """Mount tmpfs file systems under ``tmp_path`` (skipped where mounting is not permitted)."""
    points: list[Path] = []

    def mount(name: str, options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                                  text=True, timeout=HANG_S)
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        points.append(point)
        return point

    yield mount
    for point in points:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=HANG_S)


def test_a_real_read_only_file_system(tmp_path: Path, mounted: Any) -> None:
    """Also through a fresh interpreter: one traceback, of our error, with one line of message."""
    dump_dir = mounted("ro", "ro,size=1m") / "dump"
    with pytest.raises(DumpNotWritableError) as info:
        dump_into(dump_dir)
    assert_one_clean_error(info.value, dump_dir, "read-only file system")
    code = textwrap.dedent(f"""
        import torch
        from rollout_mock import MockScheduler
        class S:
            def get_batch(self, data, global_step):
                return {{"x": torch.ones(2)}}
        MockScheduler(S(), {{"enable": True, "mode": "dump", "dump_dir": {str(dump_dir)!r}}}).get_batch(None, 0)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and done.stderr.count("Traceback") == 1, done.stderr
    assert "During handling" not in done.stderr and "pathlib" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("rollout_mock.errors.DumpNotWritableError: [RolloutMock]")


def test_a_real_full_disk_at_open(tmp_path: Path, mounted: Any) -> None:
    root = mounted("full", "size=64k")
    fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(DiskFullError) as info:
        dump_into(root / "dump")
    message = str(info.value)
    assert "\n" not in message and str(root / "dump") in message and "free some space" in message, message
