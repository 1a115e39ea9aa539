"""Index bombs (issue 28): small hostile index files that crashed or exhausted ``ls``, ``show``,
``cut`` and ``open_dump``.

* **JSON bombs** anywhere in ``manifest.json``, an entry file, a stream record, an index segment
  or the fingerprint: an array nested thousands deep (``RecursionError``), a 5,000-digit integer
  (Python's int-string limit: ``ValueError``), ``1e999`` (``inf``, then ``OverflowError`` where an
  int is made of it), ``NaN``. Every command ends in one line and exit 2 (or ignores a bad entry
  file, as it ignores a torn one), never a traceback; the library raises a RolloutMockError.
* **A range bomb**: a 3.6 kB manifest whose segment reference names 5,000,000 steps made ``ls``
  peak at 400 MiB and ``cut --steps 10-40`` run out of time at 850 MiB (steps were expanded one by
  one). Measured in a fresh interpreter: peak RSS growth over a warm-up on a normal dump.
* **A lookup bomb**: 20,000 steps stored as single-step runs made each step's lookup scan every
  run (quadratic: ``ls`` of 60,000 timed out after 30 s). ``ls`` of it must take about as long as
  ``ls`` of the same steps in contiguous runs.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import HANG_S
from test_hostile_dumps import REPO, cli, in_child, make_dump

BOMBS = {
    "deep": "[" * 5000 + "]" * 5000,
    "digits": "9" * 5000,
    "inf": "1e999",
    "nan": "NaN",
}


def _set_text(path: Path, value_of: str, bomb: str) -> None:
    """Replace the JSON value ``"@@"`` placed at ``value_of`` by the raw ``bomb`` text."""
    data = json.loads(path.read_text())
    node = data
    *parents, last = value_of.split(".")
    for part in parents:
        node = node[part]
    node[last] = "@@BOMB@@"
    path.write_text(json.dumps(data).replace('"@@BOMB@@"', bomb))


def _uncompacted(path: Path) -> Path:
    """A dump whose writer died: entry files, a stream record and the fingerprint file, no manifest."""
    code = textwrap.dedent(f"""
        import os, torch
        from rollout_mock import MockScheduler
        s = MockScheduler(type("R", (), {{"get_batch": lambda self, d, global_step: {{"x": torch.ones(2)}}}})(),
                          {{"enable": True, "mode": "dump", "dump_dir": {str(path)!r}, "background": False}})
        for step in range(3):
            s.get_batch(None, step)
        os._exit(0)  # no close: nothing is compacted
    """)
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, check=True,
                   timeout=HANG_S)
    assert not (path / "manifest.json").exists() and (path / ".streams" / "train.json").exists()
    return path


# ------------------------------------------------------------------------------------------- JSON
WHERE = {  # file (relative to the dump) -> the field the bomb replaces
    "manifest": ("manifest.json", "streams.train.steps.1.samples"),
    "manifest-fingerprint": ("manifest.json", "fingerprint.python"),
    "entry": ("train/.index/step_000001.json", "entry.samples"),
    "stream-record": (".streams/train.json", "methods"),
    "fingerprint": (".fingerprint.json", "python"),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {"closed": make_dump(root / "closed"), "uncompacted": _uncompacted(root / "uncompacted")}


@pytest.mark.parametrize("where", WHERE, ids=WHERE)
def test_json_bombs_end_in_one_line(tmp_path: Path, sources: dict[str, Path], where: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Run in-process (nothing here can block): ``main`` returns 2 for a RolloutMockError, and any
    other exception escapes and fails the test."""
    from rollout_mock.cli import main

    rel, field = WHERE[where]
    for bomb, text in BOMBS.items():
        dump = tmp_path / bomb
        shutil.copytree(sources["closed" if rel == "manifest.json" else "uncompacted"], dump)
        _set_text(dump / rel, field, text)
        for argv in (["ls", dump], ["ls", dump, "--json", "--all"], ["show", dump, "--step", "0"]):
            code = main([str(a) for a in argv])
            out, err = capsys.readouterr()
            assert "\x1b" not in out + err and len(err) < 2000, (argv, bomb, err[-2000:])
            if rel == "manifest.json":
                assert code == 2 and "manifest.json: unreadable manifest" in err, (argv, bomb, code, err[-2000:])
            else:  # a bad entry, record or fingerprint file is ignored with a warning, like a torn one
                assert code in (0, 2), (argv, bomb, code, err[-2000:])
    code, _, err = cli("ls", dump, cwd=tmp_path)  # and once through the real command line: one line
    assert code in (0, 2) and len(err.strip().splitlines()) <= 3, err


def test_a_json_bomb_in_a_segment_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from rollout_mock.cli import main
    from rollout_mock.storage import BatchInfo, DirectoryStore, StreamId
    from rollout_mock.storage.index import StreamIndex

    monkeypatch.setattr(StreamIndex, "segment_steps", 2)
    monkeypatch.setattr(StreamIndex, "inline_steps", 0)  # the stream keeps its segments at close
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(3):
        store.save(StreamId("train"), step, {"x": step}, BatchInfo.of({"x": step}))
    store.close()
    segment = dump / "train" / ".index" / "segment_000000.json"
    original = segment.read_bytes()
    for bomb in BOMBS.values():
        segment.write_bytes(original)
        _set_text(segment, "entries.0.samples", bomb)
        assert main(["show", str(dump), "--step", "0"]) == 2
        assert "segment_000000.json" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["samples_1e999", "entry_nested_deep"])
def test_open_dump_entry_and_load_raise_our_error(tmp_path: Path, sources: dict[str, Path], case: str) -> None:
    dump = tmp_path / "d"
    if case == "samples_1e999":
        shutil.copytree(sources["closed"], dump)
        _set_text(dump / "manifest.json", "streams.train.steps.0.samples", "1e999")
    else:
        shutil.copytree(sources["uncompacted"], dump)
        (dump / "train" / ".index" / "step_000000.json").write_text("[" * 100_000 + "]" * 100_000)
    out = in_child(f"""
        from rollout_mock import open_dump
        from rollout_mock.storage.manifest import StreamId
        dump = open_dump({str(dump)!r})
        print("entry", dump.entry(StreamId("train"), 0))
        dump.load(0)
        print("loaded")
    """, cwd=tmp_path)
    assert "REFUSED" in out and "loaded" not in out, out


# ------------------------------------------------------------------------------------- ranges
def _measure(tmp_path: Path, argv: list[str], normal: Path, crafted: Path, timeout: float = HANG_S) -> dict[str, Any]:
    """``rollout-mock ARGV`` (``DUMP`` standing for the dump, ``OUT`` for an output folder) run on
    ``crafted`` in a fresh interpreter, after the same command on ``normal``: exit code, stderr,
    seconds and peak RSS growth (MiB)."""
    warm = [str(normal) if a == "DUMP" else str(tmp_path / "warm-out") if a == "OUT" else a for a in argv]
    real = [str(crafted) if a == "DUMP" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    code = textwrap.dedent(f"""
        import contextlib, io, json, resource, time
        from rollout_mock.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main({warm!r})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            status = main({real!r})
        print(json.dumps({{"code": status, "seconds": time.process_time() - started, "err": err.getvalue()[-500:],
                          "grew_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"rollout-mock {real} did not finish in {timeout} s") from None
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_segment_reference_naming_five_million_steps(tmp_path: Path) -> None:
    normal = make_dump(tmp_path / "normal")
    crafted = make_dump(tmp_path / "crafted")
    manifest = json.loads((crafted / "manifest.json").read_text())
    manifest["requires"] = ["index-segments"]
    manifest["streams"]["train"]["segments"] = [{"seq": 0, "steps": [[10, 5_000_009]]}]
    (crafted / "manifest.json").write_text(json.dumps(manifest))
    assert (crafted / "manifest.json").stat().st_size < 4096
    for argv in (["ls", "DUMP"], ["cut", "DUMP", "OUT", "--steps", "10-40"]):
        result = _measure(tmp_path, argv, normal, crafted)
        assert result["code"] == 2 and "segment" in result["err"], result  # its segment does not exist
        assert result["grew_mib"] < 48, f"{argv[0]} grew the peak RSS by {result['grew_mib']:.0f} MiB"


def _runs_dump(path: Path, steps: list[int], per_segment: int) -> Path:
    """A dump whose ``train`` stream holds ``steps``, in index segments of ``per_segment`` entries."""
    make_dump(path, steps=1)
    manifest = json.loads((path / "manifest.json").read_text())
    stream = manifest["streams"]["train"]
    template = stream["steps"].pop("0")
    refs = []
    index = path / "train" / ".index"
    index.mkdir(exist_ok=True)
    for seq, start in enumerate(range(0, len(steps), per_segment)):
        chunk = steps[start:start + per_segment]
        entries = {str(s): {**template, "file": f"train/step_{s:06d}.pkl"} for s in chunk}
        record = {"format": "rollout_mock.segment", "stream": "train", "seq": seq, "entries": entries}
        (index / f"segment_{seq:06d}.json").write_text(json.dumps(record, separators=(",", ":")))
        runs: list[list[int]] = []
        for s in chunk:
            if runs and runs[-1][1] + 1 == s:
                runs[-1][1] = s
            else:
                runs.append([s, s])
        refs.append({"seq": seq, "steps": runs})
    stream["segments"] = refs
    manifest["requires"] = ["index-segments"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_single_step_runs_are_looked_up_by_bisection(tmp_path: Path) -> None:
    count = 20_000
    contiguous = _runs_dump(tmp_path / "contiguous", list(range(count)), 1000)
    single = _runs_dump(tmp_path / "single", list(range(0, 2 * count, 2)), 1000)  # every run one step long
    times = {}
    for name, dump in (("contiguous", contiguous), ("single", single)):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        code, out, _ = cli("ls", dump, cwd=tmp_path)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the command's CPU time: a busy machine does not inflate it as it does wall-clock time
        times[name] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        # the forged entries have no step files: ls lists them all and marks them missing (exit 1)
        assert code == 1 and out.count("\n  step ") == count and out.count("DAMAGED: missing") == count - 1  # step 0 is real
    assert times["single"] < 2 * times["contiguous"] + 5, times
