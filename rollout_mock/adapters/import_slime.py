"""Reader of slime's ``--save-debug-rollout-data`` files.

``{rollout_id}.pt`` (training) and ``eval_{rollout_id}.pt`` (evaluation), each
``torch.save({"rollout_id": id, "samples": [Sample.to_dict(), ...]})`` with the samples flattened.
Loaded with ``torch.load(weights_only=False)`` as slime does (trust needed) and converted to the
record :mod:`rollout_mock.adapters.slime` replays: training samples regrouped by consecutive
``group_index``; evaluation samples under one dataset named ``debug`` (slime does not save names).
The path may be the folder of the template or a single file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rollout_mock.adapters.foreign import ForeignStep
from rollout_mock.errors import ForeignDumpError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.paths import open_regular

__all__ = ["detect", "scan"]

_FILE = re.compile(r"^(eval_)?([0-9]{1,18})\.pt$", re.ASCII)


def _files(root: Path) -> list[tuple[bool, int, Path]]:
    paths = [root] if root.is_file() else (sorted(root.iterdir()) if root.is_dir() else [])
    out = []
    for path in paths:
        match = _FILE.match(path.name)
        if match and path.is_file():
            out.append((match.group(1) is not None, int(match.group(2)), path))
    return out


def detect(root: Path) -> bool:
    return bool(_files(root))


def _loader(evaluation: bool) -> Any:
    def load(path: Path) -> Any:
        import torch

        from rollout_mock.adapters.slime import record_from_flat

        with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
            data = torch.load(file, map_location="cpu", weights_only=False)
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise ForeignDumpError(f"{path}: not a slime debug rollout file (no 'samples' list)", path=path)
        return record_from_flat(data["samples"], evaluation=evaluation)

    return load


def scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId("val" if evaluation else "train"), step, path, "generate_rollout", _loader(evaluation))
            for evaluation, step, path in _files(root)]
