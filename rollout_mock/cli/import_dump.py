"""``rollout-mock import SRC DST --trust``: convert another tool's rollout dump into a rollout_mock
dump (manifest, checksums, the safe format).

SRC may be:

* a ROLL dump_dir (``train/step_000000.pkl``, ``val/...``; ROLL's own rollout mock);
* a verl ``skip.rollout`` dump (``{dump_dir}/{exp}_{project}/GBS.../{step}/gen_batch.dp`` + ``meta.json``;
  any of those three levels);
* an AReaL ``trajectory_debug`` folder (``step_000000.pt`` or ``step_000000_dp_0.pt``);
* a slime ``--save-debug-rollout-data`` folder (``0.pt``, ``1.pt``, ``eval_0.pt``), or one such file.

The format is detected (``--format`` names it). All four are pickles (loading one can run code),
so ``--trust`` is required: only import dumps you trust. SRC is never modified. The result
replays in safe mode, without any trust: ``mode: mock, dump_dir: DST``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rollout_mock.errors import DumpNotFoundError, RolloutMockError, StepExistsError
from rollout_mock.storage.paths import is_url

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "import", help="convert a ROLL / verl / AReaL / slime dump into a rollout_mock dump",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", type=Path, help="the foreign dump folder (or one slime/AReaL file)")
    parser.add_argument("dst", help="new rollout_mock dump_dir or fsspec URL (must not hold those steps yet)")
    parser.add_argument("--trust", action="store_true",
                        help="required: the source files are pickles that can run code when loaded")
    parser.add_argument("--format", choices=("roll", "verl", "areal", "slime"),
                        help="the source format (default: detected)")
    parser.add_argument("--overwrite", action="store_true", help="replace steps DST already holds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def run(args: argparse.Namespace) -> int:
    from rollout_mock.adapters.foreign import import_foreign, open_foreign
    from rollout_mock.storage.manifest import MANIFEST_NAME

    src: Path = args.src
    fmt = f" --format {shlex.quote(args.format)}" if args.format else ""
    q_src, q_dst = shlex.quote(str(src)), shlex.quote(str(args.dst))  # the commands suggested below, shell-quoted
    if not src.exists():
        raise DumpNotFoundError(
            f"no such folder: {src}. Pass the folder the other tool wrote (ROLL's dump_dir, verl's "
            f"skip.rollout dump_dir, AReaL's trajectory_debug path, slime's debug rollout folder)",
            path=src,
        )
    if src.is_dir() and (src / MANIFEST_NAME).is_file():
        raise RolloutMockError(
            f"{src} is already a rollout_mock dump (it has {MANIFEST_NAME}); nothing to import: use it "
            f"directly (dump_dir: {src}), e.g. rollout-mock ls {q_src}"
        )
    foreign = open_foreign(src, trust=args.trust, format=args.format)  # detect first: say what it is
    if not args.trust:
        raise RolloutMockError(
            f"{src} is a {foreign.format} dump of {len(foreign.records)} step file(s): pickles, and loading "
            f"one can run arbitrary code. If you made it or trust it, run: "
            f"rollout-mock import {q_src} {q_dst} --trust{fmt}"
        )
    if not is_url(args.dst) and Path(args.dst).resolve() == src.resolve():
        raise RolloutMockError(f"DST must differ from SRC; e.g. rollout-mock import {q_src} "
                               f"{shlex.quote(f'{src}_imported')} --trust{fmt}")
    imported: list[str] = []

    def report(line: str) -> None:
        imported.append(line)
        print(line, flush=True)

    try:
        foreign = import_foreign(src, args.dst, trust=True, format=foreign.format, overwrite=args.overwrite,
                                 report=report, progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        print(f"interrupted; {len(imported)} step(s) kept in {args.dst} (rerun with --overwrite to redo them)",
              file=sys.stderr, flush=True)
        raise
    except StepExistsError as exc:  # the library's fix is a config key; the CLI's is a flag
        raise StepExistsError(
            f"{args.dst} already holds step {exc.step} of {exc.split} (imported before?); replace the "
            f"steps it holds with: rollout-mock import {q_src} {q_dst} --trust{fmt} --overwrite  "
            f"(or pick a new DST)", split=exc.split, step=exc.step, path=exc.path,
        ) from exc
    print(f"{len(foreign.records)} step(s) of a {foreign.format} dump imported into {args.dst}; they "
          f"replay in safe mode: mode: mock, dump_dir: {args.dst}  (list them: rollout-mock ls {q_dst})")
    return 0
