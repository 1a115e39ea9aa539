"""``rollout-mock diff``: comparing two dumps step by step (:func:`diff_dumps`) and what it found,
per key, step and stream, with its text form (:func:`format_diff`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, TextIO, TypedDict

from rollout_mock.codec.structure import KeyDiff, compare_batches
from rollout_mock.determinism.fingerprint import compare_fingerprints
from rollout_mock.errors import CorruptStepError, DiffInputError, StepNotFoundError
from rollout_mock.storage.manifest import StepEntry, StreamId, format_ranges
from rollout_mock.storage.reader import Dump, open_dump
from rollout_mock.text import progress_bar

__all__ = [
    "MAX_KEYS_SHOWN", "MAX_STEPS_SHOWN", "DiffReport", "KeyDiff", "StepDiff", "StreamDiff", "compare_batches",
    "diff_dumps", "format_diff", "parse_steps",
]

#: Differing keys listed per step in the text report, and differing steps shown in detail.
MAX_KEYS_SHOWN = 12
MAX_STEPS_SHOWN = 20


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


# --------------------------------------------------------------------------- walking two dumps
class _Sides(TypedDict):
    """What a :class:`StepDiff` reports of both sides' index entries."""

    type_a: str
    type_b: str
    samples_a: int | None
    samples_b: int | None


def parse_steps(spec: str) -> list[tuple[int, int | None]]:
    """``"0-9,12,20-"`` -> ``[(0, 9), (12, 12), (20, None)]`` (inclusive; ``None`` = open)."""
    ranges: list[tuple[int, int | None]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), (int(hi_s) if hi_s.strip() else None)
            else:
                lo = hi = int(part)
        except ValueError:
            raise DiffInputError(
                f"--steps {spec!r}: expected N, A-B, A- or a comma list of them, e.g. 0-9,12"
            ) from None
        if lo < 0 or (hi is not None and hi < lo):
            raise DiffInputError(f"--steps {spec!r}: bad range {part!r}")
        ranges.append((lo, hi))
    if not ranges:
        raise DiffInputError(f"--steps {spec!r}: no steps given")
    return ranges


def _selected(step: int, ranges: list[tuple[int, int | None]] | None) -> bool:
    return ranges is None or any(lo <= step and (hi is None or step <= hi) for lo, hi in ranges)


def _same_file(x: StepEntry, y: StepEntry) -> bool:
    return x.checksum == y.checksum and x.size == y.size


def _verify(dump: Dump, entry: StepEntry, side: str) -> str | None:
    """Why ``entry``'s file does not match the manifest (missing, size, checksum), or ``None``.

    Reads the whole file through the dump's store (local file or object), so a checksum that
    matches in both manifests is only trusted for files that really carry it.
    """
    from rollout_mock.storage.digest import Digest

    where = dump.store.where(entry.file)
    try:
        source = dump.store.open_source(entry.file)
        size = source.size()
    except OSError as exc:
        return f"{side}: {where} is missing or unreadable ({exc.__class__.__name__}: {exc})"
    if size != entry.size:
        return f"{side}: {where} has {size} bytes, its manifest says {entry.size} (truncated or changed)"
    digest = Digest()
    offset = 0
    while offset < size:
        chunk = bytes(source.read_range(offset, min(16 << 20, size - offset)))
        digest.update(chunk)
        offset += len(chunk)
    checksum, _ = digest.finish()
    if checksum != entry.checksum:
        return f"{side}: {where} does not match its checksum in the manifest (changed or corrupt)"
    return None



def _fingerprint_differences(a: Dump, b: Dump) -> tuple[str, ...]:
    """The fields in which the two dumps' environment fingerprints differ, one line each."""
    diffs = compare_fingerprints(a.manifest.fingerprint or {}, b.manifest.fingerprint or {})
    return tuple(f"{d.field}: {d.recorded!r} vs {d.current!r}" for d in diffs)


def _manifest_keys(x: StepEntry, y: StepEntry) -> tuple[KeyDiff, ...]:
    """Keys whose manifest shape/dtype differ, or that are listed on one side only (quick mode)."""
    out: list[KeyDiff] = []
    for key in list(x.keys) + [k for k in y.keys if k not in x.keys]:
        p, q = x.keys.get(key), y.keys.get(key)
        if q is None:
            out.append(KeyDiff(key=key, status="only_in_a", kind="value"))
        elif p is None:
            out.append(KeyDiff(key=key, status="only_in_b", kind="value"))
        elif p != q:
            shape_a = None if p.get("shape") is None else tuple(p["shape"])
            shape_b = None if q.get("shape") is None else tuple(q["shape"])
            out.append(KeyDiff(key=key, status="different", kind="tensor", shape_a=shape_a, shape_b=shape_b,
                               dtype_a=p.get("dtype"), dtype_b=q.get("dtype"), note="from manifest.json"))
    return tuple(out)


def _resolve_streams(
    dump_a: Dump, dump_b: Dump, split: str | None
) -> list[tuple[str, StreamId | None, StreamId | None]]:
    by_a = {s.key: s for s in dump_a.streams()}
    by_b = {s.key: s for s in dump_b.streams()}
    keys = sorted(set(by_a) | set(by_b))
    if split is not None:
        keys = [k for k in keys if (by_a.get(k) or by_b[k]).split == split]
        if not keys:
            known = ", ".join(sorted(set(by_a) | set(by_b))) or "none"
            raise DiffInputError(f"--split {split}: neither dump has a stream of that split (recorded: {known})")
    return [(k, by_a.get(k), by_b.get(k)) for k in keys]


def diff_dumps(
    dump_a: str | os.PathLike[str] | Dump,
    dump_b: str | os.PathLike[str] | Dump,
    *,
    steps: str | list[tuple[int, int | None]] | None = None,
    split: str | None = None,
    trusted: bool = False,
    quick: bool = False,
    atol: float = 0.0,
    rtol: float = 0.0,
    progress: bool | None = False,
    progress_stream: TextIO | None = None,
    ignore_meta: tuple[str, ...] | list[str] = (),
    ignore_timing: bool = False,
) -> DiffReport:
    """Compare two dumps (see the module docstring).

    ``steps``: a ``"0-9,12"`` spec or parsed ranges; ``split``: only streams of that split;
    ``trusted``: load with the plain unpickler (arbitrary objects; only for trusted dumps);
    ``quick``: never load, compare manifests only (checksums, keys, shapes, dtypes);
    ``progress``: draw a bar on stderr (``None``: when stderr is a TTY);
    ``ignore_meta`` / ``ignore_timing``: ``meta_info`` keys left out (see ``compare_batches``).

    Every step file is checked against its manifest entry (present, size, checksum) before it
    counts as identical: a missing, truncated or changed file is an ``unreadable`` step, so a
    damaged copy is never reported identical (also with ``quick``, which reads but never unpickles).

    Raises :class:`~rollout_mock.errors.DumpNotFoundError` / ``ManifestError`` for a path that
    is not a readable dump, :class:`DiffInputError` for bad arguments, and the loading errors
    (``CorruptStepError``, ``UnsafePickleError``) of steps that had to be loaded.
    """
    if not (atol >= 0 and rtol >= 0 and math.isfinite(atol) and math.isfinite(rtol)):
        raise DiffInputError(f"atol/rtol must be finite numbers >= 0, got atol={atol} rtol={rtol}")
    a = dump_a if isinstance(dump_a, Dump) else open_dump(dump_a)
    b = dump_b if isinstance(dump_b, Dump) else open_dump(dump_b)
    ranges = parse_steps(steps) if isinstance(steps, str) else steps
    plan = _resolve_streams(a, b, split)

    # Plan first (manifests only), so the progress bar knows the total work.
    per_stream: list[tuple[str, StreamId | None, StreamId | None, list[int], list[int]]] = []
    total_bytes = 0
    any_selected = False
    for key, sa, sb in plan:
        steps_a = [s for s in (a.steps(sa) if sa else []) if _selected(s, ranges)]
        steps_b = [s for s in (b.steps(sb) if sb else []) if _selected(s, ranges)]
        any_selected = any_selected or bool(steps_a or steps_b)
        per_stream.append((key, sa, sb, steps_a, steps_b))
        if sa and sb and not quick:
            for step in sorted(set(steps_a) & set(steps_b)):
                ea, eb = a.entry(sa, step), b.entry(sb, step)
                assert ea is not None and eb is not None
                if not _same_file(ea, eb):
                    total_bytes += ea.size + eb.size
    if ranges is not None and not any_selected:
        raise DiffInputError("--steps: no selected step is recorded in either dump")

    streams: list[StreamDiff] = []
    bar = progress_bar(total_bytes, stream=progress_stream, enabled=progress)
    with bar:
        for key, sa, sb, steps_a, steps_b in per_stream:
            if sa is None or sb is None:
                only = "only_in_a" if sb is None else "only_in_b"
                streams.append(StreamDiff(key, only, (), len(steps_a), len(steps_b)))
                continue
            results: list[StepDiff] = []
            set_a, set_b = set(steps_a), set(steps_b)
            for step in sorted(set_a | set_b):
                ea = a.entry(sa, step) if step in set_a else None
                eb = b.entry(sb, step) if step in set_b else None
                if ea is None or eb is None:
                    entry = ea or eb
                    assert entry is not None
                    results.append(StepDiff(
                        step, "only_in_a" if eb is None else "only_in_b",
                        type_a=None if ea is None else ea.type, type_b=None if eb is None else eb.type,
                        samples_a=None if ea is None else ea.samples, samples_b=None if eb is None else eb.samples,
                    ))
                    continue
                meta: _Sides = {"type_a": ea.type, "type_b": eb.type, "samples_a": ea.samples, "samples_b": eb.samples}
                broken = [why for why in (_verify(a, ea, "A"), _verify(b, eb, "B")) if why]
                if broken:
                    results.append(StepDiff(step, "unreadable", note="; ".join(broken), **meta))
                    continue
                if _same_file(ea, eb):
                    results.append(StepDiff(step, "identical", **meta))
                    continue
                if quick:
                    results.append(StepDiff(step, "checksum_differs", keys=_manifest_keys(ea, eb), **meta))
                    continue
                bar.set_description(f"{key} step {step}", refresh=False)
                try:
                    batch_a = a.load(step, sa, trusted=trusted, mapped=True)
                    bar.update(ea.size)
                    batch_b = b.load(step, sb, trusted=trusted, mapped=True)
                    bar.update(eb.size)
                except (CorruptStepError, StepNotFoundError) as exc:
                    results.append(StepDiff(step, "unreadable", note=str(exc).splitlines()[0], **meta))
                    continue
                keys, compared = compare_batches(batch_a, batch_b, atol=atol, rtol=rtol,
                                                 ignore_meta=tuple(ignore_meta), ignore_timing=ignore_timing)
                del batch_a, batch_b
                if not keys:
                    status = "equal"
                elif all(k.status == "close" for k in keys):
                    status = "close"
                else:
                    status = "different"
                results.append(StepDiff(step, status, loaded=True, keys_compared=compared, keys=tuple(keys), **meta))
            streams.append(StreamDiff(key, "both", tuple(results), len(steps_a), len(steps_b)))
    return DiffReport(
        a=str(a.dump_dir), b=str(b.dump_dir), streams=tuple(streams), atol=atol, rtol=rtol, quick=quick,
        fingerprint_differs=_fingerprint_differences(a, b),
    )
