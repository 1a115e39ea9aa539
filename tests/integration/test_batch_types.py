"""Every batch type a user's scheduler returns round-trips exactly through dump and mock mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg
from tensordict import TensorDict

from rollout_mock import MockScheduler, UnsafePickleError, load_step
from rollout_mock.storage.manifest import FORMAT_VERSION

ALL_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
]


class Returns:
    """A scheduler returning a fixed batch (built by the test)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def get_batch(self, data: Any, global_step: int) -> Any:
        return self.batch


def roundtrip(dump_dir: Path, batch: Any, **extra: Any) -> Any:
    with MockScheduler(Returns(batch), cfg(dump_dir, **extra)) as mock:
        assert mock.get_batch(None, 0) is batch
    with MockScheduler(None, cfg(dump_dir, "mock", **extra), spec=Returns) as mock:
        return mock.get_batch(None, 0)


def assert_tensor_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(a) is type(b)
    assert a.dtype == b.dtype and a.shape == b.shape and b.device.type == "cpu"
    assert not b.requires_grad and b.is_leaf  # a step holds data, not autograd state
    assert torch.equal(a.detach().cpu().contiguous().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8)) \
        if a.numel() else b.numel() == 0


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8)
    if dtype is torch.bool:
        return (raw[: int(np.prod(shape))] % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def test_dict_of_tensors_every_dtype(dump_dir: Path) -> None:
    batch = {str(dtype): random_tensor(dtype, (3, 5)) for dtype in ALL_DTYPES}
    batch["scalar"] = torch.tensor(2.5)
    batch["empty"] = torch.empty(0, 7, dtype=torch.bfloat16)
    batch["transposed"] = torch.randn(4, 6).t()
    batch["strided"] = torch.arange(100, dtype=torch.int64)[::7]
    batch["slice_of_big"] = torch.randn(1000, 8)[10:12]
    batch["grad"] = torch.randn(3, requires_grad=True)
    batch["param"] = torch.nn.Parameter(torch.randn(2, 2))
    batch["conj"] = torch.randn(3, dtype=torch.complex64).conj()
    replayed = roundtrip(dump_dir, batch)
    assert set(replayed) == set(batch)
    for key, tensor in batch.items():
        assert_tensor_equal(tensor.resolve_conj(), replayed[key])
    assert replayed["transposed"].is_contiguous()
    # only the slice's bytes are stored, not the 1000x8 storage it views
    assert (dump_dir / "train" / "step_000000.pkl").stat().st_size < 50_000


@pytest.mark.verl
def test_verl_dataproto_real_class(dump_dir: Path) -> None:
    from verl.protocol import DataProto

    proto = DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 32000, (8, 16)),
            "attention_mask": torch.ones(8, 16, dtype=torch.int64),
            "old_log_probs": torch.randn(8, 12),
            "bf16": torch.randn(8, 4).to(torch.bfloat16),
        },
        non_tensors={
            "uid": np.array([f"uid-{i // 2}" for i in range(8)], dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": f"q{i}"}] for i in range(8)] + [None], dtype=object)[:8],
        },
        meta_info={"global_step": 0, "temperature": 0.7, "eos_token_id": [1, 2]},
    )
    replayed = roundtrip(dump_dir, proto)
    assert type(replayed) is DataProto
    assert type(replayed.batch) is TensorDict
    assert replayed.batch.batch_size == proto.batch.batch_size
    for key in proto.batch.keys():
        assert_tensor_equal(proto.batch[key], replayed.batch[key])
    assert replayed.non_tensor_batch.keys() == proto.non_tensor_batch.keys()
    for key, array in proto.non_tensor_batch.items():
        assert replayed.non_tensor_batch[key].dtype == object
        assert replayed.non_tensor_batch[key].shape == array.shape
        assert list(replayed.non_tensor_batch[key]) == list(array)
    assert replayed.meta_info == proto.meta_info
    # DataProto's own API still works on the replayed object
    assert len(replayed.chunk(2)) == 2 and len(DataProto.concat([replayed, replayed])) == 16


def test_dataproto_like_with_dict_batch(dump_dir: Path) -> None:
    from rollout_mock.demo import RolloutBatch  # a registered user class

    batch = RolloutBatch(
        batch={"x": torch.randn(4, 2)},
        non_tensor_batch={"s": np.array(["a", "b", "c", "d"], dtype=object)},
        meta_info={"global_step": 0},
    )
    replayed = roundtrip(dump_dir, batch)
    assert type(replayed) is RolloutBatch
    assert torch.equal(replayed.batch["x"], batch.batch["x"])
    assert list(replayed.non_tensor_batch["s"]) == ["a", "b", "c", "d"]
    assert replayed.meta_info == {"global_step": 0}


def test_tensordict(dump_dir: Path) -> None:
    td = TensorDict(
        {"a": torch.randn(5, 3), "nested": TensorDict({"b": torch.arange(5)}, batch_size=[5])},
        batch_size=[5],
    )
    replayed = roundtrip(dump_dir, td)
    assert type(replayed) is TensorDict and replayed.batch_size == torch.Size([5])
    assert torch.equal(replayed["a"], td["a"]) and torch.equal(replayed["nested", "b"], td["nested", "b"])


def test_areal_trajectory_list_with_rejected(dump_dir: Path) -> None:
    def trajectory(group: int, length: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.randint(0, 100, (group, length), dtype=torch.int32),
            "loss_mask": torch.randint(0, 2, (group, length), dtype=torch.int32),
            "logprobs": torch.randn(group, length),
            "versions": torch.full((group, length), -1, dtype=torch.int32),
            "attention_mask": torch.ones(group, length, dtype=torch.bool),
            "rewards": torch.randn(group),
        }

    batch = [trajectory(4, 9), None, trajectory(2, 17), None]
    replayed = roundtrip(dump_dir, batch)
    assert [item is None for item in replayed] == [False, True, False, True]
    for original, item in zip(batch, replayed):
        if original is not None:
            for key in original:
                assert_tensor_equal(original[key], item[key])
    from rollout_mock.storage import open_dump

    dump = open_dump(dump_dir)
    entry = dump.entry(dump.streams()[0], 0)
    assert entry is not None and entry.samples == 4
    assert entry.keys["[*].input_ids"]["shape"] is None  # varies between trajectories
    assert entry.keys["[*].rewards"]["dtype"] == "float32"


def test_arbitrary_objects_need_trust(dump_dir: Path) -> None:
    class Local:
        def __init__(self) -> None:
            self.f = lambda x: x + 1

    batch = {"obj": Local(), "t": torch.ones(2)}
    with MockScheduler(Returns(batch), cfg(dump_dir)) as mock:
        mock.get_batch(None, 0)
    path = dump_dir / "train" / "step_000000.pkl"
    with pytest.raises(UnsafePickleError, match="trust"):
        load_step(path)
    loaded = load_step(path, trusted=True)
    assert loaded["obj"].f(1) == 2
    with MockScheduler(None, cfg(dump_dir, "mock", trust_pickle=True), spec=Returns) as mock:
        assert mock.get_batch(None, 0)["obj"].f(41) == 42


def test_manifest_describes_keys_without_unpickling(dump_dir: Path) -> None:
    roundtrip(dump_dir, {"input_ids": torch.zeros(6, 4, dtype=torch.int64), "uid": np.array(list("abcdef"), dtype=object)})
    import json

    manifest = json.loads((dump_dir / "manifest.json").read_text())
    entry = manifest["streams"]["train"]["steps"]["0"]
    assert entry["samples"] == 6
    assert entry["keys"]["input_ids"] == {"shape": [6, 4], "dtype": "int64"}
    assert entry["keys"]["uid"] == {"shape": [6], "dtype": "object"}
    assert entry["checksum"].startswith("crc32:") and entry["size"] == (dump_dir / entry["file"]).stat().st_size
    assert manifest["format_version"] == FORMAT_VERSION and manifest["streams"]["train"]["methods"]["get_batch"]["convention"] == "sync"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_saved_as_cpu(dump_dir: Path) -> None:
    batch = {"x": torch.randn(4, 4, device="cuda"), "bf": torch.randn(3, device="cuda").bfloat16()}
    replayed = roundtrip(dump_dir, batch)
    for key in batch:
        assert replayed[key].device.type == "cpu"
        assert torch.equal(replayed[key], batch[key].cpu())


class VerlWorkerGroup:
    """verl's shape: generate_sequences(prompts: DataProto), the trainer sets
    ``meta_info["global_steps"]`` (plural) on the batch it passes."""

    def __init__(self) -> None:
        self.calls = 0

    def generate_sequences(self, prompts: Any) -> Any:
        from verl.protocol import DataProto

        self.calls += 1
        step = prompts.meta_info["global_steps"]
        return DataProto.from_dict(
            tensors={"responses": torch.full((4, 3), step), "old_log_probs": torch.randn(4, 3)},
            meta_info={"global_steps": step},
        )


@pytest.mark.verl
def test_verl_generate_sequences_with_global_steps(dump_dir: Path) -> None:
    from verl.protocol import DataProto

    def prompts(step: int) -> DataProto:
        return DataProto.from_dict(tensors={"input_ids": torch.zeros(4, 2, dtype=torch.int64)},
                                   meta_info={"global_steps": step})

    real = VerlWorkerGroup()
    with MockScheduler(real, cfg(dump_dir), methods=("generate_sequences",)) as wg:
        recorded = {step: wg.generate_sequences(prompts(step)) for step in (1, 2, 3)}  # verl counts from 1
    assert sorted(p.name for p in (dump_dir / "train").iterdir() if p.suffix == ".pkl") == [
        "step_000001.pkl", "step_000002.pkl", "step_000003.pkl"]
    with MockScheduler(None, cfg(dump_dir, "mock"), methods=("generate_sequences",)) as wg:
        for step in (3, 1):  # served by the step the batch carries, not by call order
            out = wg.generate_sequences(prompts(step))
            assert torch.equal(out.batch["old_log_probs"], recorded[step].batch["old_log_probs"])
            assert int(out.batch["responses"][0, 0]) == step
