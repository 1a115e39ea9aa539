"""Progress bars on a real terminal: a command run under a pseudo-terminal (with a window size:
tqdm draws nothing at width 0) must send the bar's carriage returns as such, not as a visible
``\\x0d`` (the CLI escapes every control character of what it prints: text from dumps is
untrusted), while a description from a dump stays escaped."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch
from conftest import HANG_S

from rollout_mock import MockScheduler

REPO = Path(__file__).resolve().parents[2]

# The real CLI, with the bar's first drawing delay (0.5 s) off: a small dump is verified in less
# time than that, and waiting for a slow enough command would make the test depend on the clock.
CHILD = """
import sys
import rollout_mock.text as text
text.PROGRESS_DELAY_S = 0
from rollout_mock.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_in_terminal(argv: list[str], cwd: Path, columns: int = 120, rows: int = 40) -> tuple[int, bytes]:
    """``rollout-mock ARGV`` with stdin, stdout and stderr on a pseudo-terminal of that size;
    its exit code and every byte it wrote to the terminal."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # bars are off in CI
    env.update(PYTHONPATH=str(REPO), TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], cwd=cwd, env=env, stdin=terminal,
                            stdout=terminal, stderr=terminal, start_new_session=True)
    os.close(terminal)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=HANG_S)
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, b"".join(chunks)


class Scheduler:
    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def get_batch(self, data: object, global_step: int) -> dict[str, torch.Tensor]:
        return {"x": torch.arange(4096, dtype=torch.float32) + global_step + self.offset}


def make_dump(path: Path, offset: float) -> Path:
    with MockScheduler(Scheduler(offset), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as mock:
        for step in range(3):
            mock.get_batch(None, step)
    return path


@pytest.mark.parametrize("argv", [["ls", "--verify", "A"], ["diff", "A", "B"]], ids=["ls", "diff"])
def test_a_progress_bar_redraws_with_real_carriage_returns(tmp_path: Path, argv: list[str]) -> None:
    dumps = {"A": make_dump(tmp_path / "a", 0.0), "B": make_dump(tmp_path / "b", 0.5)}  # B differs: diff loads it
    code, out = run_in_terminal([str(dumps.get(a, a)) for a in argv], cwd=tmp_path)
    assert code in (0, 1), out.decode(errors="replace")  # diff: 1, the dumps differ
    assert b"\\x0d" not in out, out  # the bug: the CLI's escaping turned the bar's \r into text
    # the bar drew ("  0%|   | 0.00/98.3k [00:00<?, ?B/s]") and redrew its line with a carriage
    # return of its own (the terminal turns each newline into \r\n: those do not count)
    assert b"%|" in out and re.search(rb"\r(?!\n)", out), out


def test_data_printed_on_the_terminal_is_still_escaped(tmp_path: Path) -> None:
    """What commands print from a dump keeps going through the escaping (here, an error naming a
    path with an escape sequence in it); only the bar draws on the raw stream."""
    hostile = tmp_path / "no\x1b]0;pwned\x07such"
    code, out = run_in_terminal(["ls", str(hostile)], cwd=tmp_path)
    assert code == 2, out
    assert b"\x1b]0;pwned" not in out and b"\\x1b]0;pwned" in out, out


def test_a_bar_description_from_a_dump_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    import rollout_mock.text as text

    monkeypatch.setattr(text, "PROGRESS_DELAY_S", 0)
    out = io.StringIO()
    with text.progress_bar(10, stream=out, enabled=True, desc="split\x1b[2J") as bar:
        bar.set_description("key\x1b]0;pwned\x07 step 1")
        bar.update(5)
    assert "\x1b[2J" not in out.getvalue() and "\x1b]0;pwned" not in out.getvalue()
    assert "split\\x1b[2J" in out.getvalue() and "key\\x1b]0;pwned\\x07 step 1" in out.getvalue()
