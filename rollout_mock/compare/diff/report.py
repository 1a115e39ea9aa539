"""What ``diff`` found: per-key, per-step and per-stream results, and their text form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rollout_mock.storage.manifest import format_ranges
from rollout_mock.text import json_float

__all__ = [
    "DiffReport",
    "KeyDiff",
    "MAX_KEYS_SHOWN",
    "MAX_STEPS_SHOWN",
    "StepDiff",
    "StreamDiff",
    "format_diff",
]

#: Differing keys listed per step in the text report, and differing steps shown in detail.
MAX_KEYS_SHOWN = 12
MAX_STEPS_SHOWN = 20
_REPR_WIDTH = 60


@dataclass(frozen=True)
class KeyDiff:
    """One key that is not identical on both sides.

    ``status``: ``"different"``, ``"close"`` (within atol/rtol), ``"only_in_a"``, ``"only_in_b"``.
    ``kind``: ``"tensor"``, ``"ndarray"``, ``"object_array"``, ``"value"`` or ``"type"`` (the two
    sides are different kinds of things). Shapes/dtypes are ``None`` for non-arrays.
    ``first_index`` is the first differing sample (index along dim 0) of an array, or the first
    differing position of a list/tuple value; ``samples_differ`` counts differing samples;
    ``first_element`` is the full index of the first differing element and ``first_a``/``first_b``
    the ``repr`` of its two values.
    """

    key: str
    status: str
    kind: str
    a: str | None = None
    b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs_diff: float | None = None
    elements_differ: int | None = None
    samples_differ: int | None = None
    samples: int | None = None
    first_index: int | None = None
    first_element: tuple[int, ...] | None = None
    first_a: str | None = None
    first_b: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("shape_a", "shape_b", "first_element"):
            if out[name] is not None:
                out[name] = list(out[name])
        out["max_abs_diff"] = json_float(self.max_abs_diff)
        return out


@dataclass(frozen=True)
class StepDiff:
    """One step of one stream.

    ``status``: ``"identical"`` (same checksum: not loaded), ``"equal"`` (loaded: same content,
    different file bytes), ``"close"`` (within tolerance), ``"different"``,
    ``"checksum_differs"`` (``quick`` mode: not loaded), ``"only_in_a"``, ``"only_in_b"``,
    ``"unreadable"`` (a step file is missing, truncated, changed or undecodable on a side: ``note``
    says which and why; never identical).
    """

    step: int
    status: str
    loaded: bool = False
    type_a: str | None = None
    type_b: str | None = None
    samples_a: int | None = None
    samples_b: int | None = None
    keys_compared: int = 0
    keys: tuple[KeyDiff, ...] = ()
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("identical", "equal", "close")

    @property
    def first_differing_sample(self) -> int | None:
        """Smallest differing sample index over the differing array keys of this step."""
        found = [k.first_index for k in self.keys if k.first_index is not None and k.kind != "value"]
        return min(found) if found else None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "loaded": self.loaded,
            "type_a": self.type_a,
            "type_b": self.type_b,
            "samples_a": self.samples_a,
            "samples_b": self.samples_b,
            "keys_compared": self.keys_compared,
            "first_differing_sample": self.first_differing_sample,
            "keys": [k.to_json() for k in self.keys],
            "note": self.note,
        }


@dataclass(frozen=True)
class StreamDiff:
    """One stream: ``status`` is ``"both"``, ``"only_in_a"`` or ``"only_in_b"``."""

    stream: str
    status: str
    steps: tuple[StepDiff, ...] = ()
    steps_a: int = 0
    steps_b: int = 0

    def count(self, *statuses: str) -> int:
        return sum(s.status in statuses for s in self.steps)

    @property
    def ok(self) -> bool:
        return self.status == "both" and all(s.ok for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "status": self.status,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class DiffReport:
    a: str
    b: str
    streams: tuple[StreamDiff, ...]
    atol: float = 0.0
    rtol: float = 0.0
    quick: bool = False
    fingerprint_differs: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Everything compared is identical (or within tolerance) and nothing is one-sided."""
        return all(s.ok for s in self.streams)

    @property
    def identical(self) -> bool:
        """Like :attr:`ok`, without tolerance: every step identical or equal after loading."""
        return self.ok and not any(s.status == "close" for st in self.streams for s in st.steps)

    @property
    def loaded_steps(self) -> int:
        return sum(s.loaded for st in self.streams for s in st.steps)

    def first_difference(self) -> tuple[str, StepDiff] | None:
        """The (stream, step) of the first differing step, by stream then step."""
        for stream in self.streams:
            for step in stream.steps:
                if not step.ok:
                    return stream.stream, step
        return None

    def to_json(self) -> dict[str, Any]:
        first = self.first_difference()
        return {
            "ok": self.ok,
            "identical": self.identical,
            "a": self.a,
            "b": self.b,
            "atol": self.atol,
            "rtol": self.rtol,
            "quick": self.quick,
            "loaded_steps": self.loaded_steps,
            "first_difference": None if first is None else {"stream": first[0], "step": first[1].step},
            "fingerprint_differs": list(self.fingerprint_differs),
            "streams": [s.to_json() for s in self.streams],
        }




def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0.0:
        return "0"
    return f"{x:.3g}"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "?" if shape is None else str(list(shape))


def _describe_key(k: KeyDiff) -> str:
    if k.status == "only_in_a":
        return f"{k.key}: only in A" + (f" ({k.a})" if k.a else "")
    if k.status == "only_in_b":
        return f"{k.key}: only in B" + (f" ({k.b})" if k.b else "")
    if k.kind == "type":
        return f"{k.key}: {k.a} vs {k.b}"
    if k.kind == "value":
        where = f" (first differing index {k.first_index})" if k.first_index is not None else ""
        return f"{k.key}: {k.a} vs {k.b}{where}"
    parts: list[str] = []
    if k.shape_a != k.shape_b:
        parts.append(f"shape {_shape(k.shape_a)} vs {_shape(k.shape_b)}")
    if k.dtype_a != k.dtype_b:
        parts.append(f"dtype {k.dtype_a} vs {k.dtype_b}")
    if not parts:
        parts.append(f"{k.dtype_a} {_shape(k.shape_a)}")
    if k.shape_a == k.shape_b:
        if k.status == "close":
            parts.append("within tolerance")
        if k.max_abs_diff is not None:
            parts.append(f"max abs diff {_num(k.max_abs_diff)}")
        if k.elements_differ:
            values = f"{k.first_a} vs {k.first_b}"
            if k.shape_a:
                at = k.first_index if len(k.shape_a) == 1 else k.first_element
                parts.append(
                    f"{k.samples_differ} of {k.samples} samples differ, first at sample {k.first_index} "
                    f"([{', '.join(map(str, at if isinstance(at, tuple) else (at,)))}]: {values})"
                )
            else:
                parts.append(f"value {values}")
    text = f"{k.key}: " + ", ".join(parts)
    return text + (f" ({k.note})" if k.note else "")


def format_diff(report: DiffReport, *, max_steps: int = MAX_STEPS_SHOWN, max_keys: int = MAX_KEYS_SHOWN) -> str:
    """Render the report as plain text: a verdict line, then per stream a summary and details."""
    n_streams = len(report.streams)
    all_steps = [s for st in report.streams for s in st.steps]
    bad_steps = [s for s in all_steps if not s.ok]
    one_sided = [st for st in report.streams if st.status != "both"]
    if report.ok:
        verdict = "IDENTICAL" if report.identical else f"WITHIN TOLERANCE (atol={report.atol:g}, rtol={report.rtol:g})"
    else:
        parts = []
        if bad_steps:
            parts.append(f"{len(bad_steps)} of {len(all_steps)} steps differ")
        if one_sided:
            parts.append(f"{len(one_sided)} of {n_streams} streams on one side only")
        verdict = "DIFFERENT (" + "; ".join(parts) + ")"
    lines = [f"rollout-mock diff: {verdict}", f"  A: {report.a}", f"  B: {report.b}"]
    if not n_streams:
        lines.append("  (neither dump has any stream)")
    identical = sum(s.status == "identical" for s in all_steps)
    if report.ok and identical == len(all_steps) and all_steps:
        lines.append(
            f"  all {len(all_steps)} steps of {n_streams} stream(s) have equal checksums in manifest.json: "
            f"identical without loading (nothing unpickled)"
        )
    for st in report.streams:
        lines.append("")
        if st.status != "both":
            side, n = ("A", st.steps_a) if st.status == "only_in_a" else ("B", st.steps_b)
            lines.append(f"stream {st.stream}: only in {side} ({n} steps)")
            continue
        counts = [
            f"{st.count('identical')} identical by checksum (not loaded)",
            f"{st.count('equal')} equal after loading",
        ]
        if st.count("close"):
            counts.append(f"{st.count('close')} within tolerance")
        if st.count("unreadable"):
            counts.append(f"{st.count('unreadable')} unreadable (missing, truncated or corrupt)")
        if st.count("checksum_differs"):
            counts.append(f"{st.count('checksum_differs')} with different checksums (not loaded: --quick)")
        counts.append(f"{st.count('different')} different")
        common = len([s for s in st.steps if s.status not in ("only_in_a", "only_in_b")])
        lines.append(f"stream {st.stream}: {common} steps in both: " + ", ".join(counts))
        shown = 0
        for s in st.steps:
            if s.status not in ("different", "close", "checksum_differs", "unreadable"):
                continue
            if shown == max_steps:
                differing = ("different", "close", "checksum_differs", "unreadable")
                rest = sum(x.status in differing for x in st.steps) - shown
                lines.append(f"  ... {rest} more differing steps (--json lists all)")
                break
            shown += 1
            head = f"  step {s.step}:"
            if s.status == "unreadable":
                lines.append(f"{head} UNREADABLE: {s.note}")
                continue
            if s.status == "checksum_differs":
                head += " checksums differ"
            else:
                first = s.first_differing_sample
                head += f" {sum(k.status != 'close' for k in s.keys)} of {s.keys_compared} keys differ"
                if s.status == "close":
                    head = f"  step {s.step}: within tolerance ({len(s.keys)} keys not bitwise equal)"
                elif first is not None:
                    head += f", first differing sample {first}"
            if s.type_a != s.type_b:
                head += f"; type {s.type_a} vs {s.type_b}"
            if s.samples_a != s.samples_b:
                head += f"; samples {s.samples_a} vs {s.samples_b}"
            lines.append(head)
            for k in s.keys[:max_keys]:
                lines.append(f"    {_describe_key(k)}")
            if len(s.keys) > max_keys:
                lines.append(f"    ... {len(s.keys) - max_keys} more keys (--json lists all)")
        only_a = [s.step for s in st.steps if s.status == "only_in_a"]
        only_b = [s.step for s in st.steps if s.status == "only_in_b"]
        if only_a:
            lines.append(f"  steps only in A: {format_ranges(only_a)}")
        if only_b:
            lines.append(f"  steps only in B: {format_ranges(only_b)}")
    if report.fingerprint_differs:
        lines.append("")
        lines.append("note: the dumps were recorded in different environments:")
        lines.extend(f"  {d}" for d in report.fingerprint_differs[:10])
        if len(report.fingerprint_differs) > 10:
            lines.append(f"  ... {len(report.fingerprint_differs) - 10} more")
    return "\n".join(lines)

