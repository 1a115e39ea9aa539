"""Trigger-step forensics: which module and which op turned a step's numbers non-finite.

:class:`AnomalyProbe` (``with rollout_mock.anomaly_hooks() as probe:``) watches one training step:

* a **dispatch-level mode** (a ``TorchDispatchMode``) sees every ATen op the step runs, forward
  and backward, and checks its floating outputs. The first op whose output holds NaN or inf while
  every input was finite is the *origin* (``aten.log`` of a zero, ``aten.div`` by a zero std,
  ``aten.addmm`` overflowing float16); ops that only carry non-finite values on are counted, not
  blamed. With ``max_abs`` an op whose output jumps past it from inputs below it is reported too;
* **module hooks** (global forward pre/post hooks, so every ``torch.nn.Module`` of the process is
  covered without being registered) keep the stack of modules running, which names the module
  of each op (``None``: the op ran outside any module, in the loss code), record the module's
  inputs, and check each module's own parameters once (weights already non-finite: an earlier
  step broke them). Gradient hooks on the modules' outputs name the first module whose output
  gradient turns non-finite in backward;
* ``detect_anomaly=True`` also runs ``torch.autograd.detect_anomaly(check_nan=False)``, so an op
  blamed in backward carries the forward source line of the node it differentiates.

Modules are named by their path in the model passed (``model.layers.0.mlp.down_proj``) or, when
none is, in every root module found alive (``LlamaForCausalLM.model.layers.0...``).

The **trigger**: ``rollout-mock explain DUMP --step N -- CMD`` runs the training script in mock mode
with ``ROLLOUT_MOCK_EXPLAIN`` set (JSON: ``step``, ``split``, ``out``, ``max_abs``,
``detect_anomaly``, ``stop``). Importing rollout_mock then registers a step hook
(:func:`rollout_mock.wrap.hooks.register_step_hook`): when a wrapped scheduler of that split starts
the call of step N, a probe is started on the calling thread; when the next call of that split
starts (or the process exits), it stops, writes the JSON report, and with ``stop`` ends the
process (``SystemExit(0)``). The probe covers everything the process does between the two calls,
on that thread: the forward, the loss, the backward and the optimizer step on step N's batch.
"""

from __future__ import annotations

import atexit
import gc
import json
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR", "Anomaly", "AnomalyProbe", "ExplainSpec", "anomaly_hooks", "explain", "explain_html", "format_explain",
    "install_from_env", "read_explain", "tensor_stats",
]

#: The variable ``rollout-mock explain`` sets for the training command.
ENV_VAR = "ROLLOUT_MOCK_EXPLAIN"
#: ``kind`` of the JSON report (so ``report`` can tell it from other JSON files).
REPORT_KIND = "rollout_mock.explain"
_MAX_ANOMALIES = 20
_STACK_DEPTH = 8
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE) + os.sep
_TORCH_DIR = os.sep + "torch" + os.sep


def _finite_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))


def tensor_stats(t: Any) -> dict[str, Any]:
    """Shape, dtype and, for a floating tensor, min/max/mean/std over its finite values, the count
    of NaN, of inf and of zeros (what shows a zero variance, a log of 0, an overflow)."""
    import torch

    out: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if t.device.type == "meta" or t.numel() == 0:
        return out
    with torch.no_grad():
        x = t.detach()
        if x.is_complex():
            x = x.abs()
        if not (x.is_floating_point() or x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
            return out
        x = x.double()
        finite = torch.isfinite(x)
        n_finite = int(finite.sum())
        out["numel"] = x.numel()
        out["nan"] = int(torch.isnan(x).sum())
        out["inf"] = x.numel() - n_finite - out["nan"]
        out["zeros"] = int((x == 0).sum())
        if n_finite:
            vals = x[finite]
            out["min"], out["max"] = float(vals.min()), float(vals.max())
            out["mean"] = float(vals.mean())
            out["std"] = float(vals.std(unbiased=False)) if n_finite > 1 else 0.0
    return out


def _user_frames(stack: list[traceback.FrameSummary] | None = None) -> list[str]:
    """The innermost frames that are neither torch's nor this module's, innermost last."""
    frames = stack if stack is not None else traceback.extract_stack()
    kept = [f for f in frames if _TORCH_DIR not in f.filename and not f.filename.startswith(_HERE)]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in kept[-_STACK_DEPTH:]]


@dataclass
class Anomaly:
    """One finding. ``kind``: ``nonfinite`` (an op made NaN/inf from finite inputs), ``threshold``
    (an op's output jumped past ``max_abs``), ``nonfinite_grad`` (a module's output gradient is
    non-finite), ``nonfinite_param`` (a module's weights already were), ``propagated`` (the first
    non-finite output when no op made one from finite inputs: the batch held them)."""

    kind: str
    phase: str
    op: str | None
    module: str | None
    module_type: str | None
    where: str | None
    stack: list[str]
    inputs: list[dict[str, Any]]
    output: dict[str, Any] | None
    module_inputs: list[dict[str, Any]] = field(default_factory=list)
    autograd_node: str | None = None
    forward_trace: list[str] = field(default_factory=list)
    index: int = 0

    def to_json(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in self.__dict__.items()}

    def describe(self) -> str:
        """One line: what, which op, which module, where."""
        what = {"nonfinite": "made non-finite values", "threshold": "jumped past the threshold",
                "nonfinite_grad": "got a non-finite output gradient", "nonfinite_param": "has non-finite weights",
                "propagated": "carried non-finite values in (none made here)"}[self.kind]
        module = self.module or "(no module: code outside any nn.Module, e.g. the loss)"
        op = f"op {self.op}" if self.op else "module"
        node = f", backward node {self.autograd_node}" if self.autograd_node else ""
        return f"{self.phase}: {op} {what} in {module}{node}" + (f" at {self.where}" if self.where else "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return _finite_float(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, list | tuple):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


class AnomalyProbe:
    """Hooks that find the first module and op whose output turns non-finite (see the module
    docstring). A context manager (``with AnomalyProbe(model) as probe: train_step()``), or
    :meth:`start` / :meth:`stop`. Start it on the thread that runs the step: the dispatch mode is
    per thread (the module hooks are process-wide). Not re-entrant: a second start is refused."""

    def __init__(self, model: Any = None, *, max_abs: float | None = None, detect_anomaly: bool = False,
                 step: int | None = None, split: str | None = None) -> None:
        self.models = [] if model is None else [model]
        self.max_abs = max_abs
        self.detect_anomaly = detect_anomaly
        self.step, self.split = step, split
        self.anomalies: list[Anomaly] = []
        self.ops = 0
        self.nonfinite_ops = 0
        self.modules_seen = 0
        self._stack: list[tuple[Any, tuple[Any, ...]]] = []
        self._checked: set[int] = set()
        self._seen: set[tuple[str, str | None, str, int]] = set()
        self._objects: dict[int, Any] = {}
        self._handles: list[Any] = []
        self._mode: Any = None
        self._anomaly_ctx: Any = None
        self._first_propagated: Anomaly | None = None
        self.started = self.stopped = False

    def __repr__(self) -> str:
        return f"AnomalyProbe(step={self.step}, ops={self.ops}, anomalies={len(self.anomalies)})"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AnomalyProbe:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.utils._python_dispatch import TorchDispatchMode

        if self.started:
            raise RuntimeError("AnomalyProbe: already started (one probe watches one step)")
        self.started = True
        probe = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                probe._op(func, args, kwargs or {}, out)
                return out

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post),
        ]
        if self.detect_anomaly:
            with warnings.catch_warnings():  # "Anomaly Detection has been enabled": asked for
                warnings.simplefilter("ignore")
                self._anomaly_ctx = torch.autograd.detect_anomaly(check_nan=False)
                self._anomaly_ctx.__enter__()
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def stop(self) -> AnomalyProbe:
        if not self.started or self.stopped:
            return self
        self.stopped = True
        try:
            self._mode.__exit__(None, None, None)
        finally:
            if self._anomaly_ctx is not None:
                self._anomaly_ctx.__exit__(None, None, None)
            for handle in self._handles:
                handle.remove()
        self._resolve_names()
        return self

    def __enter__(self) -> AnomalyProbe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ hooks
    def _pre(self, module: Any, args: tuple[Any, ...]) -> None:
        self._stack.append((module, args))
        self.modules_seen += 1
        if id(module) not in self._checked:
            self._checked.add(id(module))
            self._check_params(module)

    def _post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] is module:
                del self._stack[i:]
                break
        import torch

        if not torch.is_grad_enabled():
            return
        for leaf in _leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
                leaf.register_hook(self._grad_hook(module))

    def _grad_hook(self, module: Any) -> Callable[[Any], None]:
        def hook(grad: Any) -> None:
            import torch

            if len(self.anomalies) < _MAX_ANOMALIES and not bool(torch.isfinite(grad).all()):
                if not any(a.kind == "nonfinite_grad" for a in self.anomalies):
                    self._add(Anomaly("nonfinite_grad", "backward", None, None, None, None, [], [],
                                      tensor_stats(grad)), module)
        return hook

    def _check_params(self, module: Any) -> None:
        import torch

        for name, param in module.named_parameters(recurse=False):
            if param.is_floating_point() and not bool(torch.isfinite(param.detach()).all()):
                stats = tensor_stats(param)
                stats["parameter"] = name
                self._add(Anomaly("nonfinite_param", "forward", None, None, None, None, _user_frames(), [],
                                  stats), module)
                return

    def _op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        import torch

        self.ops += 1
        outputs = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
                   and t.device.type != "meta"]
        if not outputs:
            return
        bad = [t for t in outputs if t.numel() and not bool(torch.isfinite(t).all())]
        over = None
        if not bad and self.max_abs is not None:
            over = next((t for t in outputs if t.numel() and float(t.detach().abs().max()) > self.max_abs), None)
            if over is None:
                return
        elif not bad:
            return
        if bad:
            self.nonfinite_ops += 1
        if len(self.anomalies) >= _MAX_ANOMALIES:
            return
        inputs = list(_leaves((args, kwargs)))
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        name = str(getattr(func, "overloadpacket", func))
        if "empty" in name or (not tensors and "copy" not in name):
            return  # uninitialised memory (empty, new_empty) or a factory (full): no value computed
        scalars_finite = all(math.isfinite(v) for v in inputs if isinstance(v, float))
        floats = [t for t in tensors if t.is_floating_point() and t.numel()]
        inputs_finite = scalars_finite and all(bool(torch.isfinite(t).all()) for t in floats)
        if bad:
            kind = "nonfinite" if inputs_finite else "propagated"
            if kind == "propagated" and (self._first_propagated is not None or self.anomalies):
                return
        else:
            assert self.max_abs is not None
            below = all(float(t.detach().abs().max()) <= self.max_abs for t in floats if bool(torch.isfinite(t).all()))
            if not (inputs_finite and below) or any(a.kind == "threshold" for a in self.anomalies):
                return
            kind = "threshold"
        node = torch._C._current_autograd_node()
        raw = getattr(node, "metadata", {}).get("traceback_") if node is not None else None
        trace = [line.strip() for line in "".join(raw).splitlines()
                 if line.strip().startswith("File") and _TORCH_DIR not in line][-_STACK_DEPTH:] if raw else []
        module, module_args = self._stack[-1] if self._stack else (None, ())
        stack = traceback.extract_stack()
        inner = next((f.filename for f in reversed(stack) if _TORCH_DIR not in f.filename
                      and not f.filename.startswith(_HERE)), "")
        if inner.startswith(_PACKAGE):
            return  # rollout_mock's own work (decoding the replayed batch's raw bytes), not the step's numbers
        frames = _user_frames(stack)
        anomaly = Anomaly(
            kind=kind, phase="backward" if node is not None else "forward",
            op=name,
            module=None, module_type=None, where=(trace or frames)[-1] if (trace or frames) else None, stack=frames,
            inputs=[tensor_stats(t) for t in tensors[:4]],
            output=tensor_stats(bad[0] if bad else over),
            module_inputs=[tensor_stats(t) for t in _leaves(module_args) if isinstance(t, torch.Tensor)][:4],
            autograd_node=None if node is None else node.name(), forward_trace=trace,
        )
        if kind == "propagated":
            self._first_propagated = anomaly
            return
        self._add(anomaly, module)

    def _add(self, anomaly: Anomaly, module: Any) -> None:
        key = (anomaly.kind, anomaly.op, anomaly.phase, id(module))
        if key in self._seen:  # the same op of the same module again (the next layer call, micro-batch)
            return
        self._seen.add(key)
        anomaly.index = len(self.anomalies)
        if module is not None:
            self._objects[anomaly.index] = module
            anomaly.module_type = type(module).__name__
        self.anomalies.append(anomaly)

    # ------------------------------------------------------------------ results
    def _resolve_names(self) -> None:
        """Qualified names of the modules findings point at: in the models given, else in every
        root module alive (found through the garbage collector, once, after the step)."""
        if not self._objects:
            return
        import torch

        names: dict[int, str] = {}
        for i, model in enumerate(self.models):
            prefix = "model" if len(self.models) == 1 else f"model{i}"
            for name, sub in model.named_modules():
                names.setdefault(id(sub), f"{prefix}.{name}" if name else prefix)
        if any(id(m) not in names for m in self._objects.values()):
            with warnings.catch_warnings():  # isinstance() on some lazy objects warns (deprecated aliases)
                warnings.simplefilter("ignore")
                alive = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
            children = {id(c) for m in alive for c in m.children()}
            for root in (m for m in alive if id(m) not in children):
                for name, sub in root.named_modules():
                    names.setdefault(id(sub), f"{type(root).__name__}.{name}" if name else type(root).__name__)
        for index, module in self._objects.items():
            self.anomalies[index].module = names.get(id(module), type(module).__name__)
        self._objects.clear()

    @property
    def first(self) -> Anomaly | None:
        """The first op that made non-finite values (else the first threshold jump, the first
        non-finite weight or gradient, or the first op that carried non-finite input on)."""
        for kind in ("nonfinite_param", "nonfinite", "threshold", "nonfinite_grad"):
            found = next((a for a in self.anomalies if a.kind == kind), None)
            if found is not None:
                return found
        return self._first_propagated

    def report(self) -> dict[str, Any]:
        """The JSON report (what ``rollout-mock explain`` writes and ``report --explain`` shows)."""
        first = self.first
        return {
            "kind": REPORT_KIND, "step": self.step, "split": self.split,
            "verdict": "anomaly" if first is not None else "clean",
            "summary": first.describe() if first is not None else
            f"no op made a non-finite value{' or passed ' + str(self.max_abs) if self.max_abs else ''} "
            f"in {self.ops} ops",
            "first": None if first is None else first.to_json(),
            "anomalies": [a.to_json() for a in self.anomalies],
            "ops": self.ops, "nonfinite_ops": self.nonfinite_ops, "module_calls": self.modules_seen,
            "max_abs": self.max_abs, "detect_anomaly": self.detect_anomaly,
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`report` as JSON (atomically: a temporary file, then a rename)."""
        from rollout_mock.storage.directory import atomic_write

        return atomic_write(path, json.dumps(self.report(), indent=2, allow_nan=False).encode("utf-8"))


def anomaly_hooks(model: Any = None, *, max_abs: float | None = None, detect_anomaly: bool = False) -> AnomalyProbe:
    """``with rollout_mock.anomaly_hooks(model) as probe: step()``, then ``probe.first`` /
    ``probe.report()`` / ``probe.write(path)``. ``model`` only names the modules (every module is
    hooked whether passed or not)."""
    return AnomalyProbe(model, max_abs=max_abs, detect_anomaly=detect_anomaly)


def explain(step_fn: Callable[..., Any], *args: Any, model: Any = None, max_abs: float | None = None,
            detect_anomaly: bool = False, **kwargs: Any) -> AnomalyProbe:
    """Run ``step_fn(*args, **kwargs)`` (one training step) under an :class:`AnomalyProbe` and
    return the stopped probe. An exception of the step propagates after the probe stopped."""
    probe = AnomalyProbe(model, max_abs=max_abs, detect_anomaly=detect_anomaly)
    with probe:
        step_fn(*args, **kwargs)
    return probe


# ---------------------------------------------------------------------- the trigger
@dataclass(frozen=True)
class ExplainSpec:
    """What ``ROLLOUT_MOCK_EXPLAIN`` asks for."""

    step: int
    out: str
    split: str = "train"
    max_abs: float | None = None
    detect_anomaly: bool = False
    stop: bool = True

    def to_env(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_env(cls, text: str) -> ExplainSpec:
        from rollout_mock.errors import DebugInputError

        try:
            data = json.loads(text)
            spec = cls(**data)
        except (ValueError, TypeError) as exc:
            raise DebugInputError(f"{ENV_VAR}={text!r}: expected JSON with step and out, e.g. "
                                  f'{{"step": 12, "out": "explain.json"}} ({exc})') from None
        if not isinstance(spec.step, int) or spec.step < 0:
            raise DebugInputError(f"{ENV_VAR}: step must be an integer >= 0, got {spec.step!r}")
        return spec


class _Trigger:
    """The step hook: start a probe at the call of step N, stop it at the next call of the split."""

    def __init__(self, spec: ExplainSpec) -> None:
        self.spec = spec
        self.probe: AnomalyProbe | None = None
        self.done = False

    def __call__(self, split: str, step: int, mode: str) -> None:
        if split != self.spec.split or self.done:
            return
        if self.probe is not None:
            self.finish()
            if self.spec.stop:
                print(f"[RolloutMock] explain: step {self.spec.step} of {split} done, report in "
                      f"{self.spec.out}; stopping (mode={mode})", file=sys.stderr)
                raise SystemExit(0)
        elif step == self.spec.step:
            self.probe = AnomalyProbe(max_abs=self.spec.max_abs, detect_anomaly=self.spec.detect_anomaly,
                                      step=step, split=split).start()
            atexit.register(self.finish)

    def finish(self) -> None:
        if self.probe is None or self.done:
            return
        self.done = True
        self.probe.stop()
        self.probe.write(self.spec.out)


def install_from_env(environ: Any = None) -> _Trigger | None:
    """Register the explain trigger when ``ROLLOUT_MOCK_EXPLAIN`` is set (``import rollout_mock``
    calls it); None when it is not."""
    from rollout_mock.wrap.hooks import register_step_hook

    text = (os.environ if environ is None else environ).get(ENV_VAR)
    if not text:
        return None
    trigger = _Trigger(ExplainSpec.from_env(text))
    register_step_hook(trigger)
    return trigger


def read_explain(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An explain report, checked to be one (:class:`~rollout_mock.errors.DebugInputError` if not)."""
    from rollout_mock.errors import DebugInputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DebugInputError(f"explain report {path}: cannot read it ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise DebugInputError(f"{path}: not an explain report (written by rollout-mock explain)")
    return data


def format_explain(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    lines = [f"rollout-mock explain: step {report.get('step')} of {report.get('split')}: {report.get('summary')}"]
    first = report.get("first")
    if first:
        lines.append(f"  op: {first.get('op')}  module: {first.get('module') or '(none)'}  "
                     f"type: {first.get('module_type') or '-'}  phase: {first.get('phase')}")
        for i, stats in enumerate(first.get("inputs") or []):
            lines.append(f"  input {i}: {_stats_line(stats)}")
        if first.get("output"):
            lines.append(f"  output : {_stats_line(first['output'])}")
        for frame in (first.get("stack") or [])[-3:]:
            lines.append(f"  at {frame}")
    others = [a for a in report.get("anomalies", []) if a is not first and a != first]
    for a in others[:5]:
        lines.append(f"  then: {a.get('kind')} {a.get('op') or ''} in {a.get('module') or '(no module)'}")
    lines.append(f"  {report.get('ops')} ops watched, {report.get('nonfinite_ops')} with non-finite output")
    return "\n".join(lines)


def explain_html(reports: list[dict[str, Any]]) -> str:
    """The ``report`` page's section for explain reports: per report its verdict, the op, the
    module, where, and a table of the statistics of the op's inputs and output."""
    from html import escape

    parts = ["<h2>Trigger-step forensics (rollout-mock explain)</h2>"]
    for report in reports:
        first = report.get("first") or {}
        parts.append(f"<h3>Step {escape(str(report.get('step')))} of {escape(str(report.get('split')))}: "
                     f"{escape(str(report.get('verdict')))}</h3><p>{escape(str(report.get('summary')))}</p>")
        if first:
            rows = [("op", first.get("op")), ("module", first.get("module") or "(none: outside any module)"),
                    ("module type", first.get("module_type")), ("phase", first.get("phase")),
                    ("backward node", first.get("autograd_node")), ("where", first.get("where"))]
            parts.append("<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
                                             for k, v in rows if v) + "</table>")
            stats = [(f"input {i}", s) for i, s in enumerate(first.get("inputs") or [])]
            stats += [(f"module input {i}", s) for i, s in enumerate(first.get("module_inputs") or [])]
            if first.get("output"):
                stats.append(("output", first["output"]))
            cols = ("dtype", "shape", "min", "max", "mean", "std", "nan", "inf", "zeros")
            parts.append("<table><tr><th>tensor</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(
                f"<tr><td>{escape(name)}</td>" + "".join(f"<td>{escape(str(s.get(c, '')))}</td>" for c in cols)
                + "</tr>" for name, s in stats) + "</table>")
        parts.append(f"<p class=\"muted\">{report.get('ops')} ops watched, {report.get('nonfinite_ops')} with a "
                     f"non-finite output.</p>")
    return "".join(parts)


def _stats_line(stats: dict[str, Any]) -> str:
    keys = ("min", "max", "mean", "std", "nan", "inf", "zeros")
    parts = [f"{k}={stats[k]:.4g}" if isinstance(stats.get(k), float) else f"{k}={stats[k]}"
             for k in keys if k in stats]
    return f"{stats.get('dtype')}{stats.get('shape')} " + " ".join(parts)
