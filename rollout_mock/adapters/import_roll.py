"""Reader of ROLL's own rollout-mock dumps: ``{dump_dir}/{train,val}/step_NNNNNN.pkl``.

Each file is ``pickle.dump(DataProto, protocol=HIGHEST)``; loading needs ``roll`` importable
(``roll.distributed.scheduler.protocol.DataProto``) and trust. A directory that already holds a
rollout_mock ``manifest.json`` is not a ROLL dump.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

from rollout_mock.adapters.foreign import ForeignStep
from rollout_mock.storage.manifest import MANIFEST_NAME, StreamId
from rollout_mock.storage.paths import open_regular

__all__ = ["detect", "scan"]

_STEP = re.compile(r"^step_([0-9]{6,18})\.pkl$", re.ASCII)


def _files(root: Path) -> list[tuple[str, int, Path]]:
    if not root.is_dir() or (root / MANIFEST_NAME).is_file():
        return []
    found = []
    for split in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(split.iterdir()):
            match = _STEP.match(path.name)
            if match and path.is_file():
                found.append((split.name, int(match.group(1)), path))
    return found


def detect(root: Path) -> bool:
    return bool(_files(root))


def _load(path: Path) -> Any:
    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return pickle.load(file)


def scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId(split), step, path, "get_batch", _load) for split, step, path in _files(root)]
