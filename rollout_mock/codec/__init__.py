"""Encoding: batches to bytes and back.

* :mod:`~rollout_mock.codec.pickler` writes a batch as a protocol-5 pickle whose tensors and
  arrays stream as raw buffers (format 1), and snapshots batches for the background writer;
* :mod:`~rollout_mock.codec.safe` reads such files with a restricted unpickler.

Step files reference the rebuild functions as ``rollout_mock.codec._rebuild_*``: they are part
of the on-disk format and are re-exported here under those names.
"""

from rollout_mock.codec.pickler import (
    PROTOCOL,
    Snapshot,
    _rebuild_ndarray,
    _rebuild_np_scalar,
    _rebuild_object,
    _rebuild_object_array,
    _rebuild_parameter,
    _rebuild_tensor,
    _rebuild_tensordict,
    batch_class_names,
    capture,
    dtype_name,
    dump,
    dumps,
    is_batch_class,
    loads_unrestricted,
    register_batch_class,
    torch_dtype,
)

__all__ = [
    "PROTOCOL", "Snapshot", "batch_class_names", "capture", "dtype_name", "dump", "dumps",
    "is_batch_class", "loads_unrestricted", "register_batch_class", "torch_dtype",
]
# The _rebuild_* names above are deliberately not in __all__: they are format, not API.
_FORMAT_NAMES = (_rebuild_ndarray, _rebuild_np_scalar, _rebuild_object, _rebuild_object_array,
                 _rebuild_parameter, _rebuild_tensor, _rebuild_tensordict)
