"""A full disk during a dump: a clear DiskFullError, nothing partial left, and the policy.

Fault injection (``os.write`` raising ENOSPC after N bytes, only for files under the dump
directory) always runs; a real 2 MiB tmpfs is used too where ``mount`` is permitted (root).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import HANG_S

from rollout_mock import DirectoryStore, DiskFullError, MockScheduler, WriterError, load_step
from rollout_mock.storage import BatchInfo
from rollout_mock.storage import directory as fileio
from rollout_mock.storage.directory import is_temp_name
from rollout_mock.storage.manifest import StreamId, read_manifest

STREAM = StreamId("train")


def batch_for(step: int, numel: int = 64 * 1024) -> dict[str, object]:
    return {"step": step, "x": torch.full((numel,), float(step))}


class Scheduler:
    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        return batch_for(global_step)


def inject_enospc(monkeypatch: pytest.MonkeyPatch, under: Path, after: int) -> dict[str, int]:
    """Make ``os.write`` to files under ``under`` fail with ENOSPC once ``after`` bytes went."""
    real_write = os.write
    state = {"written": 0, "failures": 0}
    root = str(under.resolve())

    def write(fd: int, data: object) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if not target.startswith(root):
            return real_write(fd, data)
        size = memoryview(data).nbytes  # type: ignore[arg-type]
        if state["written"] + size > after:
            state["failures"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        state["written"] += size
        return real_write(fd, data)

    real_writev, real_pwrite = os.writev, os.pwrite

    def writev(fd: int, buffers: list[object]) -> int:
        data = b"".join(bytes(memoryview(b)) for b in buffers)  # type: ignore[arg-type]
        return write(fd, data) if data else real_writev(fd, buffers)

    def pwrite(fd: int, data: object, offset: int) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(root) and state["written"] + memoryview(data).nbytes > after:  # type: ignore[arg-type]
            state["failures"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    # every way the writer puts bytes in a file: write, writev (small steps), pwrite (the head
    # of a large step, written last)
    monkeypatch.setattr(fileio.os, "write", write)
    monkeypatch.setattr(fileio.os, "writev", writev)
    monkeypatch.setattr(fileio.os, "pwrite", pwrite)
    return state


def assert_nothing_partial(dump_dir: Path, complete: list[int]) -> None:
    leftovers = [p.name for p in dump_dir.rglob("*") if is_temp_name(p.name)]
    assert leftovers == []
    files = sorted(int(p.name[5:11]) for p in dump_dir.glob("train/step_*.pkl"))
    manifest = read_manifest(dump_dir)
    assert files == complete
    assert (manifest.steps(STREAM) if manifest else []) == complete
    for step in complete:
        assert torch.equal(load_step(dump_dir / f"train/step_{step:06d}.pkl")["x"], batch_for(step)["x"])


def test_enospc_gives_disk_full_error_with_sizes_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DirectoryStore(tmp_path)
    store.open_writer(STREAM)
    store.save(STREAM, 0, batch_for(0), BatchInfo.of(batch_for(0)))
    size = store.entry(STREAM, 0).size
    inject_enospc(monkeypatch, tmp_path / "train", after=100_000)
    with pytest.raises(DiskFullError) as info:
        store.save(STREAM, 1, batch_for(1), BatchInfo.of(batch_for(1)))
    error = info.value
    path = tmp_path / "train" / "step_000001.pkl"
    assert error.path == str(path) and error.errno == errno.ENOSPC
    assert error.needed == size  # the whole file, not just what was written before ENOSPC
    assert error.free > 0
    message = str(error)
    assert str(path) in message
    assert re.search(rf"needs {size} bytes \(\d+\.\d\d MB\), {error.free} bytes \(\d+\.\d\d MB\) are free", message)
    assert "nothing partial" in message
    monkeypatch.undo()
    store.close()
    assert_nothing_partial(tmp_path, [0])


def test_enospc_while_writing_the_index_entry_leaves_no_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DirectoryStore(tmp_path)
    store.open_writer(STREAM)
    store.save(STREAM, 0, batch_for(0), BatchInfo.of(batch_for(0)))
    # the step file itself fits; its entry file (the commit point) does not
    real_write = os.write

    def write(fd: int, data: object) -> int:
        if "/.index/.step_" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(fileio.os, "write", write)
    with pytest.raises(DiskFullError, match=r"\.index/step_000001\.json"):
        store.save(STREAM, 1, batch_for(1), BatchInfo.of(batch_for(1)))
    monkeypatch.undo()
    store.close()
    assert_nothing_partial(tmp_path, [0])


def config(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), **extra}


@pytest.mark.parametrize("background", [True, False])
def test_policy_fail_raises_at_the_next_call_or_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool) -> None:
    sched = MockScheduler(Scheduler(), config(tmp_path, background=background))
    sched.get_batch(None, global_step=0)
    sched.flush()
    inject_enospc(monkeypatch, tmp_path / "train", after=0)
    with pytest.raises((DiskFullError, WriterError)) as info:
        for step in range(1, 5):
            sched.get_batch(None, global_step=step)
        sched.close()
    error = info.value
    disk_full = error if isinstance(error, DiskFullError) else error.__cause__
    assert isinstance(disk_full, DiskFullError)
    assert "step_000001.pkl" in str(error)
    monkeypatch.undo()
    try:
        sched.close()
    except WriterError:
        pass
    assert_nothing_partial(tmp_path, [0])


@pytest.mark.parametrize("background", [True, False])
def test_policy_skip_keeps_training_and_warns_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, background: bool
) -> None:
    sched = MockScheduler(Scheduler(), config(tmp_path, on_disk_full="skip", background=background))
    sched.get_batch(None, global_step=0)
    sched.flush()
    state = inject_enospc(monkeypatch, tmp_path / "train", after=0)
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        for step in range(1, 6):
            batch = sched.get_batch(None, global_step=step)
            assert batch["step"] == step  # training goes on with the real batches
        sched.close()  # does not raise
    assert state["failures"] == 1  # after the first failure nothing more is attempted
    loud = [r for r in caplog.records if "DUMPING IS NOW DISABLED" in r.getMessage()]
    assert len(loud) == 1 and loud[0].levelno >= logging.ERROR
    assert "no space left on device" in loud[0].getMessage()
    monkeypatch.undo()
    assert_nothing_partial(tmp_path, [0])


@pytest.mark.parametrize(
    ("extra", "remaining"), [({"max_steps": 10}, 9), ({"dump_steps": [0, 3, 5, 7]}, 3)]
)
def test_disk_estimate_is_logged_after_the_first_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: dict[str, object], remaining: int
) -> None:
    with caplog.at_level(logging.INFO, logger="rollout_mock"):
        with MockScheduler(Scheduler(), config(tmp_path, **extra)) as sched:
            sched.get_batch(None, global_step=0)
            sched.get_batch(None, global_step=1)
    lines = [r.getMessage() for r in caplog.records if "disk estimate" in r.getMessage()]
    assert len(lines) == 1, lines
    size = (tmp_path / "train" / "step_000000.pkl").stat().st_size
    expected = (
        rf"\[RolloutMock\] disk estimate: {remaining} more step\(s\) of ~{size / 1e6:.2f} MB need "
        rf"~{remaining * size / 1e6:.2f} MB; [\d.]+ MB free in {re.escape(str(tmp_path))}$"
    )
    assert re.match(expected, lines[0]), lines[0]


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs (skipped where mounting is not permitted)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
            capture_output=True, text=True, timeout=HANG_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=HANG_S)


def test_real_full_filesystem(tiny_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump_dir = tiny_fs / "dump"
    sched = MockScheduler(Scheduler(), config(dump_dir, background=False, max_steps=20))
    complete: list[int] = []
    with caplog.at_level(logging.INFO, logger="rollout_mock"):
        with pytest.raises(DiskFullError) as info:
            for step in range(20):
                sched.get_batch(None, global_step=step)
                complete.append(step)
    sched.close()
    assert 1 <= len(complete) < 20
    error = info.value
    assert error.free < error.needed
    assert str(tiny_fs) in str(error)
    estimate = next(r for r in caplog.records if "disk estimate" in r.getMessage())
    assert estimate.levelno == logging.WARNING and "NOT ENOUGH" in estimate.getMessage()
    assert_nothing_partial(dump_dir, complete)
