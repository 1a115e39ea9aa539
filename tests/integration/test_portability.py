"""Portability: a fixed on-disk format (format 2 is also a protocol-5 pickle), a checked format version, and other Python versions.

The other Python interpreters found here (pyenv, /usr/bin) have no torch or numpy, so they cannot
import rollout_mock; what they *can* do is decode a step file written by this Python with their
own ``pickle`` module (stdlib only, rebuild functions stubbed out), which proves the byte stream
does not depend on the writer's Python. See the README, "Guarantees".
"""

from __future__ import annotations

import glob
import json
import pickle
import pickletools
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HANG_S

from rollout_mock import FormatVersionError, MockScheduler, codec, load_step
from rollout_mock.storage.manifest import FORMAT_VERSION, read_manifest

DECODER = r"""
import hashlib, io, json, pickle, struct, sys

def load_v2(container):
    # format 2, parsed with the standard library only: container head, JSON header, chunks
    magic, header_len, data_offset, data_len, _crc, _ = struct.unpack_from("<8sQQQII", container, 0)
    assert magic == b"RMSTEP\x00\x02", magic
    header = json.loads(bytes(container[40:40 + header_len]))
    data = container[data_offset:data_offset + data_len]
    table = header["chunks"]

    def raw(ref):
        first, count = ref
        out = b""
        for offset, stored, size, _crc, codec, _shuffle in table[first:first + count]:
            assert codec == 0
            out += bytes(data[offset:offset + stored])
        return out

    def summary(node):
        if isinstance(node, list):
            return [summary(v) for v in node]
        if not isinstance(node, dict):
            return node
        tag = node.get("$")
        if tag is None:
            return {k: summary(v) for k, v in node.items()}
        if tag in ("tensor", "ndarray"):
            return {"rebuild": tag, "dtype": node["dtype"], "shape": node["shape"],
                    "sha256": hashlib.sha256(raw(node["c"])).hexdigest()}
        if tag == "int":
            return int(node["v"])
        if tag == "objarray":
            return {"rebuild": tag, "shape": node["shape"], "items": summary(node["items"])}
        return {"tag": tag, "fields": {k: summary(v) for k, v in sorted(node.items()) if k != "$"}}

    return summary(header["root"])

class StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "rollout_mock.codec" and name == "_load_v2":
            return load_v2
        raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))

with open(sys.argv[1], "rb") as file:
    data = file.read()
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "summary": StubUnpickler(io.BytesIO(data)).load()}, sort_keys=True))
"""


def batch_for(step: int) -> dict[str, object]:
    return {
        "input_ids": torch.arange(12, dtype=torch.int64).reshape(3, 4) + step,
        "logprobs": torch.linspace(-3, 0, 12, dtype=torch.bfloat16).reshape(3, 4),
        "mask": torch.ones(3, 4, dtype=torch.bool),
        "rewards": np.array([0.5, -1.0, 2.0], dtype=np.float32),
        "uid": np.array(["a", None, ["b", 1]], dtype=object),
        "meta_info": {"global_step": step, "big": 2**70, "name": "ünïcode"},
    }


class Scheduler:
    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        return batch_for(global_step)


@pytest.fixture(scope="module")
def step_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dump_dir = tmp_path_factory.mktemp("dump")
    with MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": str(dump_dir)}) as sched:
        sched.get_batch(None, global_step=7)
    return dump_dir / "train" / "step_000007.pkl"


def test_step_file_is_protocol_5_and_only_uses_protocol_5_opcodes(step_file: Path) -> None:
    assert codec.PROTOCOL == 5
    data = step_file.read_bytes()
    opcodes = list(pickletools.genops(data))
    assert opcodes[0][0].name == "PROTO" and opcodes[0][1] == 5
    assert max(op.proto for op, _, _ in opcodes) <= 5
    # no out-of-band buffers: the file is self-contained
    assert not {op.name for op, _, _ in opcodes} & {"NEXT_BUFFER", "READONLY_BUFFER", "PERSID", "BINPERSID"}


def test_every_global_in_a_step_file_exists_in_this_version(step_file: Path) -> None:
    names: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            names.add((module, name))
            return super().find_class(module, name)

    with open(step_file, "rb") as file:
        Recording(file).load()
    assert names and all(module == "rollout_mock.codec" for module, _ in names), names
    for _, name in names:
        assert callable(getattr(codec, name))


def test_manifest_records_format_and_writer(step_file: Path) -> None:
    manifest = read_manifest(step_file.parent.parent)
    assert manifest is not None
    raw = json.loads((step_file.parent.parent / "manifest.json").read_text())
    assert raw["format"] == "rollout_mock.dump" and raw["format_version"] == FORMAT_VERSION
    assert raw["writer"]["pickle_protocol"] == 5
    assert raw["writer"]["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_newer_format_version_is_refused(step_file: Path, tmp_path: Path) -> None:
    dump_dir = tmp_path / "dump"
    shutil.copytree(step_file.parent.parent, dump_dir)
    manifest = dump_dir / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["format_version"] = FORMAT_VERSION + 1
    raw["writer"]["rollout_mock"] = "9.0.0"
    manifest.write_text(json.dumps(raw))
    with pytest.raises(FormatVersionError) as info:
        load_step(dump_dir / "train" / "step_000007.pkl")
    message = str(info.value)
    assert str(manifest) in message and f"format version {FORMAT_VERSION + 1}" in message
    assert "upgrade rollout_mock" in message and "9.0.0" in message
    config = {"enable": True, "mode": "mock", "dump_dir": str(dump_dir)}
    with pytest.raises(FormatVersionError):
        MockScheduler(None, config)


def other_pythons() -> list[str]:
    """Interpreters of other minor versions (>= 3.8, protocol 5) found on this machine."""
    found: dict[str, str] = {}
    candidates = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3")) + sorted(
        glob.glob("/usr/bin/python3.*[0-9]") + glob.glob("/usr/local/bin/python3.*[0-9]")
    )
    for candidate in candidates:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=HANG_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = out.stdout.strip()
        if out.returncode != 0 or not version:
            continue
        major, minor = map(int, version.split("."))
        if (major, minor) >= (3, 8) and (major, minor) != sys.version_info[:2]:
            found.setdefault(version, candidate)
    return [found[v] for v in sorted(found, key=lambda v: tuple(map(int, v.split("."))))]


def decode(python: str, step_file: Path, tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "decode.py"
    script.write_text(DECODER)
    out = subprocess.run([python, "-I", str(script), str(step_file)], capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_decoder_agrees_with_the_real_batch(step_file: Path, tmp_path: Path) -> None:
    """The stub decoder sees exactly the bytes of the real tensors (so comparing it is enough)."""
    import hashlib

    here = decode(sys.executable, step_file, tmp_path)["summary"]
    batch = load_step(step_file)
    assert isinstance(here, dict)
    for key in ("input_ids", "logprobs", "mask"):
        rebuilt = here[key]
        digest = hashlib.sha256(batch[key].contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        assert rebuilt["rebuild"] == "tensor" and rebuilt["sha256"] == digest
    assert here["meta_info"] == {"global_step": 7, "big": 2**70, "name": "ünïcode"}


@pytest.mark.parametrize("python", other_pythons() or [None])
def test_step_file_decodes_identically_under_another_python(python: str | None, step_file: Path, tmp_path: Path) -> None:
    if python is None:
        pytest.skip("no other Python minor version is installed here (see the README, section Guarantees)")
    here = decode(sys.executable, step_file, tmp_path)
    there = decode(python, step_file, tmp_path)
    assert there["python"] != here["python"]
    assert there["summary"] == here["summary"]
