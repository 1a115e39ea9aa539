"""Test double for ROLL's roll.distributed.scheduler.protocol.DataProto (ROLL v0.3.0+, read at
alibaba/ROLL 8eb27cc2). Own code; only what matters to dump/replay (no RemoteBatch backend).

Faithful: plain class (NOT a dataclass); storage ``_batch`` (TensorDict|None), ``_non_tensor_batch``
(dict[str, np.ndarray dtype=object]), ``_remote_batch`` (always None here), public ``meta_info``.
``.batch`` / ``.non_tensor_batch`` are properties returning a NEW BatchProxy per access: len() ->
TypeError, list() -> KeyError "Key '0' ...", no .values(), keys() is a set, items() a generator,
.batch_size/.shape only over a TensorDict (else AttributeError "'BatchProxy' object has no attribute
'batch_size'"), not a dict/Mapping, == is identity, ``dp.batch is None`` always False; dict(proxy)
works. Pickle state = (io.BytesIO(torch.save(_batch)), _non_tensor_batch, _remote_batch, meta_info)
(v0.2.x: 3-tuple + @dataclass). concat returns data[0] itself when len==1; meta_info from rank 0
except global_keys (default {"metrics"}) aggregated. Cross-checked: real ROLL loads this double's
pickles and vice versa.

Install at the real module path (so pickles name roll.distributed.scheduler.protocol.DataProto):
    spec = importlib.util.spec_from_file_location("_rp", ".../roll_protocol.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    m.install_as_roll(tmp_path); monkeypatch.syspath_prepend(str(tmp_path))
    from roll.distributed.scheduler.protocol import DataProto  # drop roll* from sys.modules after
"""
import io
import shutil
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict


def _obj_array(values):
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


class BatchProxy:
    """Stand-in for roll.distributed.scheduler.remote_protocol.BatchProxy (local part only)."""
    def __init__(self, batch, remote_batch, batch_size: int):
        assert batch is None or isinstance(batch, (TensorDict, dict))
        self._batch, self._remote_batch, self._batch_size = batch, remote_batch, batch_size
    def __getitem__(self, key):  # int keys -> KeyError, so list(proxy) raises KeyError "Key '0' ..."
        if self._batch is not None and key in self._batch:
            return self._batch[key]
        raise KeyError(f"Key '{key}' not found in batch or remote_batch")
    def __setitem__(self, key, value):
        assert isinstance(value, (torch.Tensor, np.ndarray))
        if self._batch is None:
            raise RuntimeError("Cannot set item when batch is None")
        assert len(value) == self._batch_size, f"Value length {len(value)} does not match batch length {self._batch_size}"
        self._batch[key] = value
    def __delitem__(self, key):
        self[key]  # raises KeyError like ROLL
        del self._batch[key]
    def __contains__(self, key):
        return self._batch is not None and key in self._batch
    def copy(self):
        return BatchProxy(self._batch.copy() if self._batch is not None else None, None, self._batch_size)
    def get(self, key, default=None):
        return self[key] if key in self else default
    def keys(self):  # a set, like ROLL (order not preserved)
        return set(self._batch.keys()) if self._batch is not None else set()
    def items(self):
        if self._batch is not None:
            for key in list(self._batch.keys()):
                yield key, self._batch[key]
    _SENTINEL = object()
    def pop(self, key, default=_SENTINEL):
        if key not in self and default is not BatchProxy._SENTINEL:
            return default
        res = self[key]  # KeyError if missing and no default
        del self._batch[key]
        return res
    def update(self, other: dict):
        assert isinstance(other, dict)
        assert self._batch is not None, "Update with batch is None is not supported, use DataProto.update insted."
        self._batch.update(other)
    def __getattr__(self, name):  # everything else (values, __len__ via getattr, ...) is refused
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
    @property
    def batch_size(self):
        if isinstance(self._batch, TensorDict):
            return self._batch.batch_size
        raise AttributeError("batch_size")  # falls through to __getattr__'s generic message, as in ROLL
    shape = property(lambda self: self.batch_size)  # same rule as batch_size




class DataProto:
    def __init__(self, batch=None, non_tensor_batch=None, remote_batch=None, meta_info=None):
        assert remote_batch is None, "remote batches are not modelled by this double"
        self._batch = batch
        self._non_tensor_batch = non_tensor_batch if non_tensor_batch is not None else {}
        self._remote_batch = None
        self.meta_info = meta_info if meta_info is not None else {}
        self.check_consistency()

    batch = property(lambda self: BatchProxy(self._batch, self._remote_batch, len(self)))
    non_tensor_batch = property(lambda self: BatchProxy(self._non_tensor_batch, self._remote_batch, len(self)))

    def _set(self, attr, value):  # ROLL assigns first, then asserts (a failed set leaves it assigned)
        setattr(self, attr, value._batch if isinstance(value, BatchProxy) else value.copy())
        self.check_consistency()

    batch = batch.setter(lambda self, v: self._set("_batch", v))
    non_tensor_batch = non_tensor_batch.setter(lambda self, v: self._set("_non_tensor_batch", v))

    def __len__(self):
        if self._batch is not None:
            return len(self._batch)
        return len(next(iter(self._non_tensor_batch.values()))) if self._non_tensor_batch else 0

    def __getitem__(self, item):
        if isinstance(item, str):
            if self._batch is not None and item in self._batch.keys():
                return self._batch[item]
            if item in self._non_tensor_batch:
                return self._non_tensor_batch[item]
            raise KeyError(f"Key '{item}' not found in batch or remote_batch")
        raise TypeError(f"Indexing with {type(item)} is not supported by the double")

    def __getstate__(self):
        buffer = io.BytesIO()
        if self._batch is not None:
            self._batch = self._batch.contiguous().consolidate()  # ROLL mutates self here too
        torch.save(self._batch, buffer)
        return buffer, self._non_tensor_batch, self._remote_batch, self.meta_info

    def __setstate__(self, data):
        buffer, non_tensor_batch, remote_batch, meta_info = data  # exactly 4 (v0.3.0)
        buffer.seek(0)
        self._batch = torch.load(buffer, weights_only=False, map_location="cpu")
        self._non_tensor_batch, self._remote_batch, self.meta_info = non_tensor_batch, remote_batch, meta_info

    def check_consistency(self):
        if self._batch is not None:
            assert len(self._batch.batch_size) == 1, "only support num_batch_dims=1"
        if self._non_tensor_batch:
            assert len(self._batch.batch_size) == 1  # AttributeError when _batch is None, as in ROLL
            assert set(self._batch.keys()).isdisjoint(self._non_tensor_batch.keys())
            for key, val in self._non_tensor_batch.items():
                assert isinstance(val, np.ndarray) and val.dtype == object, \
                    "data in the non_tensor_batch must be a numpy.array with dtype=object"
                assert val.shape[0] == self._batch.batch_size[0], f"key {key} length mismatch"

    @classmethod
    def from_single_dict(cls, data, meta_info=None):
        return cls.from_dict({k: v for k, v in data.items() if isinstance(v, torch.Tensor)},
                             {k: v for k, v in data.items() if isinstance(v, np.ndarray)}, meta_info)

    @classmethod
    def from_dict(cls, tensors, non_tensors=None, meta_info=None):
        assert len(tensors) > 0, "tensors must not be empty"
        bs = next(iter(tensors.values())).shape[:1]
        nt = {k: _obj_array(v) for k, v in (non_tensors or {}).items()}
        return cls(batch=TensorDict(source=tensors, batch_size=bs), non_tensor_batch=nt, meta_info=meta_info or {})

    def chunk(self, chunks: int):
        sizes = [len(b) for b in np.array_split(np.arange(len(self)), chunks)]
        starts = np.cumsum([0] + sizes[:-1])
        return [DataProto(batch=self._batch[s:s + n].clone() if self._batch is not None else None,
                          non_tensor_batch={k: v[s:s + n] for k, v in self._non_tensor_batch.items()},
                          meta_info=self.meta_info) for s, n in zip(starts.tolist(), sizes)]

    @staticmethod
    def concat(data, *, global_keys=None):
        if len(data) == 1:
            return data[0]  # same object, like ROLL
        global_keys = global_keys if global_keys is not None else {"metrics"}
        batches = [d._batch for d in data if d._batch is not None]
        new_batch = torch.cat(batches, dim=0) if batches else None
        nt = {k: _obj_array([x for d in data for x in d._non_tensor_batch[k]]) for k in data[0]._non_tensor_batch}
        meta = dict(data[0].meta_info)
        for key in global_keys:
            values = [d.meta_info.get(key) for d in data]
            first = next((v for v in values if v is not None), None)
            if first is None:
                continue
            if isinstance(first, dict):
                meta[key] = {sk: [v[sk] for v in values if v and sk in v] for sk in first}
            else:
                meta[key] = values
        return DataProto(batch=new_batch, non_tensor_batch=nt, meta_info=meta)



def install_as_roll(root) -> Path:
    """Create root/roll/distributed/scheduler/{protocol,remote_protocol}.py backed by this file."""
    pkg = Path(root) / "roll" / "distributed" / "scheduler"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (Path(root) / "roll", Path(root) / "roll" / "distributed", pkg):
        (d / "__init__.py").touch()
    shutil.copyfile(__file__, pkg / "protocol.py")
    (pkg / "remote_protocol.py").write_text("from roll.distributed.scheduler.protocol import BatchProxy  # noqa\n")
    return pkg / "protocol.py"


if __name__ == "roll.distributed.scheduler.protocol":
    BatchProxy.__module__ = "roll.distributed.scheduler.remote_protocol"
