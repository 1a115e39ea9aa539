"""Reader of verl's ``skip.rollout`` dumps (``verl.utils.skip.RolloutSkip``).

Layout: ``{dump_dir}/{experiment}_{project}/GBS{gbs}_N{n}_in{P}_out{R}/{step}/gen_batch.dp`` plus
``meta.json`` (``{"global_steps": step}``); a step directory counts only with both files, as in
verl. ``gen_batch.dp`` is ``DataProto.save_to_disk`` (a plain pickle of the output of
``generate_sequences``; loading needs ``verl`` importable, and trust). The path given may be
any of the three levels; with several run directories below it, the error lists them.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

from rollout_mock.adapters.foreign import ForeignStep
from rollout_mock.errors import ForeignDumpError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.paths import open_regular, read_fd
from rollout_mock.text import short_repr

__all__ = ["detect", "run_dirs", "scan"]

_STEP_DIR = re.compile(r"[0-9]{1,18}", re.ASCII)
_META_LIMIT = 1 << 20
BATCH = "gen_batch.dp"
META = "meta.json"


def _step_dirs(run: Path) -> list[tuple[int, Path]]:
    out = []
    for child in run.iterdir() if run.is_dir() else ():
        # ASCII digits only: str.isdigit accepts '²', which int() refuses
        if _STEP_DIR.fullmatch(child.name) and (child / BATCH).is_file() and (child / META).is_file():
            out.append((int(child.name), child))
    return sorted(out)


def run_dirs(root: Path) -> list[Path]:
    """Directories (``root`` or up to two levels below) holding ``{step}/gen_batch.dp`` steps."""
    if not root.is_dir():
        return []
    if _step_dirs(root):
        return [root]
    found = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if _step_dirs(child):
            found.append(child)
            continue
        found.extend(g for g in sorted(p for p in child.iterdir() if p.is_dir()) if _step_dirs(g))
    return found


def detect(root: Path) -> bool:
    return bool(run_dirs(root))


def _load(path: Path) -> Any:
    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return pickle.load(file)


def _meta_step(path: Path, step: int) -> int:
    """``global_steps`` of a step's ``meta.json`` (the folder's step when absent);
    :class:`ForeignDumpError` for a file that is not small JSON text or a value not an integer."""
    data = read_fd(open_regular(path), limit=_META_LIMIT)
    try:
        if len(data) > _META_LIMIT:
            raise ValueError(f"larger than {_META_LIMIT} bytes")
        meta = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ForeignDumpError(f"{path}: not a verl meta.json ({short_repr(str(exc), 120)})", path=path) from None
    recorded = meta.get("global_steps", step) if isinstance(meta, dict) else step
    if isinstance(recorded, bool) or not isinstance(recorded, int):
        raise ForeignDumpError(f"{path}: global_steps={short_repr(recorded, 60)} is not an integer step", path=path)
    return recorded


def scan(root: Path) -> list[ForeignStep]:
    runs = run_dirs(root)
    if len(runs) > 1:
        raise ForeignDumpError(
            f"{root} holds {len(runs)} verl runs; import one at a time: "
            + "; ".join(f"rollout-mock import {run} NEW_DIR --trust" for run in runs[:5]),
            path=root,
        )
    steps = []
    for step, directory in _step_dirs(runs[0]) if runs else []:
        recorded = _meta_step(directory / META, step)
        if recorded != step:
            raise ForeignDumpError(
                f"{directory / META}: global_steps={recorded} but the folder is step {step}", path=directory,
            )
        steps.append(ForeignStep(StreamId("train"), step, directory / BATCH, "generate_sequences", _load))
    return steps
