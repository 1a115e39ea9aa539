"""Hostile dumps and planted files (issue 22, items 4-7 and 12-16): every attack is refused with a
:class:`RolloutMockError` (CLI: exit 2, one escaped line), nothing is read or written outside the
dump, nothing hangs, nothing reaches the terminal raw.

Each case goes through the library entry point it concerns and through the CLI commands that read
the planted file, run as subprocesses with a timeout (a FIFO that blocks fails the case, never
hangs the suite). Cases: symlinks at ``expected/`` and ``stalls/`` (4-6), ``cut --redact`` leaks
(7), unbounded config reads (12), FIFOs planted as manifest, entry file, stream record, step file
or expected metrics (13), hostile step keys, lease objects and verl folders (14), lone surrogates
(15) and terminal control sequences (16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S, wait_until

from rollout_mock import MockScheduler, RolloutMockError
from rollout_mock.errors import ConfigError, ManifestError, UnsafePathError

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("ROLLOUT_MOCK_ADVERSARIAL_TIMEOUT", str(HANG_S)))  # a hang bound only: a FIFO that blocks would never return at all
SECRET = "SECRET-PROMPT-7f3a"


class Returns:
    def get_batch(self, data: Any, global_step: int, prompt: str | None = None) -> Any:
        return {"input_ids": torch.ones(2, 3, dtype=torch.long) * global_step,
                "attention_mask": torch.ones(2, 3, dtype=torch.long),
                "prompt": [f"{SECRET} row0", f"{SECRET} row1"], "x": torch.full((2,), float(global_step))}


def make_dump(path: Path, steps: int = 3, **config: Any) -> Path:
    with MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": str(path), **config}) as s:
        for step in range(steps):
            s.get_batch(None, step, prompt=f"{SECRET} kwarg")
    return path


def cli(*argv: str | Path, cwd: Path, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """``rollout-mock ARGV`` in a subprocess (this checkout first on the path); bytes decoded
    leniently so that a raw control byte or invalid UTF-8 is seen, not hidden."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8"}
    try:
        done = subprocess.run([sys.executable, "-m", "rollout_mock", *map(str, argv)], cwd=cwd, env=env,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"rollout-mock {argv} did not finish in {timeout} s (blocked on a planted file?)") from None
    out, err = done.stdout.decode("utf-8", "backslashreplace"), done.stderr.decode("utf-8", "backslashreplace")
    assert "Traceback" not in err, err[-3000:]
    for stream in (done.stdout, done.stderr):
        for raw in (b"\x1b", b"\x07", b"\x9b", b"\r", b"\xc2\x9b", b"\xed\xa0\x80"):
            assert raw not in stream, f"raw {raw!r} reached the terminal: {stream[-500:]!r}"
    return done.returncode, out, err


def refused_cli(*argv: str | Path, cwd: Path) -> str:
    code, out, err = cli(*argv, cwd=cwd)
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert "error:" in err
    return err


def in_child(code: str, cwd: Path, *, memory_mb: int | None = None, timeout: float = TIMEOUT) -> str:
    """Run ``code`` in a fresh interpreter (optionally under RLIMIT_AS = its size + ``memory_mb``)
    and return its stdout; the code prints ``REFUSED <class>`` for a RolloutMockError."""
    prologue = "import resource, sys\n"
    if memory_mb is not None:
        prologue += (
            "import torch, numpy\n"
            "pages = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            f"resource.setrlimit(resource.RLIMIT_AS, (pages + ({memory_mb} << 20),) * 2)\n"
        )
    body = ("from rollout_mock.errors import RolloutMockError\n"
            "try:\n" + textwrap.indent(textwrap.dedent(code), "    ") +
            "\nexcept RolloutMockError as exc:\n    print('REFUSED', type(exc).__name__, str(exc)[:300].encode('ascii', 'backslashreplace').decode())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", prologue + body], cwd=cwd, env=env, capture_output=True,
                              text=True, errors="backslashreplace", timeout=timeout, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"did not finish in {timeout} s (blocked on a planted file?): {code}") from None
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    return make_dump(tmp_path / "dump")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    return directory


def _listing(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ 4-6: symlinks
def _dump_scheduler(dump_dir: Path) -> MockScheduler:
    return MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": str(dump_dir)})


def test_expected_dir_symlink_is_not_written_through(tmp_path: Path, outside: Path) -> None:
    from rollout_mock.compare.expected import MetricsWriter

    dump_dir = tmp_path / "fresh"
    dump_dir.mkdir()
    os.symlink(outside, dump_dir / "expected")
    scheduler = _dump_scheduler(dump_dir)
    with pytest.raises(UnsafePathError):
        MetricsWriter(tmp_path / "run" / "metrics.jsonl", expected=scheduler)
    scheduler.close()
    assert _listing(outside) == {}


@pytest.mark.parametrize("dangling", [False, True], ids=["existing-victim", "dangling-link"])
def test_expected_file_symlink_is_not_truncated_or_created(tmp_path: Path, outside: Path, dangling: bool) -> None:
    from rollout_mock.compare.expected import MetricsWriter, attach_expected

    dump_dir = tmp_path / "fresh"
    (dump_dir / "expected").mkdir(parents=True)
    victim = outside / "victim.txt"
    if not dangling:
        victim.write_text("precious\n")
    os.symlink(victim, dump_dir / "expected" / "metrics.jsonl")
    scheduler = _dump_scheduler(dump_dir)
    with pytest.raises(UnsafePathError):
        attach_expected(scheduler)
    with pytest.raises(UnsafePathError):
        MetricsWriter(tmp_path / "run" / "metrics.jsonl", expected=scheduler)
    scheduler.close()
    assert _listing(outside) == ({} if dangling else {"victim.txt": b"precious\n"})


def _plant_expected_link(dump_dir: Path, outside: Path, *, whole_dir: bool) -> None:
    (outside / "metrics.jsonl").write_text('{"step": 0, "SECRETMETRIC": 1.5}\n')
    if whole_dir:
        os.symlink(outside, dump_dir / "expected")
    else:
        (dump_dir / "expected").mkdir()
        os.symlink(outside / "metrics.jsonl", dump_dir / "expected" / "metrics.jsonl")


@pytest.mark.parametrize("whole_dir", [True, False], ids=["dir-link", "file-link"])
def test_expected_outside_is_not_read_by_mock_mode_or_report(dump: Path, outside: Path, tmp_path: Path,
                                                              whole_dir: bool) -> None:
    from rollout_mock.compare.expected import attach_expected, read_expected
    from rollout_mock.debug.report import write_report

    _plant_expected_link(dump, outside, whole_dir=whole_dir)
    with pytest.raises(UnsafePathError):
        read_expected(dump)
    config = {"enable": True, "mode": "mock", "dump_dir": str(dump), "verdict": "fail"}
    with pytest.raises(UnsafePathError):
        attach_expected(config)
    with pytest.raises(UnsafePathError):
        write_report(dump, tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()
    err = refused_cli("report", dump, "-o", tmp_path / "r.html", cwd=tmp_path)
    assert "symbolic link" in err
    assert not (tmp_path / "r.html").exists() or "SECRETMETRIC" not in (tmp_path / "r.html").read_text()
    (tmp_path / "run.jsonl").write_text('{"step": 0, "SECRETMETRIC": 2.5}\n')
    err = refused_cli("verify", dump, tmp_path / "run.jsonl", cwd=tmp_path)  # the dump's metrics: not read
    assert "symbolic link" in err
    err = refused_cli("cut", dump, tmp_path / "cut", "--steps", "0", cwd=tmp_path)  # not copied into a repro
    assert "symbolic link" in err and not (tmp_path / "cut").exists()


def test_stall_reports_are_not_written_through_a_link(tmp_path: Path, outside: Path) -> None:
    from rollout_mock.config.model import WatchdogConfig
    from rollout_mock.wrap.watchdog import STALLS_DIR, StallWatchdog

    dump_dir = tmp_path / "fresh"
    dump_dir.mkdir()
    os.symlink(outside, dump_dir / STALLS_DIR)
    watchdog = StallWatchdog(WatchdogConfig(absolute_seconds=0.05, min_seconds=0.0), directory=dump_dir)
    try:
        watchdog.enter("get_batch")
        wait_until(lambda: watchdog._reported == watchdog._token, "the watchdog never reported the stall")
    finally:
        watchdog.leave("get_batch")
        watchdog.close()  # joins its thread: the report's write has been tried
    assert watchdog.reports == []
    assert _listing(outside) == {}
    # and with a real directory the report is written inside the dump
    os.unlink(dump_dir / STALLS_DIR)
    watchdog = StallWatchdog(WatchdogConfig(absolute_seconds=0.05, min_seconds=0.0), directory=dump_dir)
    try:
        watchdog.enter("get_batch")
        wait_until(lambda: watchdog.reports, "the watchdog never reported the stall")
    finally:
        watchdog.leave("get_batch")
        watchdog.close()
    assert len(watchdog.reports) == 1 and watchdog.reports[0].parent == dump_dir / STALLS_DIR


# ------------------------------------------------------------------------------ 7: cut --redact
def _all_bytes(directory: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


def _slime_dump(path: Path) -> Path:
    from rollout_mock.adapters.slime import RECORD_FORMAT

    class Slime:
        def get_batch(self, data: Any, global_step: int, prompt: str | None = None) -> Any:
            return {"format": RECORD_FORMAT, "kind": "train", "metrics": None, "samples": [
                [{"prompt": f"{SECRET} q{g}", "response": f"{SECRET} a{g}{j}", "tokens": [1, 2, 3],
                  "reward": 1.0, "group_index": g, "label": f"{SECRET} gt"} for j in range(2)]
                for g in range(2)]}

    with MockScheduler(Slime(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as s:
        s.get_batch(None, 0, prompt=f"{SECRET} kwarg")
    return path


@pytest.mark.parametrize("kind", ["dict-batch", "slime-record"])
@pytest.mark.parametrize("entry", ["library", "cli"])
def test_cut_redact_leaves_no_text_anywhere(tmp_path: Path, kind: str, entry: str) -> None:
    from rollout_mock.debug.cut import cut_dump
    from rollout_mock.storage.reader import open_dump

    src = make_dump(tmp_path / "src") if kind == "dict-batch" else _slime_dump(tmp_path / "src")
    assert SECRET.encode() in _all_bytes(src)  # the secret is there to leak: in batches and calls
    assert SECRET.encode() in (src / "manifest.json").read_bytes()
    dst = tmp_path / "dst"
    if entry == "library":
        cut_dump(src, dst, steps="0", redact=True)
    else:
        code, _, err = cli("cut", src, dst, "--steps", "0", "--redact", cwd=tmp_path)
        assert code == 0, err
    assert SECRET.encode() not in _all_bytes(dst)
    assert SECRET.encode("utf-16-le") not in _all_bytes(dst) and SECRET.encode("utf-32-le") not in _all_bytes(dst)
    batch = open_dump(dst).load(0)
    assert SECRET not in repr(batch)
    assert "<redacted>" in repr(batch)


# ------------------------------------------------------------------------------ 12: config reads
@pytest.mark.parametrize("entry", ["load_config", "MockScheduler", "attach_expected"])
def test_config_from_dev_zero_is_refused_in_bounded_memory(tmp_path: Path, entry: str) -> None:
    call = {"load_config": "from rollout_mock.config import load_config\nload_config('/dev/zero')",
            "MockScheduler": "from rollout_mock import MockScheduler\nMockScheduler(object(), '/dev/zero')",
            "attach_expected": "from rollout_mock.compare.expected import attach_expected\nattach_expected('/dev/zero')"}
    out = in_child(call[entry] + "\nprint('LOADED')", tmp_path, memory_mb=256)
    assert out.startswith("REFUSED ConfigError"), out


def test_config_from_a_fifo_or_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    out = in_child(f"from rollout_mock.config import load_config\nload_config({str(fifo)!r})", tmp_path)
    assert out.startswith("REFUSED ConfigError"), out
    with pytest.raises(ConfigError):
        from rollout_mock.config import load_config

        load_config(tmp_path)


def test_config_larger_than_the_bound_is_refused_before_reading_it_all(tmp_path: Path) -> None:
    from rollout_mock.config import load_config
    from rollout_mock.config.loading import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES * 64)  # sparse: 256 MiB claimed, nothing allocated to read it
    with pytest.raises(ConfigError, match="too large"):
        load_config(big)


# ------------------------------------------------------------------------------ 13: FIFOs
def _plant_fifo(dump: Path, rel: str) -> Path:
    path = dump / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


FIFO_CASES = {
    "manifest": ("manifest.json", [["ls"], ["show"], ["diff", "OTHER"], ["report"], ["cut"], ["verify"]]),
    "step-file": ("train/step_000000.pkl", [["show"], ["diff", "OTHER"], ["report"], ["cut"]]),
    "stream-record": (".streams/train.json", [["ls"], ["show"], ["report"]]),
    "entry-file": ("train/.index/step_000007.json", [["ls"], ["show"], ["report"]]),
    "expected-metrics": ("expected/metrics.jsonl", [["report"], ["cut"], ["verify"]]),
}


def _argv(command: list[str], dump: Path, other: Path, tmp_path: Path) -> list[str | Path]:
    name = command[0]
    if name == "diff":
        return ["diff", dump, other]
    if name == "report":
        return ["report", dump, "-o", tmp_path / "r.html"]
    if name == "cut":
        return ["cut", dump, tmp_path / "cut-out", "--steps", "0"]
    if name == "verify":
        return ["verify", dump, tmp_path / "run-metrics.jsonl"]
    return [name, dump]


@pytest.mark.parametrize("case", sorted(FIFO_CASES))
def test_planted_fifo_never_blocks_any_entry_point(tmp_path: Path, case: str) -> None:
    dump = make_dump(tmp_path / "dump")
    other = make_dump(tmp_path / "other", steps=1)
    (other / "train" / "step_000000.pkl").unlink()  # diff must load dump's steps, not skip them
    rel, commands = FIFO_CASES[case]
    _plant_fifo(dump, rel)
    (tmp_path / "run-metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    for command in commands:
        code, out, err = cli(*_argv(command, dump, other, tmp_path), cwd=tmp_path)
        if case in ("stream-record", "entry-file") and command[0] != "report":
            assert code in (0, 2), (command, code, err)  # a planted index file is refused or ignored
        else:
            assert code in (1, 2) if command[0] == "diff" else code == 2, (command, code, out[-1500:], err[-1500:])
    # the library: opening and loading
    out = in_child(f"""
        from rollout_mock.storage.reader import open_dump
        dump = open_dump({str(dump)!r})
        dump.load(0)
        print('LOADED')
    """, tmp_path)
    if case in ("manifest", "step-file"):
        assert out.startswith("REFUSED"), out
    else:
        assert out.startswith(("REFUSED", "LOADED")), out


def test_open_inside_refuses_fifo_device_and_links(tmp_path: Path) -> None:
    from rollout_mock.storage.directory import write_inside
    from rollout_mock.storage.paths import open_inside, read_inside

    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    os.mkfifo(root / "a" / "fifo")
    os.symlink("/dev/zero", root / "a" / "dev")
    os.symlink(tmp_path, root / "link")
    (root / "a" / "ok").write_bytes(b"fine")
    for rel in ("a/fifo", "a/dev", "link/x", "../x", "a/../a/ok", "/etc/passwd"):
        with pytest.raises(UnsafePathError):
            open_inside(root, rel)
    assert read_inside(root, "a/ok") == b"fine" and read_inside(root, "a/missing") is None
    with pytest.raises(UnsafePathError):
        write_inside(root, "link/planted.txt", b"x")
    assert not (tmp_path / "planted.txt").exists()
    os.symlink(tmp_path / "victim", root / "a" / "target")  # a link at the destination is replaced
    write_inside(root, "a/target", b"new")
    assert not (tmp_path / "victim").exists() and (root / "a" / "target").read_bytes() == b"new"


# ------------------------------------------------------------------------------ 14: index values
def _edit_manifest(dump: Path, change: Any) -> None:
    path = dump / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _rename_step_key(new: str) -> Any:
    def change(data: dict[str, Any]) -> None:
        steps = data["streams"]["train"]["steps"]
        steps[new] = steps.pop("1")
    return change


@pytest.mark.parametrize("key", ["\u00b2", "--5", "9" * 5000, "\u0663", " 5", "5_0", "1e3", "-"],
                         ids=["superscript", "double-minus", "5000-digits", "arabic-indic", "space", "underscore",
                              "exponent", "minus"])
def test_hostile_step_keys_are_manifest_errors(tmp_path: Path, dump: Path, key: str) -> None:
    from rollout_mock.storage.reader import open_dump

    _edit_manifest(dump, _rename_step_key(key))
    with pytest.raises(ManifestError):
        dump_obj = open_dump(dump)
        [dump_obj.steps(s) for s in dump_obj.streams()]
    for argv in (["ls", dump], ["show", dump], ["diff", dump, dump], ["report", dump, "-o", tmp_path / "r.html"]):
        err = refused_cli(*argv, cwd=tmp_path)
        assert "step key" in err and len(err) < 2000, err


def test_forged_lease_objects_end_in_rolloutmock_errors(tmp_path: Path) -> None:
    fs = pytest.importorskip("fsspec").filesystem("memory")
    forged = [b'{"owner": "x", "expires_at": 1' + b"0" * 400 + b"}", b'{"expires_at": "tomorrow"}',
              b'{"expires_at": true}', b"[1, 2]", b"\xff\xfe", b"[" * 100_000, b'{"expires_at": NaN}',
              b'{"expires_at": 1e999, "owner": "\\u001b[2J\\ud800"}']
    for i, body in enumerate(forged):
        url = f"memory://forged-lease-{i}"
        fs.pipe(f"/forged-lease-{i}/train/.writer.lock", body)
        try:
            with MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": url}) as s:
                s.get_batch(None, 0)
        except RolloutMockError:
            pass  # refused cleanly (a live lease): fine; any other exception fails the test
        finally:
            fs.rm(f"/forged-lease-{i}", recursive=True)


def _verl_run(root: Path, step_name: str, meta: Any) -> Path:
    step = root / "exp_proj" / "GBS4_N2_in8_out8" / step_name
    step.mkdir(parents=True)
    (step / "gen_batch.dp").write_bytes(b"\x80\x04N.")  # a pickle of None: never loaded without --trust
    (step / "meta.json").write_text(json.dumps(meta))
    return root


@pytest.mark.parametrize("meta", [{"global_steps": [0]}, {"global_steps": "0"}, {"global_steps": True},
                                  {"global_steps": {"a": 1}}, "not json {"], ids=["list", "string", "bool", "dict", "garbage"])
def test_verl_meta_with_a_non_integer_step_is_refused_on_import(tmp_path: Path, meta: Any) -> None:
    from rollout_mock.adapters.foreign import open_foreign
    from rollout_mock.errors import ForeignDumpError

    src = _verl_run(tmp_path / "verl", "0", meta)
    if meta == "not json {":
        (src / "exp_proj" / "GBS4_N2_in8_out8" / "0" / "meta.json").write_text("not json {")
    with pytest.raises(ForeignDumpError):
        open_foreign(src)
    err = refused_cli("import", src, tmp_path / "dst", cwd=tmp_path)
    assert "global_steps" in err or "meta.json" in err
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


@pytest.mark.parametrize("name", ["\u00b2", "\u0663", "9" * 200])
def test_ls_on_a_folder_with_a_hostile_step_directory(tmp_path: Path, name: str) -> None:
    src = _verl_run(tmp_path / "verl", name, {"global_steps": 0})
    for command in ("ls", "show"):
        err = refused_cli(command, src, cwd=tmp_path)
        assert "no dump" in err or "dump" in err


# ------------------------------------------------------------------------------ 15-16: terminal text
HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\x9b31m\r\ud800 \udc80"  # lone surrogates: not a pair


def _hostile_dump(path: Path) -> Path:
    class Hostile:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long),
                    "prompt": [f"p{HOSTILE_TEXT}", "ok"], f"key{HOSTILE_TEXT}": torch.ones(2)}

    with MockScheduler(Hostile(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as s:
        for step in range(2):
            s.get_batch(None, step)

    def change(data: dict[str, Any]) -> None:
        data["writer"]["python"] = HOSTILE_TEXT
        data["created_at"] = HOSTILE_TEXT
        data["streams"]["train"]["steps"]["0"]["type"] = HOSTILE_TEXT
        data["streams"]["train"]["methods"]["get_batch"]["convention"] = HOSTILE_TEXT

    _edit_manifest(path, change)
    return path


@pytest.mark.parametrize("command", ["ls", "ls-keys", "ls-json", "show", "show-jsonl", "diff", "report"])
def test_surrogates_and_control_sequences_never_reach_the_terminal_raw(tmp_path: Path, command: str) -> None:
    hostile = _hostile_dump(tmp_path / "hostile")
    plain = make_dump(tmp_path / "plain", steps=2)
    argv: list[str | Path] = {
        "ls": ["ls", hostile], "ls-keys": ["ls", hostile, "--keys"], "ls-json": ["ls", hostile, "--json"],
        "show": ["show", hostile], "show-jsonl": ["show", hostile, "--jsonl"], "diff": ["diff", hostile, plain],
        "report": ["report", hostile, "-o", tmp_path / "r.html"],
    }[command]
    code, out, err = cli(*argv, cwd=tmp_path)  # (cli asserts: no traceback, no raw control byte)
    assert code in ((0, 1) if command == "diff" else (0,)), (code, err[-2000:])
    if command in ("ls", "ls-keys", "show"):
        assert "\\x1b" in out or "\\u001b" in out  # shown, escaped
    if command == "report":
        (tmp_path / "r.html").read_text(encoding="utf-8")  # valid UTF-8 written


def test_error_messages_are_escaped_too(tmp_path: Path, dump: Path) -> None:
    _edit_manifest(dump, _rename_step_key("\x1b[2J\ud800"))
    err = refused_cli("ls", dump, cwd=tmp_path)
    assert "\\x1b" in err or "\\u001b" in err


def test_terminal_safe_is_total() -> None:
    from rollout_mock.text import terminal_safe

    for code in range(0x110000):  # every code point: escaped or printable, always encodable
        terminal_safe(chr(code)).encode("utf-8")
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("a\tb\nc", newlines=False) == "a\\x09b\\x0ac"
    assert "\x1b" not in terminal_safe(HOSTILE_TEXT) and "\r" not in terminal_safe(HOSTILE_TEXT)


# ------------------------------------------------------------------------------ 14: manifest values
_VALUES = [None, "x\ud800", [1], {"a": 1}, 10**30, "9" * 5000]
_FIELDS = [("streams", "train", "steps", "0", f) for f in ("size", "samples", "type", "keys", "call", "file",
                                                             "checksum", "rollout_seconds", "method")]
_FIELDS += [("writer",), ("fingerprint",), ("created_at",), ("streams", "train", "methods"),
            ("streams", "train", "methods", "get_batch"), ("streams", "train", "name"), ("streams", "train", "rank")]


@pytest.mark.parametrize("field", _FIELDS, ids=[".".join(f[-2:]) for f in _FIELDS])
def test_hostile_manifest_values_end_in_clean_errors(tmp_path: Path, field: tuple[str, ...],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Every command on a manifest whose field holds a value of the wrong type: output or a
    RolloutMockError (exit 2), never another exception (run in-process: nothing here can block)."""
    import shutil

    from rollout_mock.cli import main

    src = make_dump(tmp_path / "src", steps=2)
    for i, value in enumerate(_VALUES):
        dump = tmp_path / f"d{i}"
        shutil.copytree(src, dump)

        def change(data: dict[str, Any], value: Any = value) -> None:
            node = data
            for part in field[:-1]:
                node = node[part]
            node[field[-1]] = value

        _edit_manifest(dump, change)
        for argv in (["ls", dump, "--keys"], ["ls", dump, "--json"], ["show", dump], ["diff", dump, src],
                     ["report", dump, "-o", tmp_path / "r.html"]):
            code = main([str(a) for a in argv])
            out, err = capsys.readouterr()
            assert code in (0, 1, 2), (argv, value, code)
            assert "\x1b" not in out + err
