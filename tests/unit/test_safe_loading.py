"""Safe loading by default: malicious pickles are refused and never run; HMAC-signed dumps."""

from __future__ import annotations

import builtins
import collections
import copyreg
import functools
import inspect
import json
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import CorruptStepError, MockScheduler, UnsafePickleError, codec, load_step
from rollout_mock.storage import file_digest
from rollout_mock.storage.manifest import read_manifest

OPT_IN = ("trust_pickle: true", "trusted=True", "--trust")


class Scheduler:
    def get_batch(self, data: object, global_step: int) -> Any:
        return {"x": torch.arange(4) + global_step}


def dump(dump_dir: Path, steps: int = 2, **extra: Any) -> None:
    config = {"enable": True, "mode": "dump", "dump_dir": str(dump_dir), **extra}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(steps):
            sched.get_batch(None, global_step=step)


def replace_step(dump_dir: Path, step: int, data: bytes, *, fix_manifest: bool) -> Path:
    """Put ``data`` in place of a step file; optionally fix its size and CRC in the manifest."""
    path = dump_dir / "train" / f"step_{step:06d}.pkl"
    path.write_bytes(data)
    if fix_manifest:
        manifest_file = dump_dir / "manifest.json"
        manifest = json.loads(manifest_file.read_text())
        entry = manifest["streams"]["train"]["steps"][str(step)]
        entry["size"] = len(data)
        entry["checksum"] = file_digest(path)[0]
        manifest_file.write_text(json.dumps(manifest))
    return path


class Reduce:
    """An object whose unpickling calls ``func(*args)``."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> Any:
        return self.func, self.args


def payloads(marker: Path) -> dict[str, tuple[bytes, str]]:
    """Pickles that would create ``marker``, and the global the loader must name."""
    touch = f"touch {marker}"
    return {
        "os.system": (pickle.dumps({"x": Reduce(os.system, touch)}, protocol=5), "posix.system"),
        "builtins.exec": (
            pickle.dumps(Reduce(builtins.exec, f"open({str(marker)!r}, 'w').close()"), protocol=5),
            "builtins.exec",
        ),
        "builtins.open": (pickle.dumps([Reduce(builtins.open, str(marker), "w")], protocol=5), "io.open"),
        "subprocess.call": (pickle.dumps(Reduce(subprocess.call, ["touch", str(marker)]), protocol=5), "subprocess.call"),
        "getattr gadget": (
            pickle.dumps(Reduce(getattr, torch.Size, "__class__"), protocol=5),
            "builtins.getattr",
        ),
        "copyreg._reconstructor": (
            pickle.dumps(Reduce(copyreg._reconstructor, Path, object, None), protocol=5),
            "copyreg._reconstructor",
        ),
        "functools.partial": (
            pickle.dumps(Reduce(functools.partial, os.system, touch), protocol=5),
            "functools.partial",
        ),
        "torch.load": (pickle.dumps(Reduce(torch.load, str(marker)), protocol=5), "torch.serialization.load"),
        "rebuild a non-batch class": (
            pickle.dumps(Reduce(codec._rebuild_object, torch.nn.Module, {}), protocol=5),
            "torch.nn.modules.module.Module",
        ),
        "rebuild an allowed non-batch class": (
            pickle.dumps(Reduce(codec._rebuild_object, collections.OrderedDict, {"a": 1}), protocol=5),
            "collections.OrderedDict",
        ),
    }


CASES = list(payloads(Path("/x")))


@pytest.mark.parametrize("case", CASES)
def test_load_step_refuses_malicious_pickle_even_with_matching_checksum(tmp_path: Path, case: str) -> None:
    dump(tmp_path / "dump")
    marker = tmp_path / "PWNED"
    data, global_name = payloads(marker)[case]
    path = replace_step(tmp_path / "dump", 1, data, fix_manifest=True)
    with pytest.raises(UnsafePickleError) as info:
        load_step(path)
    message = str(info.value)
    assert global_name in message and str(path) in message
    assert all(opt_in in message for opt_in in OPT_IN)
    assert info.value.step == 1 and info.value.split == "train"
    assert not marker.exists()
    # on its own (no manifest beside it), too
    alone = tmp_path / "alone.pkl"
    alone.write_bytes(data)
    with pytest.raises(UnsafePickleError, match=global_name.replace(".", r"\.")):
        load_step(alone)
    assert not marker.exists()


@pytest.mark.parametrize("prefetch", [True, False])
def test_mock_mode_refuses_malicious_pickle(tmp_path: Path, prefetch: bool) -> None:
    dump(tmp_path / "dump")
    marker = tmp_path / "PWNED"
    data, _ = payloads(marker)["os.system"]
    replace_step(tmp_path / "dump", 0, data, fix_manifest=True)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "dump"), "prefetch": prefetch}
    with MockScheduler(None, config) as sched:
        with pytest.raises(UnsafePickleError) as info:
            sched.get_batch(None, global_step=0)
        assert "posix.system" in str(info.value) and "trust_pickle: true" in str(info.value)
        assert torch.equal(sched.get_batch(None, global_step=1)["x"], torch.arange(4) + 1)
    assert not marker.exists()


def test_trusted_mode_verifies_before_unpickling(tmp_path: Path) -> None:
    """With trust_pickle, a tampered file is refused by its checksum before it can run code."""
    dump(tmp_path / "dump")
    marker = tmp_path / "PWNED"
    data, _ = payloads(marker)["os.system"]
    path = replace_step(tmp_path / "dump", 0, data, fix_manifest=False)
    with pytest.raises(CorruptStepError, match="size is"):
        load_step(path, trusted=True)
    # same size as the real step, so only the checksum can tell
    size = read_manifest(tmp_path / "dump").streams["train"]["steps"]["0"]["size"]
    command = f"touch {marker}"
    while len(data) < size:
        command += " "
        data = pickle.dumps({"x": Reduce(os.system, command)}, protocol=5)
    assert len(data) == size
    path = replace_step(tmp_path / "dump", 0, data, fix_manifest=False)
    with pytest.raises(CorruptStepError, match="checksum"):
        load_step(path, trusted=True)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "dump"), "trust_pickle": True}
    with MockScheduler(None, config) as sched, pytest.raises(CorruptStepError, match="step 0"):
        sched.get_batch(None, global_step=0)
    assert not marker.exists()


def test_trusted_loads_local_classes_and_lambdas(tmp_path: Path) -> None:
    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

    scale = 3

    class LambdaScheduler:
        def get_batch(self, data: object, global_step: int) -> Any:
            return {"obj": Local(global_step), "fn": lambda v: v * scale, "x": torch.ones(2)}

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path)}
    with MockScheduler(LambdaScheduler(), config) as sched:
        sched.get_batch(None, global_step=0)
    path = tmp_path / "train" / "step_000000.pkl"
    with pytest.raises(UnsafePickleError) as info:
        load_step(path)
    assert "trusted=True" in str(info.value)
    batch = load_step(path, trusted=True)
    assert type(batch["obj"]).__name__ == "Local" and batch["obj"].value == 0
    assert batch["fn"](5) == 15 and torch.equal(batch["x"], torch.ones(2))
    mock = {**config, "mode": "mock", "trust_pickle": True}
    with MockScheduler(None, mock) as sched:
        assert sched.get_batch(None, global_step=0)["fn"](2) == 6


def test_plain_pickle_load_still_works(tmp_path: Path) -> None:
    dump(tmp_path)
    with open(tmp_path / "train" / "step_000001.pkl", "rb") as file:
        assert torch.equal(pickle.load(file)["x"], torch.arange(4) + 1)


def test_every_codec_rebuild_function_is_known_to_the_format1_interpreter() -> None:
    """Format-1 files name ``rollout_mock.codec._rebuild_*``: each resolves (for a trusted
    ``pickle.load``), and the safe interpreter has a validating factory for each."""
    from rollout_mock.codec import legacy, trusted

    rebuilders = {name for name, value in vars(trusted).items() if name.startswith("_rebuild_") and inspect.isfunction(value)}
    assert rebuilders == set(trusted.REBUILD_FUNCTIONS) == legacy._FACTORIES
    for name in rebuilders:
        assert getattr(codec, name) is trusted.REBUILD_FUNCTIONS[name]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("builtins", "getattr"), ("builtins", "eval"), ("builtins", "exec"), ("builtins", "open"),
        ("builtins", "__import__"), ("builtins", "object"), ("builtins", "type"),
        ("copyreg", "_reconstructor"), ("copyreg", "__newobj__"), ("torch", "load"),
        ("torch", "from_file"), ("torch", "UntypedStorage"), ("torch._utils", "_rebuild_tensor_v2"),
        ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"), ("torch", "nn.Module"),
        ("os", "system"), ("posix", "system"), ("operator", "attrgetter"),
    ],
)
def test_dangerous_globals_are_not_allowed(module: str, name: str) -> None:
    data = b"\x80\x05\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c" + bytes([len(module)]) + module.encode()
    data += b"\x8c" + bytes([len(name)]) + name.encode() + b"\x93."
    with pytest.raises(UnsafePickleError, match=rf"{module}\.{name}"):
        codec.decode(data)


def test_safe_loader_keeps_what_rollout_mock_writes(tmp_path: Path) -> None:
    import collections
    import datetime

    batch = {
        "t": torch.randn(2, 3), "bf": torch.ones(3, dtype=torch.bfloat16), "dtype": torch.float16,
        "size": torch.Size([2, 3]), "dev": torch.device("cpu"), "np": np.arange(3),
        "obj": np.array(["a", None], dtype=object), "scalar": np.float32(1.5),
        "od": collections.OrderedDict(a=1), "dd": collections.defaultdict(list, {"k": [1]}),
        "dq": collections.deque([1, 2]), "c": collections.Counter("aab"), "s": {1, 2}, "fs": frozenset({3}),
        "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc), "big": 2**80, "cx": 1 + 2j,
        "param": torch.nn.Parameter(torch.ones(2)),
    }
    loaded = codec.decode(codec.encode_bytes(batch))
    assert loaded.keys() == batch.keys()
    assert loaded["dd"]["missing"] == [] and loaded["dtype"] is torch.float16
    assert isinstance(loaded["param"], torch.nn.Parameter)


def test_safe_loader_keeps_verl_dataproto() -> None:
    verl = pytest.importorskip("verl")

    proto = verl.DataProto.from_dict(
        tensors={"ids": torch.arange(6).reshape(2, 3)},
        non_tensors={"uid": np.array(["a", "b"], dtype=object)},
        meta_info={"global_step": 3},
    )
    loaded = codec.decode(codec.encode_bytes(proto))
    assert torch.equal(loaded.batch["ids"], proto.batch["ids"]) and loaded.meta_info == {"global_step": 3}


# ---------------------------------------------------------------------------------------- HMAC
KEY_ENV = "ROLLOUT_MOCK_TEST_KEY"


def test_hmac_refuses_files_changed_after_dumping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "secret-1")
    dump(tmp_path, steps=3, hmac_key_env=KEY_ENV)
    manifest = read_manifest(tmp_path)
    assert all(manifest.entry(s, step).hmac for s in manifest.stream_ids() for step in range(3))
    # a file changed after dumping: same size, CRC fixed in the manifest by the attacker
    path = tmp_path / "train" / "step_000001.pkl"
    data = bytearray(path.read_bytes())
    index = data.rindex((torch.arange(4) + 1).numpy().tobytes())
    data[index] ^= 0x7F
    replace_step(tmp_path, 1, bytes(data), fix_manifest=True)
    # ... and a malicious file, CRC fixed too
    marker = tmp_path / "PWNED"
    replace_step(tmp_path, 2, payloads(marker)["os.system"][0], fix_manifest=True)
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "hmac_key_env": KEY_ENV}
    with MockScheduler(None, config) as sched:
        assert torch.equal(sched.get_batch(None, global_step=0)["x"], torch.arange(4))
        with pytest.raises(CorruptStepError, match="HMAC signature does not match") as info:
            sched.get_batch(None, global_step=1)
        assert str(path) in str(info.value) and "step 1" in str(info.value)
        with pytest.raises(CorruptStepError, match="HMAC"):
            sched.get_batch(None, global_step=2)
    with MockScheduler(None, {**config, "trust_pickle": True}) as sched:
        sched.step = 2
        with pytest.raises(CorruptStepError, match="HMAC"):
            sched.get_batch(None)
    assert not marker.exists()
    # without a key, the per-chunk CRC-32s of format 2 (combined into the whole-file checksum
    # before any data is decoded) still notice this accidental-looking change (a deliberate
    # attacker would fix those CRCs too: that is what the key is for)
    with pytest.raises(CorruptStepError, match="CRC-32|checksum"):
        load_step(path)
    # a different key refuses even the untouched step
    monkeypatch.setenv(KEY_ENV, "secret-2")
    with MockScheduler(None, config) as sched, pytest.raises(CorruptStepError, match="HMAC"):
        sched.get_batch(None, global_step=0)
    assert load_step(tmp_path / "train" / "step_000000.pkl", hmac_key=b"secret-1")["x"].tolist() == [0, 1, 2, 3]


def test_hmac_key_configured_but_dump_unsigned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump(tmp_path)
    monkeypatch.setenv(KEY_ENV, "k")
    config = {"enable": True, "mode": "mock", "dump_dir": str(tmp_path), "hmac_key_env": KEY_ENV,
              "verify_checksum": False}
    with MockScheduler(None, config) as sched, pytest.raises(CorruptStepError, match="no HMAC signature"):
        sched.get_batch(None, global_step=0)
