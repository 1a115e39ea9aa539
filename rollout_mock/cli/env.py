"""``rollout-mock env [--dump-dir D] [--json]``: show this environment's fingerprint.

With ``--dump-dir`` the fingerprint recorded in dump ``D`` (a directory or an fsspec URL such as
``s3://bucket/prefix``; read through its store, so a dump whose writer died is read too) is
compared with this one and the differences are printed as a table. Exit codes: 0 when nothing that can change numerics
differs (informational fields such as the platform string may differ), 1 when a numerics-relevant
field differs, 2 on bad input (no manifest, no recorded fingerprint; reported by
:func:`rollout_mock.cli.main`).

The fingerprint is taken in *this* process: run the command with the same environment (variables,
``CUDA_VISIBLE_DEVICES``) as the workers whose numerics you care about.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rollout_mock.determinism import (
    FingerprintDifference,
    compare_fingerprints,
    fingerprint,
    format_differences,
    format_fingerprint,
)
from rollout_mock.errors import DumpNotFoundError, ManifestError
from rollout_mock.storage.manifest import MANIFEST_NAME
from rollout_mock.storage.paths import is_url
from rollout_mock.storage.store import open_store

__all__ = ["add_parser", "load_dump_fingerprint", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``env`` subcommand on an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "env",
        help="print this environment's determinism fingerprint; compare it with a dump's",
        description=(
            "Print the versions, GPUs, environment variables and torch switches that decide "
            "numerics. With --dump-dir, compare them with the fingerprint recorded in that dump: "
            "exit 0 if no numerics-relevant field differs, 1 if one does, 2 on bad input."
        ),
    )
    parser.add_argument(
        "--dump-dir",
        metavar="DIR",
        help="dump directory (or fsspec URL: s3://bucket/prefix) whose fingerprint to compare with",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def load_dump_fingerprint(dump_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The fingerprint recorded in the dump at ``dump_dir`` (a path or an fsspec URL), read
    through its store: from ``manifest.json``, or from the files of a writer that died before
    compacting.

    Raises DumpNotFoundError when there is no dump, ManifestError when its index cannot be read or
    holds no fingerprint (written by hand, or by a writer that did not record one).
    """
    store = open_store(dump_dir)
    if not store.has_dump():
        path = store.where(MANIFEST_NAME)
        raise DumpNotFoundError(
            f"no dump at {os.fspath(dump_dir)}: {path} does not exist; pass the directory that was "
            "rollout_mock.dump_dir in dump mode",
            path=path,
        )
    recorded = store.fingerprint()
    if not isinstance(recorded, dict):
        raise ManifestError(
            f"{store.where('')}: the dump has no recorded fingerprint, so there is nothing to compare",
            path=store.where(MANIFEST_NAME),
        )
    return recorded


def _print_json(
    fp: dict[str, Any], dump_dir: str | None, diffs: list[FingerprintDifference]
) -> None:
    out: dict[str, Any] = {"fingerprint": fp}
    if dump_dir is not None:
        out["dump_dir"] = str(dump_dir)
        out["differences"] = [d.to_dict() for d in diffs]
    print(json.dumps(out, indent=2, sort_keys=True))


def explain(diffs: list[FingerprintDifference]) -> list[str]:
    """Why the fields differ, one line per kind, with what to do."""
    lines: list[str] = []
    env = [d.field for d in diffs if d.field.startswith("env.")]
    flags = [d.field for d in diffs if d.field.startswith("torch_flags.")]
    versions = [d.field for d in diffs if d.numerics_relevant and not d.field.startswith(("env.", "torch_flags."))]
    if env:
        lines.append(
            f"- {', '.join(f.removeprefix('env.') for f in env)}: the dump was recorded by a process with these "
            "variables set (rollout_mock.determinism.apply(), which the demo and ray_runtime_env use, sets them "
            "inside that process); this shell does not have them. Not a problem by itself: the replaying process "
            "must have them, so call determinism.apply() in your training script or export them at launch.")
    if flags:
        lines.append(
            f"- {', '.join(f.removeprefix('torch_flags.') for f in flags)}: torch switches set inside the recording "
            "process by determinism.apply(); this `rollout-mock env` process has torch's defaults. The training "
            "process that replays must switch them the same way (determinism.apply() does).")
    if versions:
        lines.append(
            f"- {', '.join(versions)}: a different library/driver/GPU than the dump's: replayed numbers may differ "
            "in the low bits; use the same versions to compare bit for bit.")
    info = [d.field for d in diffs if not d.numerics_relevant]
    if info:
        lines.append(f"- {', '.join(info)}: informational only; they do not change numerics.")
    return lines


def _print_text(
    fp: dict[str, Any], dump_dir: str | None, diffs: list[FingerprintDifference]
) -> None:
    print(format_fingerprint(fp))
    if dump_dir is not None:
        print()
        print(f"compared with the fingerprint recorded in the dump {dump_dir}:")
        print(format_differences(diffs))
        reasons = explain(diffs)
        if reasons:
            print("\nwhy they differ:")
            print("\n".join(reasons))


def run(args: argparse.Namespace) -> int:
    """Print the fingerprint (and differences); 1 if a numerics-relevant field differs, else 0."""
    current = fingerprint()
    diffs: list[FingerprintDifference] = []
    if args.dump_dir is not None:
        from rollout_mock.cli import resolve_dump

        local = None if is_url(args.dump_dir) else Path(args.dump_dir)
        if local is not None and (local.is_dir() or local.is_file()):  # a parent folder or a file: say where
            args.dump_dir = str(resolve_dump(local, "env --dump-dir"))
        diffs = compare_fingerprints(load_dump_fingerprint(args.dump_dir), current)
    (_print_json if args.json else _print_text)(current, args.dump_dir, diffs)
    return 1 if any(d.numerics_relevant for d in diffs) else 0
