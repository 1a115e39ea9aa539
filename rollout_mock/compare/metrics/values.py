"""Metric values: what a metric may be, and how it is encoded in JSONL/CSV (NaN and infinities included)."""

from __future__ import annotations

import json
import math
import operator

from rollout_mock.errors import InvalidMetricError

__all__ = ["DEFAULT_METRICS_FILE", "MAX_EXACT_INT", "decode_value", "encode_value"]



#: Name of the metrics file that :func:`resolve_metrics_path` looks for in a run directory.
DEFAULT_METRICS_FILE = "metrics.jsonl"
#: Largest integer magnitude that a float64 holds exactly.
MAX_EXACT_INT = 2**53

_NONFINITE_ENCODE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_TFEVENTS_MARK = "tfevents"



def _to_number(key: str, value: object) -> float | int:
    """Convert ``value`` to a Python ``float`` or ``int``, or raise naming ``key``.

    Accepts ``float``/``int`` (not ``bool``), numpy scalars and 0-d numpy arrays or torch tensors
    (anything with ``.item()`` and an empty ``shape``), without importing numpy or torch.
    """
    if isinstance(value, bool):
        raise InvalidMetricError(
            f"metric {key!r}: bool {value!r} is not a metric value; log int(value) instead"
        )
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    item = getattr(value, "item", None)
    if callable(item):
        shape = getattr(value, "shape", ())
        if tuple(shape) != ():
            raise InvalidMetricError(
                f"metric {key!r}: expected a scalar, got {type(value).__name__} of shape "
                f"{tuple(shape)}; log a 0-d value (e.g. x.mean())"
            )
        return _to_number(key, item())
    raise InvalidMetricError(
        f"metric {key!r}: expected a float, int, numpy scalar or 0-d tensor, got "
        f"{type(value).__name__} {value!r:.60}"
    )


def encode_value(key: str, value: object) -> float | int | str:
    """Return the JSON-ready encoding of one metric value (see the module docstring).

    Raises :class:`InvalidMetricError` naming ``key`` for non-numbers, non-scalar tensors, bools
    and integers beyond ``2**53``.
    """
    number = _to_number(key, value)
    if isinstance(number, int):
        if abs(number) > MAX_EXACT_INT:
            raise InvalidMetricError(
                f"metric {key!r}: integer {number} is beyond 2**53 and cannot be stored exactly "
                "as a float; log it as float(value) if rounding is acceptable"
            )
        return number
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def decode_value(raw: object) -> float:
    """Decode one stored value to a float: numbers, ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Raises ``ValueError`` (caller adds file/line context) for anything else, including ``null``,
    booleans and other strings.
    """
    if isinstance(raw, bool) or raw is None:
        raise ValueError(f"expected a number, got {json.dumps(raw)}")
    if isinstance(raw, int):
        if abs(raw) > MAX_EXACT_INT:
            raise ValueError(f"integer {raw} is beyond 2**53 and cannot be read exactly")
        return float(raw)
    if isinstance(raw, float):
        return raw
    if isinstance(raw, str) and raw in _NONFINITE_ENCODE:
        return _NONFINITE_ENCODE[raw]
    raise ValueError(
        f"expected a number or one of \"NaN\", \"Infinity\", \"-Infinity\", got {json.dumps(raw)}"
    )


def _check_step(step: object) -> int:
    if isinstance(step, bool):
        raise InvalidMetricError(f"step must be a non-negative int, got {step!r}")
    try:
        # any object: operator.index's TypeError is the check (SupportsIndex alone would admit arrays)
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidMetricError(
            f"step must be a non-negative int, got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise InvalidMetricError(f"step must be a non-negative int, got {value}")
    return value


# --------------------------------------------------------------------------------------------
