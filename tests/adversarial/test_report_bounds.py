"""Issue 22 item 11: ``report`` on a tiny step whose header declares much data.

A step of a few hundred bytes (a zstd chunk of zeros) declares ~470 K rows. The report used to
build a readable trace for every declared row (+453 MiB for a 515-byte step); it now reads at
most ``STATS_ROWS`` rows a step, so its peak memory stays small. Measured in a fresh interpreter
(``ru_maxrss`` after a warm-up report of a normal dump, then after the crafted one).
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
from conftest import HANG_S, requires

from rollout_mock import MockScheduler
from rollout_mock.storage import file_digest

REPO = Path(__file__).resolve().parents[2]
ROWS = 480_000  # uint8 [ROWS, 1]: ~470 KiB declared, a few hundred bytes stored


class Small:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"input_ids": torch.ones(4, 3, dtype=torch.long), "rewards": torch.arange(4.0)}


def _dump(path: Path) -> Path:
    with MockScheduler(Small(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as s:
        s.get_batch(None, 0)
    return path


def _crafted(path: Path) -> int:
    """Replace step 0 of a fresh dump by a tiny compressed step of ROWS rows (manifest fixed)."""
    from rollout_mock.codec import encode_bytes

    _dump(path)
    data = encode_bytes({"input_ids": torch.zeros(ROWS, 1, dtype=torch.uint8)}, compression="zstd")
    step = path / "train" / "step_000000.pkl"
    step.write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    entry = manifest["streams"]["train"]["steps"]["0"]
    entry["size"], entry["checksum"] = len(data), file_digest(step)[0]
    (path / "manifest.json").write_text(json.dumps(manifest))
    return len(data)


@requires("zstandard")
def test_report_memory_is_bounded_by_bytes_read_not_declared_rows(tmp_path: Path) -> None:
    size = _crafted(tmp_path / "crafted")
    assert size < 2048, size
    _dump(tmp_path / "normal")
    code = textwrap.dedent(f"""
        import json, resource
        from rollout_mock.debug.report import write_report
        write_report({str(tmp_path / 'normal')!r}, {str(tmp_path / 'warm.html')!r})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        write_report({str(tmp_path / 'crafted')!r}, {str(tmp_path / 'r.html')!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"grew_kib": after - before}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    grew_mib = json.loads(done.stdout.strip().splitlines()[-1])["grew_kib"] / 1024
    # the declared data itself (~0.5 MiB) and a few thousand rows' previews: far below the
    # ~400 MiB that one trace per declared row took
    assert grew_mib < 48, f"report of a {size}-byte step grew the peak RSS by {grew_mib:.0f} MiB"
    html = (tmp_path / "r.html").read_text()
    assert "statistics over their first" in html
    assert len(html) < 200_000


@pytest.mark.parametrize("rows", [5000])
def test_report_reads_at_most_stats_rows(tmp_path: Path, rows: int) -> None:
    """A real step larger than STATS_ROWS: statistics over its first rows, the total from the index."""
    from rollout_mock.debug.report import STEP_TEXT_CHARS, write_report
    from rollout_mock.debug.report_data import STATS_ROWS

    class Big:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return {"input_ids": torch.ones(rows, 2, dtype=torch.long), "rewards": torch.arange(float(rows))}

    with MockScheduler(Big(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}) as s:
        s.get_batch(None, 0)
    html = write_report(tmp_path / "d", tmp_path / "r.html").read_text()
    data = json.loads(html.split('id="rm-data">', 1)[1].split("</script>", 1)[0])
    step = data["steps"]["0"]
    assert step["total"] == rows and step["read"] == STATS_ROWS
    assert len(step["traces"]) <= 12
    # the search index covers every row read, its text within the step's share of the page's budget
    assert step["rows"]["n"] == STATS_ROWS == len(step["rows"]["r"])
    assert sum(len(t) for t in step["rows"]["t"] or []) <= STEP_TEXT_CHARS
