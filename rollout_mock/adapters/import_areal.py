"""Reader of AReaL's ``trajectory_debug`` dumps (areal-project/AReaL PR #1407).

Files: ``step_{N:06d}.pt`` (single controller) or ``step_{N:06d}_dp_{rank}.pt`` (one per
data-parallel head), each ``torch.save`` of the ``list[dict[str, Tensor]]`` that
``prepare_batch`` returned (``None`` for rejected trajectories). Loaded like AReaL does:
``torch.load(map_location="cpu", weights_only=False)`` (trust needed). Per-rank files become the
streams ``train@rankR``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rollout_mock.adapters.foreign import ForeignStep
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.paths import open_regular

__all__ = ["detect", "scan"]

_FILE = re.compile(r"^step_([0-9]{6,18})(?:_dp_([0-9]{1,9}))?\.pt$", re.ASCII)


def _files(root: Path) -> list[tuple[int, int | None, Path]]:
    paths = [root] if root.is_file() else (sorted(root.iterdir()) if root.is_dir() else [])
    out = []
    for path in paths:
        match = _FILE.match(path.name)
        if match and path.is_file():
            out.append((int(match.group(1)), None if match.group(2) is None else int(match.group(2)), path))
    return out


def detect(root: Path) -> bool:
    return bool(_files(root))


def _load(path: Path) -> Any:
    import torch

    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return torch.load(file, map_location="cpu", weights_only=False)


def scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId("train", None, rank), step, path, "prepare_batch", _load)
            for step, rank, path in _files(root)]
