"""Oracle cases over verl's and tensordict's real classes (used by test_real_classes.py).

Each case builds a batch deterministically; the test dumps every case through a wrapped
scheduler, and a fresh interpreter (``python real_class_cases.py DUMP OUT``) rebuilds the same
batches, replays the dump with the safe loader (mock mode, no trust_pickle) and checks that each
replayed batch is the recorded one bit for bit (:func:`same`: classes, dtypes, values, keys and
their order, lock/consolidation state, ragged dimension, numpy scalar types) and that the
framework's own methods give the same results on both (:func:`exercise`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import struct
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

warnings.filterwarnings("ignore")
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict
from tensordict.base import is_tensor_collection
from verl.protocol import DataProto
from verl.utils import tensordict_utils as tu

CASES: dict[str, Callable[[], Any]] = {}


def case(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def register(build: Callable[[], Any]) -> Callable[[], Any]:
        CASES[name] = build
        return build
    return register


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def proto(n: int = 4, seed: int = 0, non_tensors: dict[str, Any] | None = None,
          meta: dict[str, Any] | None = None) -> DataProto:
    g = gen(seed)
    return DataProto.from_dict(
        tensors={"input_ids": torch.randint(0, 32000, (n, 6), generator=g),
                 "attention_mask": torch.ones(n, 6, dtype=torch.int64),
                 "old_log_probs": torch.randn(n, 6, generator=g)},
        non_tensors=non_tensors or {}, meta_info=meta or {})


def objarray(items: list[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        out[i] = x
    return out


# --------------------------------------------------------------------------- numpy scalars
SCALARS: dict[str, Callable[[int], Any]] = {
    "str_": lambda i: np.str_(f"uid-{i}"), "str_empty": lambda i: np.str_(""),
    "str_unicode": lambda i: np.str_(f"é中{i}🙂"), "bytes_": lambda i: np.bytes_(b"b\x00x%d" % i),
    "bytes_empty": lambda i: np.bytes_(b""), "int8": lambda i: np.int8(-i), "int16": lambda i: np.int16(300 * i),
    "int32": lambda i: np.int32(-70000 * i), "int64": lambda i: np.int64(2**40 + i),
    "uint8": lambda i: np.uint8(250 + i), "uint16": lambda i: np.uint16(65000 + i),
    "uint32": lambda i: np.uint32(2**31 + i), "uint64": lambda i: np.uint64(2**63 + i),
    "float16": lambda i: np.float16(0.1 * i), "float32": lambda i: np.float32(1 / 3 + i),
    "float64": lambda i: np.float64(-0.0 if i == 0 else math.pi * i), "nan32": lambda i: np.float32("nan"),
    "bool_": lambda i: np.bool_(i % 2), "complex64": lambda i: np.complex64(1 + 2j * i),
    "complex128": lambda i: np.complex128(-1.5 + 0.25j * i),
    "datetime64": lambda i: np.datetime64("2024-01-01T00:00:00", "ns") + np.timedelta64(i, "s"),
    "timedelta64": lambda i: np.timedelta64(i, "ms"),
    "longdouble": lambda i: np.longdouble(1) / np.longdouble(3 + i),
    "clongdouble": lambda i: np.clongdouble(complex(i, -1)) / np.longdouble(7),
}


def _scalar_in_objarray(name: str) -> Callable[[], Any]:
    return lambda: proto(non_tensors={"v": objarray([SCALARS[name](i) for i in range(4)]),
                                      "uid": np.array([f"u{i}" for i in range(4)], dtype=object)})


def _scalar_in_meta(name: str) -> Callable[[], Any]:
    return lambda: proto(meta={"value": SCALARS[name](3), "nested": {"list": [SCALARS[name](1), 2]}})


for _name in SCALARS:
    case(f"objarray-{_name}")(_scalar_in_objarray(_name))
for _name in ("str_", "bytes_", "int64", "float32", "bool_", "uint64", "datetime64", "str_unicode"):
    case(f"meta-{_name}")(_scalar_in_meta(_name))


@case("objarray-tolist-pattern")
def _tolist() -> Any:
    """verl builds uids and prompts from numpy string arrays: list(arr) items are np.str_."""
    texts = np.array(["prompt a", "prompt bb", "c", ""])
    return proto(non_tensors={"raw_prompt": np.array(list(texts), dtype=object),
                              "uid": objarray(list(np.array(["x", "y", "z", "w"])))})


@case("objarray-mixed-scalars")
def _mixed() -> Any:
    return proto(non_tensors={"m": objarray([np.str_("a"), np.int64(1), np.bytes_(b"z"), None])})


@case("objarray-2d-np-str")
def _obj2d() -> Any:
    arr = np.empty((4, 2), dtype=object)
    for i in range(4):
        arr[i, 0], arr[i, 1] = np.str_(f"r{i}"), np.float64(i)
    return proto(non_tensors={"pairs": arr})


@case("objarray-nested-containers")
def _obj_nested() -> Any:
    return proto(non_tensors={
        "turn_scores": objarray([[], [np.float32(0.5), 0.8], [0.9], [np.float64(1.0)]]),
        "messages": objarray([[{"role": np.str_("user"), "content": f"q{i}"}] for i in range(4)]),
        "tools": objarray([{"name": "t", "args": (1, np.int32(2))}] * 4)})


@case("meta-nested-structures")
def _meta_nested() -> Any:
    return proto(meta={"global_steps": 3, "temperature": np.float32(0.7), "eos": [np.int64(2), 151643],
                       "timing": {"gen": 1.25, "ref": {"inner": np.float64(0.5)}}, "flags": (True, np.bool_(False)),
                       np.str_("np_key"): "v", "arr": np.arange(3, dtype=np.int16), "strs": np.array(["a", "bc"]),
                       "objs": objarray(["a", np.str_("b")]), "none": None, "nan": float("nan")})


@case("verl-uid-np-str-from-uuid-pattern")
def _uids() -> Any:
    uids = np.array([f"{i:08x}" for i in range(4)], dtype=object)
    repeated = np.repeat(np.array([str(u) for u in uids]), 2)  # '<U8' -> list of np.str_
    return proto(n=8, non_tensors={"uid": np.array(list(repeated), dtype=object)})


# --------------------------------------------------------------------------- NonTensorData / Stack
NONTENSOR_VALUES: dict[str, Callable[[], Any]] = {
    "str": lambda: "hello", "int": lambda: 7, "float": lambda: 0.25, "none": lambda: None,
    "dict": lambda: {"a": [1, 2], "b": {"c": "d"}}, "list": lambda: [1, "x", None],
    "np-str": lambda: np.str_("q"), "np-int": lambda: np.int64(5),
    "tensor": lambda: torch.arange(3, dtype=torch.int16), "ndarray": lambda: np.arange(4, dtype=np.float32),
}
for _name, _value in NONTENSOR_VALUES.items():
    case(f"nontensordata-{_name}")(lambda v=_value: NonTensorData(v()))


@case("nontensordata-batch-size")
def _ntd_bs() -> Any:
    return NonTensorData("shared", batch_size=[3])


@case("nontensordata-locked")
def _ntd_locked() -> Any:
    return NonTensorData({"k": 1}).lock_()


STACKS: dict[str, Callable[[], Any]] = {
    "strs": lambda: ["a", "b", "c", "d"], "ints": lambda: [1, 2, 3, 4],
    "turn-scores": lambda: [[], [0.5, 0.8], [0.9], [1.0, 0.0, 0.5]],
    "dicts": lambda: [{"acc": 1.0}, {"acc": 0.0}, {"acc": 0.5}, {"acc": 1.0}],
    "messages": lambda: [[{"role": "user", "content": f"m{i}"}] for i in range(4)],
    "np-strs": lambda: list(np.array(["w", "x", "y", "z"])),
    "nested-lists": lambda: [[1, 2], [3], [4, 5, 6], []],
}
for _name, _items in STACKS.items():
    case(f"nontensorstack-{_name}")(lambda f=_items: NonTensorStack.from_list([NonTensorData(x) for x in f()]))
    case(f"nontensorstack-from-list-{_name}")(lambda f=_items: NonTensorStack.from_list(f()))


@case("nontensorstack-locked")
def _nts_locked() -> Any:
    return NonTensorStack.from_list(["a", "b"]).lock_()


@case("lazystack-dim0")
def _lazy0() -> Any:
    g = gen(5)
    return LazyStackedTensorDict(*[TensorDict({"a": torch.randn(3, generator=g)}, [3]) for _ in range(2)], stack_dim=0)


@case("lazystack-dim1")
def _lazy1() -> Any:
    g = gen(6)
    return LazyStackedTensorDict(*[TensorDict({"a": torch.randn(3, generator=g)}, [3]) for _ in range(2)], stack_dim=1)


# --------------------------------------------------------------------------- verl TensorDict path
def _verl_td(seed: int, **non_tensors: Any) -> Any:
    p = proto(seed=seed, non_tensors={"uid": np.array([f"u{i}" for i in range(4)], dtype=object), **non_tensors},
              meta={"global_steps": seed, "temperature": 1.0})
    return p.to_tensordict()


case("verl-to-tensordict")(lambda: _verl_td(1))
case("verl-to-tensordict-turn-scores")(lambda: _verl_td(2, turn_scores=objarray([[], [0.5], [0.1, 0.2], [1.0]])))
case("verl-to-tensordict-prompts")(lambda: _verl_td(3, raw_prompt=objarray([[{"role": "user", "content": f"p{i}"}]
                                                                           for i in range(4)])))
case("verl-to-tensordict-np-str")(lambda: _verl_td(4, data_source=np.array(list(np.array(["a", "b", "a", "c"])),
                                                                          dtype=object)))
case("verl-to-tensordict-locked")(lambda: _verl_td(5).lock_())


@case("verl-get-tensordict-nested")
def _get_td() -> Any:
    g = gen(7)
    ids = tu.nested_tensor_from_tensor_list([torch.randint(0, 9, (n,), generator=g) for n in (3, 5, 2)])
    return tu.get_tensordict({"input_ids": ids, "turn_scores": [[], [0.5, 0.8], [0.9]], "obs": torch.randn(3, 4, generator=g)},
                             {"experiment": "test", "step": 3})


@case("verl-assign-non-tensor")
def _assign() -> Any:
    td = TensorDict({"obs": torch.arange(3)}, [3])
    tu.assign_non_tensor(td, uid=["a", "b", "c"], note="meta", cfg={"lr": 1e-6})
    return td


@case("dataproto-with-tensordict-in-meta")
def _meta_td() -> Any:
    return proto(meta={"extra": _verl_td(8)})


# --------------------------------------------------------------------------- TensorDict state
def _td(seed: int, n: int = 4) -> TensorDict:
    g = gen(seed)
    return TensorDict({"a": torch.randn(n, 3, generator=g), "b": torch.randint(0, 5, (n,), generator=g),
                       "sub": TensorDict({"c": torch.randn(n, 2, generator=g)}, [n])}, [n])


case("td-plain")(lambda: _td(10))
case("td-locked")(lambda: _td(11).lock_())
case("td-consolidated")(lambda: _td(12).consolidate())
case("td-consolidated-bf16")(lambda: TensorDict({"x": torch.randn(4, 2, generator=gen(13)).bfloat16(),
                                                 "y": torch.arange(4)}, [4]).consolidate())
case("td-sub-locked-only")(lambda: TensorDict({"a": torch.zeros(2), "sub": TensorDict({"c": torch.ones(2)}, [2]).lock_()}, [2]))
case("td-locked-then-unlocked")(lambda: _td(14).lock_().unlock_())
case("td-names")(lambda: TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=["batch", "time"]))
case("td-names-partial")(lambda: TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=["batch", None]))
case("td-batch-2d")(lambda: TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3]))
case("td-batch-empty")(lambda: TensorDict({"x": torch.arange(6)}, []))
case("td-device-cpu")(lambda: TensorDict({"x": torch.arange(3)}, [3], device="cpu"))
case("td-device-cpu-locked")(lambda: TensorDict({"x": torch.arange(3)}, [3], device="cpu").lock_())
case("td-empty")(lambda: TensorDict({}, [0]))
case("td-nontensor-locked")(lambda: TensorDict({"x": torch.arange(2), "m": NonTensorData("v")}, [2]).lock_())


case("td-consolidated-nontensor")(lambda: TensorDict({"x": torch.arange(3), "m": NonTensorData("v"),
                                                      "uid": NonTensorStack.from_list(["a", "b", "c"])}, [3]).consolidate())
case("td-consolidated-nested-sub")(lambda: TensorDict({"x": torch.arange(3.), "s": TensorDict({"y": torch.ones(3, 2)}, [3])},
                                                      [3]).consolidate())
case("td-consolidated-njt")(lambda: TensorDict({"ids": torch.nested.nested_tensor([torch.arange(n) for n in (2, 3)],
                                                                                   layout=torch.jagged),
                                                 "r": torch.zeros(2)}, [2]).consolidate())
case("verl-meta-only-tensordict")(lambda: tu.get_tensordict({}, {"global_steps": 3, "name": "x"}))


@case("objarray-multimodal-dicts")
def _multimodal() -> Any:
    g = gen(22)
    return proto(non_tensors={"multi_modal_inputs": objarray([{"pixel_values": torch.randn(2, 3, generator=g),
                                                                "image_grid_thw": np.array([[1, 2, 2]])}
                                                               for _ in range(4)])})


@case("dataproto-locked-batch")
def _dp_locked() -> Any:
    p = proto(seed=20)
    p.batch.lock_()
    return p


@case("dataproto-consolidated-batch")
def _dp_cons() -> Any:
    p = proto(seed=21, non_tensors={"uid": objarray([np.str_(f"u{i}") for i in range(4)])})
    p.batch = p.batch.consolidate()
    return p


# --------------------------------------------------------------------------- nested tensors
def _parts(seed: int, lengths: list[int], tail: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = gen(seed)
    return [torch.randn(n, *tail, generator=g).to(dtype) for n in lengths]


case("njt-2d")(lambda: torch.nested.nested_tensor(_parts(30, [3, 5, 1]), layout=torch.jagged))
case("njt-3d")(lambda: torch.nested.nested_tensor(_parts(31, [3, 2], (4,)), layout=torch.jagged))
case("njt-4d")(lambda: torch.nested.nested_tensor(_parts(32, [2, 5], (3, 2)), layout=torch.jagged))
case("njt-3d-equal-lengths")(lambda: torch.nested.nested_tensor(_parts(33, [4, 4], (5,)), layout=torch.jagged))
case("njt-bf16")(lambda: torch.nested.nested_tensor(_parts(34, [2, 3], dtype=torch.bfloat16), layout=torch.jagged))
case("njt-int64")(lambda: torch.nested.nested_tensor([torch.arange(n) for n in (1, 4, 2)], layout=torch.jagged))
case("njt-ragged2-equal-verl")(lambda: tu.nested_tensor_from_tensor_list(
    [torch.arange(8.).reshape(4, 2) + i for i in range(3)], ragged_idx=2))
case("njt-ragged2-unequal-verl")(lambda: tu.nested_tensor_from_tensor_list(
    [torch.arange(4. * n).reshape(4, n) for n in (2, 5, 3)], ragged_idx=2))
case("njt-ragged2-jagged-dim")(lambda: torch.nested.nested_tensor_from_jagged(
    torch.randn(3, 7, generator=gen(35)), torch.tensor([0, 2, 7]), jagged_dim=2))
case("njt-transposed")(lambda: torch.nested.nested_tensor(_parts(36, [3, 2], (4,)), layout=torch.jagged).transpose(1, 2))
case("njt-holes")(lambda: torch.nested.nested_tensor_from_jagged(
    torch.arange(10.), torch.tensor([0, 3, 7, 10]), lengths=torch.tensor([2, 3, 1])))
case("njt-seqlen-cached")(lambda: torch.nested.nested_tensor_from_jagged(
    torch.arange(6.), torch.tensor([0, 2, 6]), min_seqlen=2, max_seqlen=4))
case("njt-in-dict")(lambda: {"input_ids": torch.nested.nested_tensor([torch.arange(n) for n in (2, 3)], layout=torch.jagged),
                             "reward": torch.tensor([1.0, 0.0])})
case("njt-in-tensordict")(lambda: TensorDict({"ids": torch.nested.nested_tensor([torch.arange(n) for n in (2, 3)],
                                                                                layout=torch.jagged),
                                               "r": torch.zeros(2)}, [2]))
case("njt-mrope-position-ids")(lambda: tu.get_tensordict({"position_ids": tu.nested_tensor_from_tensor_list(
    [torch.arange(4 * n).reshape(4, n) for n in (3, 5)], ragged_idx=2), "r": torch.zeros(2)}))
case("njt-requires-grad")(lambda: torch.nested.nested_tensor(_parts(37, [2, 3], (2,)), layout=torch.jagged,
                                                              requires_grad=True))
case("njt-ragged2-in-dataproto-meta")(lambda: proto(meta={"pos": tu.nested_tensor_from_tensor_list(
    [torch.arange(4 * n).reshape(4, n) for n in (2, 2, 2, 2)], ragged_idx=2)}))
case("nested-strided-2d")(lambda: torch.nested.nested_tensor(_parts(40, [3, 5])))
case("nested-strided-3d")(lambda: torch.nested.nested_tensor(_parts(41, [2, 4], (3,))))
case("nested-strided-in-dict")(lambda: {"x": torch.nested.nested_tensor(_parts(42, [1, 2])), "y": torch.ones(2)})


# --------------------------------------------------------------------------- verl protocol shapes
@case("dataproto-from-dict")
def _dp_plain() -> Any:
    return proto(seed=50, non_tensors={"labels": np.array(["a", "b", "c", "d"], dtype=object)},
                 meta={"name": "abdce"})


@case("dataproto-from-single-dict")
def _dp_single() -> Any:
    g = gen(51)
    return DataProto.from_single_dict({"obs": torch.randn(4, 2, generator=g), "labels": np.array(list("abcd"), dtype=object)},
                                      meta_info={"k": np.int32(1)})


@case("dataproto-non-tensor-only")
def _dp_nt_only() -> Any:
    return DataProto.from_dict(non_tensors={"uid": objarray([np.str_(c) for c in "abc"])}, meta_info={"n": 3})


@case("dataproto-concat")
def _dp_concat() -> Any:
    return DataProto.concat([proto(seed=52, non_tensors={"u": objarray([np.str_("a")] * 4)}),
                             proto(seed=53, non_tensors={"u": objarray([np.str_("b")] * 4)})])


@case("dataproto-chunk")
def _dp_chunk() -> Any:
    return proto(n=8, seed=54, non_tensors={"u": objarray([np.str_(str(i)) for i in range(8)])}).chunk(2)[1]


@case("dataproto-repeat-interleave")
def _dp_repeat() -> Any:
    return proto(seed=55, non_tensors={"u": objarray([np.str_(str(i)) for i in range(4)])}).repeat(2, interleave=True)


@case("dataproto-select-idxs")
def _dp_sel() -> Any:
    return proto(seed=56, non_tensors={"u": objarray([np.str_(str(i)) for i in range(4)])}).select_idxs([3, 1])


@case("dataproto-padded")
def _dp_pad() -> Any:
    from verl.protocol import pad_dataproto_to_divisor

    return pad_dataproto_to_divisor(proto(n=3, seed=57, non_tensors={"u": objarray(list(np.array(["a", "b", "c"])))}), 4)[0]


@case("dataproto-union")
def _dp_union() -> Any:
    a = proto(seed=58)
    b = DataProto.from_dict(tensors={"values": torch.randn(4, 6, generator=gen(59))},
                            non_tensors={"uid": objarray([np.str_(str(i)) for i in range(4)])}, meta_info={"x": 1})
    return a.union(b)


@case("dataproto-bf16-and-bool")
def _dp_dtypes() -> Any:
    g = gen(60)
    return DataProto.from_dict(tensors={"lp": torch.randn(4, 3, generator=g).bfloat16(), "mask": torch.rand(4, 3, generator=g) > 0.5,
                                        "r": torch.randn(4, generator=g).half()}, meta_info={"dtype": torch.bfloat16})


@case("dataproto-list-of-protos")
def _dp_list() -> Any:
    return [proto(seed=61, meta={"domain": np.str_("math")}), proto(seed=62, meta={"domain": np.str_("code")})]


# --------------------------------------------------------------------------- comparison
def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same(a: Any, b: Any, path: str = "batch") -> None:
    """``b`` (replayed) is ``a`` (recorded) bit for bit; AssertionError naming the place if not."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        return _same_tensor(a, b, path)
    if isinstance(a, DataProto) or dataclasses.is_dataclass(a):
        assert list(vars(a)) == list(vars(b)), f"{path}: attributes {list(vars(a))} != {list(vars(b))}"
        for name in vars(a):
            same(getattr(a, name), getattr(b, name), f"{path}.{name}")
        return None
    if is_tensor_collection(a):
        return _same_collection(a, b, path)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        if a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.reshape(-1), b.reshape(-1))):
                same(x, y, f"{path}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), f"{path}: array bytes differ"
        return None
    if isinstance(a, np.generic):
        assert a.dtype.str == b.dtype.str and a.tobytes() == b.tobytes(), f"{path}: {a!r} != {b!r}"
        return None
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(k, list(b)[list(a).index(k)], f"{path} key {k!r}")
            same(a[k], b[k], f"{path}[{k!r}]")
        return None
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
        return None
    if isinstance(a, float):
        assert _bits(a) == _bits(b), f"{path}: {a!r} != {b!r}"
        return None
    assert a == b, f"{path}: {a!r} != {b!r}"
    return None


def _shape_pattern(t: torch.Tensor) -> list[Any]:
    return [s if isinstance(s, int) else "j" for s in t.shape]


def _same_tensor(a: torch.Tensor, b: torch.Tensor, path: str) -> None:
    assert a.layout == b.layout and a.is_nested == b.is_nested, f"{path}: layout {a.layout} != {b.layout}"
    assert a.dtype == b.dtype and b.device.type == "cpu", f"{path}: dtype {a.dtype} != {b.dtype}"
    assert not b.requires_grad and b.is_leaf, f"{path}: replayed with autograd state (a step holds data)"
    if a.is_nested and a.layout is torch.jagged:
        assert a._ragged_idx == b._ragged_idx, f"{path}: ragged dimension {a._ragged_idx} != {b._ragged_idx}"
        assert a.is_contiguous() == b.is_contiguous(), f"{path}: contiguity differs"
        assert _shape_pattern(a) == _shape_pattern(b), f"{path}: shape {a.shape} != {b.shape}"
        same(a.values().contiguous(), b.values().contiguous(), f"{path}.values()")
        same(a.offsets(), b.offsets(), f"{path}.offsets()")
        same(a.lengths(), b.lengths(), f"{path}.lengths()")
        return
    if a.is_nested:
        assert a.size(0) == b.size(0) and a.dim() == b.dim(), f"{path}: nested sizes differ"
        for i, (x, y) in enumerate(zip(a.unbind(), b.unbind())):
            same(x, y, f"{path}[{i}]")
        return
    assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
    assert a.is_contiguous() == b.is_contiguous(), f"{path}: contiguity differs"
    raw_a = a.detach().clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)
    raw_b = b.detach().clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)
    assert torch.equal(raw_a, raw_b), f"{path}: tensor bytes differ"


def _same_collection(a: Any, b: Any, path: str) -> None:
    assert a.batch_size == b.batch_size, f"{path}: batch_size {a.batch_size} != {b.batch_size}"
    assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
    assert a.is_locked == b.is_locked, f"{path}: locked {a.is_locked} came back {b.is_locked}"
    if isinstance(a, NonTensorData):
        return same(a.data, b.data, f"{path}.data")
    if isinstance(a, LazyStackedTensorDict):
        assert a.stack_dim == b.stack_dim and len(a.tensordicts) == len(b.tensordicts), f"{path}: stack differs"
        for i, (x, y) in enumerate(zip(a.tensordicts, b.tensordicts)):
            same(x, y, f"{path}.tensordicts[{i}]")
        return None
    if isinstance(a, TensorDict):
        assert a.is_consolidated() == b.is_consolidated(), f"{path}: consolidated {a.is_consolidated()} came back " \
                                                           f"{b.is_consolidated()}"
        assert a._has_names() == b._has_names() and (not a._has_names() or a.names == b.names), f"{path}: names differ"
    assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a.keys())} != {list(b.keys())}"
    for key in a.keys():  # noqa: SIM118 - a TensorDict iterates its keys only through keys()
        same(a.get(key), b.get(key), f"{path}[{key!r}]")
    return None


# --------------------------------------------------------------------------- framework methods
def _ops(x: Any) -> dict[str, Callable[[Any], Any]]:
    if isinstance(x, DataProto):
        n = len(x)
        ops: dict[str, Callable[[Any], Any]] = {
            "concat": lambda p: DataProto.concat([p, p]), "slice": lambda p: p[0:max(n - 1, 1)],
            "slice-method": lambda p: p.slice(0, n, 2), "union-self": lambda p: p.union(copy.deepcopy(p)),
            "repeat": lambda p: p.repeat(2, interleave=False), "select-idxs": lambda p: p.select_idxs([0]),
            "deepcopy": copy.deepcopy, "item": lambda p: p[0],
        }
        if x.batch is not None:
            keys = list(x.batch.keys())[:1]
            ops["select"] = lambda p: p.select(batch_keys=keys, non_tensor_batch_keys=list(p.non_tensor_batch)[:1])
            ops["pop"] = lambda p: (copy.deepcopy(p).pop(batch_keys=keys), )
            ops["to-tensordict"] = lambda p: p.to_tensordict()
            ops["from-tensordict"] = lambda p: DataProto.from_tensordict(p.to_tensordict())
        if n and n % 2 == 0:
            ops["chunk"] = lambda p: p.chunk(2)
        return ops
    if isinstance(x, list):
        return {"concat": lambda ps: DataProto.concat(ps)} if all(isinstance(p, DataProto) for p in x) else {}
    if isinstance(x, NonTensorData):
        return {"data": lambda t: t.data, "tolist": lambda t: t.tolist(), "clone": lambda t: t.clone()}
    if isinstance(x, NonTensorStack):
        return {"tolist": lambda t: t.tolist(), "first": lambda t: t[0], "clone": lambda t: t.clone(),
                "stack": lambda t: torch.stack([t, t])}
    if is_tensor_collection(x):
        ops = {"clone": lambda t: t.clone(), "to-dict": lambda t: t.to_dict(), "keys": lambda t: list(t.keys(True, True)),
               "set-new-key": _set_new_key, "apply": lambda t: t.apply(lambda v: v * 2 if not v.is_nested else v)}
        if len(x.batch_size) and x.batch_size[0] > 0:
            ops["rows"] = lambda t: t[0:1]
            ops["cat"] = lambda t: torch.cat([t, t])
            ops["verl-chunk"] = lambda t: tu.chunk_tensordict(t, 1) if isinstance(t, TensorDict) else None
            ops["verl-concat"] = lambda t: tu.concat_tensordict([t, t]) if isinstance(t, TensorDict) else None
        if isinstance(x, TensorDict):
            ops["consolidate"] = lambda t: t.consolidate()
            ops["from-tensordict"] = lambda t: DataProto.from_tensordict(t) if len(t.batch_size) == 1 else None
        return ops
    if isinstance(x, torch.Tensor) and x.is_nested:
        ops = {"unbind": lambda t: t.unbind(), "plus-one": lambda t: t + 1, "clone": lambda t: t.clone()}
        if x.layout is torch.jagged:
            ops["padded"] = lambda t: t.to_padded_tensor(0.0)
            ops["verl-concat"] = lambda t: tu.concat_nested_tensors([t, t])
        return ops
    if isinstance(x, dict):
        return {"deepcopy": copy.deepcopy}
    return {}


def _set_new_key(t: Any) -> Any:
    # on the object itself: a locked one must refuse, like the recorded one
    t.set("__new_key__", torch.zeros(t.batch_size))
    return sorted(t.keys())


def _outcome(op: Callable[[Any], Any], x: Any) -> tuple[str, Any]:
    try:
        return "ok", op(x)
    except Exception as exc:  # noqa: BLE001 - the op must fail the same way on both
        return "raised", type(exc).__name__


def exercise(recorded: Any, replayed: Any) -> list[str]:
    """Run the framework's methods on both; returns the names of the methods run."""
    names = []
    for name, op in _ops(recorded).items():
        expected = _outcome(op, recorded)
        got = _outcome(op, replayed)
        assert expected[0] == got[0], f"{name}: recorded {expected}, replayed {got}"
        if expected[0] == "ok":
            same(expected[1], got[1], f"{name}()")
        else:
            assert expected[1] == got[1], f"{name}: raised {expected[1]} on the recording, {got[1]} on the replay"
        names.append(name)
    return names


# --------------------------------------------------------------------------- the fresh replay
class Returns:
    """The wrapped scheduler: returns the batch its test gave it."""

    def __init__(self, batches: dict[int, Any] | None = None) -> None:
        self.batches = batches or {}

    def get_batch(self, data: Any, global_step: int) -> Any:
        return self.batches[global_step]


def replay_all(dump_dir: str, out: str) -> None:
    """Replay every case with the safe loader, compare and exercise; write the results."""
    from rollout_mock import MockScheduler

    results: dict[str, str] = {}
    config = {"enable": True, "mode": "mock", "dump_dir": dump_dir, "trust_pickle": False}
    with MockScheduler(None, config, spec=Returns) as mock:
        for step, (name, build) in enumerate(CASES.items()):
            try:
                recorded = build()
                replayed = mock.get_batch(None, step)
                same(recorded, replayed)
                exercise(build(), replayed)
                results[name] = "ok"
            except BaseException as exc:  # noqa: BLE001 - reported per case
                results[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    replay_all(sys.argv[1], sys.argv[2])
