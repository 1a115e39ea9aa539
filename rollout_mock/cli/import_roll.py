"""``rollout-mock import SRC DST``: convert a ROLL dump (plain pickles, no manifest) into a
rollout_mock dump with a manifest, checksums and the fast encoding.

ROLL writes ``{dump_dir}/{train,val}/step_NNNNNN.pkl`` with ``pickle.dump(DataProto)``. Those
files can only be read with the unrestricted unpickler, so the command requires ``--trust``:
only import dumps you made yourself or otherwise trust. SRC is never modified.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path

from rollout_mock.errors import DumpNotFoundError, RolloutMockError

_STEP = re.compile(r"^step_(\d{6,})\.pkl$")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser("import", help="convert a ROLL dump directory into a rollout_mock dump",
                                   description=__doc__)
    parser.add_argument("src", type=Path, help="ROLL dump_dir (holding train/ and/or val/)")
    parser.add_argument("dst", help="new rollout_mock dump_dir or fsspec URL (must not hold those steps yet)")
    parser.add_argument("--trust", action="store_true",
                        help="required: ROLL's pickles can run code when loaded; only import trusted dumps")
    return parser


def run(args: argparse.Namespace) -> int:
    from rollout_mock.storage.base import BatchInfo
    from rollout_mock.storage.manifest import StreamId
    from rollout_mock.storage.stores import open_store

    if not args.trust:
        raise RolloutMockError(
            f"refusing to unpickle {args.src} without --trust: ROLL dumps are plain pickles and "
            f"loading one can run arbitrary code; pass --trust if you made this dump yourself"
        )
    splits = sorted(p for p in args.src.iterdir() if p.is_dir()) if args.src.is_dir() else []
    found = [(split, path) for split in splits for path in sorted(split.iterdir()) if _STEP.match(path.name)]
    if not found:
        raise DumpNotFoundError(f"no {{split}}/step_NNNNNN.pkl files under {args.src}", path=args.src)
    store = open_store(args.dst)
    try:
        for split_dir, path in found:
            step = int(_STEP.match(path.name).group(1))  # type: ignore[union-attr]
            stream = StreamId(split_dir.name)
            store.open_writer(stream)
            with open(path, "rb") as file:
                batch = pickle.load(file)
            entry = store.save(stream, step, batch, BatchInfo.of(batch), method="get_batch")
            print(f"imported {path} -> {store.where(entry.file)} (samples={entry.samples}, {entry.size / 1e6:.2f} MB)")
    finally:
        store.close()
    print(f"{len(found)} step(s) imported into {args.dst}; replay them with mode: mock, dump_dir: {args.dst}")
    return 0
