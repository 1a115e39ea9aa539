"""What determinism costs, switch by switch: the step time of a small transformer RL loop.

    python benchmarks/bench_gpu.py --device cuda [--steps 30] [--repeat 2] [--configs none,roll,...]
                                   [--json OUT] [--update-readme]
    python benchmarks/bench_gpu.py --device cpu --tiny --repeat 1 --configs none,roll   # the CI smoke run

The loop (one step = one rollout and one update): a tiny causal transformer (token and position
embeddings, pre-norm blocks with SDPA attention, a vocabulary head), bf16 autocast on CUDA. Each
step draws prompts, samples one token per position from the model on the device, scores the
samples with ``scatter_add_`` over many duplicate indices (a token-frequency reward summed per
sequence), and takes an AdamW step on a policy-gradient loss. The embedding backward adds over
repeated indices. Without determinism switches two runs of it are expected to differ on a GPU
(issue 29's similar loop did from step 2-3). Model: 8,192-token vocabulary, 4 blocks of width 512,
16 sequences of 512 tokens (``--tiny``: a toy). All 20 configurations, twice each: expected to
take under 5 minutes on an H100, mostly process start-up (not measured on a GPU yet).

Every configuration runs in a fresh interpreter, ``--repeat`` times (interleaved rounds), because
``CUBLAS_WORKSPACE_CONFIG``, ``NVIDIA_TF32_OVERRIDE`` and the NCCL variables are read once, when
CUDA, cuBLAS or NCCL start. The configurations (``--list`` prints them):

* ``none``: torch's defaults;
* each torch switch alone: deterministic algorithms, cuDNN's flags, TF32 off; plus deterministic
  algorithms with the cuBLAS workspace (the least torch accepts for matmuls), with and without
  filling uninitialised memory;
* each environment variable a profile or ``tf32: off`` sets, alone (the NCCL ones are no-ops on one
  GPU: no communicator exists; so are those only other libraries read, as the table says);
* each profile (``rollout_mock.determinism.PROFILES``), with ``tf32`` kept and off, applied as a
  user would: the variables exported at launch, ``apply(check=True)`` before any CUDA work.

Per configuration: the median step time (median over ``--steps`` timed steps after ``--warmup``,
then over runs; the range of the runs in brackets), its ratio to ``none``, whether the runs ended
with bit-identical parameters (and the first step whose loss differed when not), and the
determinism self-check (:func:`rollout_mock.determinism.self_check`, the GPU tests' check) run in
that configuration. The exit status is 1 when a profile row failed, disagreed in its self-check,
or was not bit-identical across runs.

``--transfers`` measures CUDA batches instead (issue 29, items 1-2), in this process, for a batch of
``--transfer-mb`` MB (default 1024) of CUDA tensors (int64 tokens, float32 log-probs, bf16 values,
a bool mask), median of ``--repeat`` (at least 3) timed rounds after one warm-up:

* dump mode: the blocking time of the dump-mode call (``MockScheduler``, background writer, the
  copies queued on a side stream), the same call until the copies have landed
  (``torch.cuda.synchronize()``), against the floor (a copy of the same tensors into pinned
  buffers allocated once and reused) and ``.cpu()`` (what the peers do); the writer is drained
  between rounds, untimed;
* mock mode: the mock call with ``device: cuda`` (``prefetch: false``: the read and the copy to the
  device are the call's own; synchronized), against the step file read into a reused pinned buffer
  plus one host-to-device copy of it, each measured alone; and the call with prefetch after 1 s
  of "training" (what a loop waits for when a step trains longer than its load).

Without CUDA it says so, prints the table with no figures and exits 0.

Every run writes ``benchmarks/results/bench_gpu-<time>.json`` (git-ignored) and prints a Markdown
table; ``--update-readme`` (``--device cuda`` only: the tables hold GPU figures) rewrites the
``bench_gpu`` sections of ``benchmarks/README.md`` and ``docs/determinism.md`` (``--transfers``: the
``bench_gpu_transfers`` sections of ``benchmarks/README.md`` and ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine, run_child, update_readme, work_dir  # noqa: E402

from rollout_mock.determinism import (  # noqa: E402
    FINGERPRINT_ENV_VARS,
    PROFILE_VAR,
    PROFILES,
    SEED_VAR,
    TF32,
    TF32_VAR,
)

TAG = "bench_gpu"
TRANSFERS_TAG = "bench_gpu_transfers"
SCRIPT = Path(__file__).resolve()
DOCS = SCRIPT.parents[1] / "docs" / "determinism.md"
PERFORMANCE_DOCS = SCRIPT.parents[1] / "docs" / "performance.md"
NOT_MEASURED = "not measured on a GPU yet"

# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """One row: the variables exported at launch and the torch switches set before the loop."""

    name: str
    sets: str
    env: dict[str, str] = field(default_factory=dict)
    switches: tuple[str, ...] = ()
    profile: str | None = None
    tf32: str = "keep"
    note: str = ""


def _set_switch(name: str) -> None:
    import torch

    if name == "deterministic_algorithms":
        torch.use_deterministic_algorithms(True)
    elif name == "no_fill":
        import torch.utils.deterministic

        torch.utils.deterministic.fill_uninitialized_memory = False
    elif name == "cudnn":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    elif name == "tf32_off":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        raise ValueError(f"unknown switch {name!r}")


#: Why a variable changes nothing in this single-GPU, torch-only loop (the table's note).
_NO_OP = {
    "NCCL_ALGO": "no-op on one GPU: NCCL only runs in collectives, and there are none",
    "NCCL_PROTO": "no-op on one GPU: NCCL only runs in collectives, and there are none",
    "NCCL_NVLS_ENABLE": "no-op on one GPU: NCCL only runs in collectives, and there are none",
    "NCCL_COLLNET_ENABLE": "no-op on one GPU: NCCL only runs in collectives, and there are none",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "no-op here: read by Transformer Engine, which the loop does not use",
    "DETERMINISTIC_MODE": "no-op alone: ROLL's import and apply_from_env() read it to set the torch switches",
    "FLASH_ATTENTION_DETERMINISTIC": "no-op here: read by transformers/verl for flash-attn, not by torch's SDPA",
    "PYTHONHASHSEED": "no-op on GPU work: fixes str hashing in child processes",
    "CUBLAS_WORKSPACE_CONFIG": "read when cuBLAS starts; fixes cuBLAS's workspace",
    "NVIDIA_TF32_OVERRIDE": "precision, not determinism: forces TF32 off in cuBLAS/cuDNN",
}


def _configs() -> dict[str, Config]:
    rows = [
        Config("none", "nothing: torch's defaults"),
        Config("deterministic_algorithms", "`torch.use_deterministic_algorithms(True)`",
               switches=("deterministic_algorithms",),
               note="torch refuses cuBLAS under it without `CUBLAS_WORKSPACE_CONFIG`"),
        Config("deterministic_algorithms+cublas", "the above + `CUBLAS_WORKSPACE_CONFIG=:4096:8`",
               env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, switches=("deterministic_algorithms",),
               note="the least torch accepts for deterministic matmuls"),
        Config("deterministic_algorithms+cublas-fill", "the above, `fill_uninitialized_memory = False`",
               env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, switches=("deterministic_algorithms", "no_fill"),
               note="deterministic mode also fills `torch.empty` with NaN; this row does not"),
        Config("cudnn", "`cudnn.deterministic = True`, `cudnn.benchmark = False`", switches=("cudnn",),
               note="cuDNN kernels only (convolutions; SDPA's cuDNN backend if chosen)"),
        Config("tf32_off", "`allow_tf32 = False` (matmul, cuDNN), precision `highest`", switches=("tf32_off",),
               note="precision, not determinism: only float32 matmuls change"),
    ]
    seen: set[str] = set()
    settings = [s for p in PROFILES.values() for s in p.settings] + list(TF32.OFF.settings)
    for setting in settings:
        if setting.name in seen:
            continue
        seen.add(setting.name)
        rows.append(Config(setting.name, f"`{setting.name}={setting.value}`", env={setting.name: setting.value},
                           note=_NO_OP.get(setting.name, setting.reason)))
    for profile in PROFILES.values():
        for tf32 in TF32:
            settings = profile.settings + tf32.settings
            name = profile.name if tf32 is TF32.KEEP else f"{profile.name}+tf32_off"
            rows.append(Config(name, f"profile `{profile.name}`, `tf32: {tf32.value}`",
                               env={s.name: s.value for s in settings}, profile=profile.name, tf32=tf32.value,
                               note="exported at launch, then `apply(check=True)`"))
    return {row.name: row for row in rows}


CONFIGS = _configs()

# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class Size:
    vocab: int = 8192
    dim: int = 512
    heads: int = 8
    layers: int = 4
    seq: int = 512
    batch: int = 16


TINY = Size(vocab=64, dim=32, heads=2, layers=1, seq=16, batch=4)


def _build(size: Size, device: Any) -> tuple[Any, Any]:
    import torch
    from torch import nn
    from torch.nn import functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(size.dim), nn.LayerNorm(size.dim)
            self.qkv, self.out = nn.Linear(size.dim, 3 * size.dim), nn.Linear(size.dim, size.dim)
            self.mlp = nn.Sequential(nn.Linear(size.dim, 4 * size.dim), nn.GELU(), nn.Linear(4 * size.dim, size.dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            qkv = self.qkv(self.norm1(x)).view(b, t, 3, size.heads, d // size.heads).permute(2, 0, 3, 1, 4)
            attended = functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.out(attended.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token, self.position = nn.Embedding(size.vocab, size.dim), nn.Embedding(size.seq, size.dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(size.layers)])
            self.norm, self.head = nn.LayerNorm(size.dim), nn.Linear(size.dim, size.vocab, bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            return self.head(self.norm(self.blocks(self.token(tokens) + self.position(positions))))

    torch.manual_seed(0)
    model = TinyLM().to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model: Any, optimizer: Any, generator: Any, size: Size, device: Any) -> Any:
    """One rollout (sampled on the device) and one policy-gradient update; returns the loss."""
    import torch

    tokens = torch.randint(0, size.vocab, (size.batch, size.seq), device=device, generator=generator)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(tokens)
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    with torch.no_grad():
        sampled = torch.multinomial(logp_all.exp().view(-1, size.vocab), 1, generator=generator).view_as(tokens)
        flat = sampled.flatten()
        ones = torch.ones(flat.numel(), device=device)
        counts = torch.zeros(size.vocab, device=device).scatter_add_(0, flat, ones)
        rows = torch.arange(size.batch, device=device).repeat_interleave(size.seq)
        reward = torch.zeros(size.batch, device=device).scatter_add_(0, rows, 1.0 / counts[flat])  # rare: more
        advantage = (reward - reward.mean()) / (reward.std() + 1e-6)
    logp = logp_all.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    loss = -(advantage.unsqueeze(1) * logp).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _digest(model: Any) -> str:
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def child(config: Config, device_name: str, size: Size, steps: int, warmup: int) -> dict[str, Any]:
    """One run of one configuration, in this (fresh) process: what the parent turns into a row."""
    out: dict[str, Any] = {"config": config.name}
    if config.profile is not None:  # as a user would: variables exported, apply() before any CUDA work
        from rollout_mock.determinism import apply

        report = apply(profile=config.profile, tf32=config.tf32, check=True)
        out["too_late"] = [late.variable for late in report.too_late]
        check = report.check
    else:
        for switch in config.switches:
            _set_switch(switch)
        check = None
    import torch

    from rollout_mock.determinism import self_check

    device = torch.device(device_name)
    if check is None and device.type == "cuda":
        check = self_check([device.index or 0])
    elif check is None:  # no CUDA device: self_check() says so; a CPU run on a GPU machine checks none
        check = self_check([]) if torch.cuda.is_available() else self_check()
    out["check"] = check.to_dict()
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        out["gpu"] = {"name": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__}
    try:
        model, optimizer = _build(size, device)
        generator = torch.Generator(device=device).manual_seed(1234)
        times, losses = [], []
        for index in range(warmup + steps):
            sync()
            start = time.perf_counter()
            loss = _step(model, optimizer, generator, size, device)
            sync()
            if index >= warmup:
                times.append(time.perf_counter() - start)
            losses.append(float(loss.item()).hex())
        out.update(step_s=statistics.median(times), times=times, losses=losses, digest=_digest(model))
    except RuntimeError as exc:  # torch refusing a nondeterministic op is this row's answer
        out["error"] = _first_line(exc)
    return out


# --------------------------------------------------------------------------- transfers (items 1-2)


def transfer_batch(megabytes: int, device: Any) -> dict[str, Any]:
    """About ``megabytes`` MB of CUDA tensors: int64 tokens, float32 log-probs, bf16 values, a mask
    (15 bytes a position)."""
    import torch

    seq = 4096
    rows = max(1, megabytes * 1_000_000 // (15 * seq))
    g = torch.Generator(device=device).manual_seed(0)
    return {
        "tokens": torch.randint(0, 150_000, (rows, seq), device=device, generator=g),
        "logprobs": torch.randn(rows, seq, device=device, generator=g),
        "values": torch.randn(rows, seq, device=device, generator=g).to(torch.bfloat16),
        "mask": torch.rand(rows, seq, device=device, generator=g) > 0.1,
        "meta": {"step": 0},
    }


def _median_ms(run: Callable[[], Any], repeat: int, before: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``run()`` over ``repeat`` rounds after one warm-up (``before()``: untimed)."""
    times = []
    for index in range(repeat + 1):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def transfers(megabytes: int, repeat: int, device_name: str = "cuda") -> dict[str, Any]:
    """The measurements of ``--transfers`` (see the module docstring), in milliseconds."""
    import torch

    from rollout_mock import MockScheduler

    device = torch.device(device_name)
    torch.cuda.set_device(device)
    sync = torch.cuda.synchronize
    batch = transfer_batch(megabytes, device)
    tensors = [t for t in batch.values() if isinstance(t, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    out: dict[str, Any] = {"bytes": nbytes, "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                           "cuda": torch.version.cuda}
    pinned = [torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, pin_memory=True) for t in tensors]

    def floor() -> None:
        for buffer, tensor in zip(pinned, tensors):
            buffer.copy_(tensor.reshape(-1).view(torch.uint8), non_blocking=True)
        sync()

    out["floor_ms"] = _median_ms(floor, repeat, sync)
    out["cpu_ms"] = _median_ms(lambda: [t.cpu() for t in tensors], repeat, sync)
    pinned.clear()  # (1 GB of page-locked memory)
    root = work_dir(None, "bench_gpu_transfers-")
    steps = repeat + 1
    try:
        class Rollout:
            def get_batch(self, data: Any, global_step: int) -> Any:
                return batch

        dump_config = {"enable": True, "mode": "dump", "dump_dir": str(root), "max_pending": 2}
        with MockScheduler(Rollout(), dump_config) as sched:
            step = iter(range(3 * steps))

            def drain() -> None:
                sched.interceptor.flush()
                sync()

            out["dump_call_ms"] = _median_ms(lambda: sched.get_batch(None, global_step=next(step)), repeat, drain)

            def landed() -> None:
                sched.get_batch(None, global_step=next(step))
                sync()

            out["dump_landed_ms"] = _median_ms(landed, repeat, drain)
            drain()
        step_file = next(p for p in sorted(root.rglob("*")) if p.is_file() and p.stat().st_size >= nbytes)
        size = step_file.stat().st_size
        host = [torch.empty(size, dtype=torch.uint8, pin_memory=True)]

        def read() -> None:
            with step_file.open("rb", buffering=0) as handle:
                view, done = memoryview(host[0].numpy()), 0
                while done < size:
                    done += handle.readinto(view[done:]) or size
        out["read_ms"] = _median_ms(read, repeat)
        out["h2d_ms"] = _median_ms(lambda: (host[0].to(device, non_blocking=True), sync()), repeat, sync)
        host.clear()
        mock_config = {"enable": True, "mode": "mock", "dump_dir": str(root), "device": device_name}
        with MockScheduler(None, {**mock_config, "prefetch": False}) as sched:
            step = iter(range(steps))
            served: list[Any] = []

            def mock_call() -> None:
                served[:] = [sched.get_batch(None, global_step=next(step))]
                sync()

            out["mock_ms"] = _median_ms(mock_call, repeat, lambda: served.clear())
        got = served[0]
        out["mock_bitwise_equal"] = all(torch.equal(got[k], batch[k]) and got[k].device == batch[k].device
                                        for k in batch if isinstance(batch[k], torch.Tensor))
        served.clear()
        with MockScheduler(None, mock_config) as sched:
            step = iter(range(steps))
            out["mock_prefetched_ms"] = _median_ms(
                lambda: (sched.get_batch(None, global_step=next(step)), sync()), repeat, lambda: time.sleep(1.0))
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return out


def render_transfers(result: dict[str, Any] | None) -> str:
    """The Markdown table of ``--transfers``; None: the table with no figures (not measured yet)."""
    def cell(key: str, base: str | None = None) -> tuple[str, str]:
        if result is None:
            return NOT_MEASURED, "—"
        value = result[key]
        return f"{value:.1f}", "—" if base is None else f"{value / result[base]:.2f}×"

    reference = None if result is None else result["read_ms"] + result["h2d_ms"]
    rows = [
        ("dump: copy into pinned buffers allocated once (the floor)", *cell("floor_ms", "floor_ms")),
        ("dump: `.cpu()` (fresh pageable memory: what the peers do)", *cell("cpu_ms", "floor_ms")),
        ("dump: the dump-mode call (returns once the copies are queued)", *cell("dump_call_ms", "floor_ms")),
        ("dump: the dump-mode call + `synchronize()` (the copies landed)", *cell("dump_landed_ms", "floor_ms")),
        ("mock: the step file read into a reused pinned buffer", *cell("read_ms")),
        ("mock: one host-to-device copy of it", *cell("h2d_ms")),
        ("mock: read + copy (the reference)", *((NOT_MEASURED, "—") if reference is None
                                                 else (f"{reference:.1f}", "1.00×"))),
        ("mock: the mock call, `device: cuda`, prefetch off (synchronized)",
         *((NOT_MEASURED, "—") if result is None or reference is None
           else (f"{result['mock_ms']:.1f}", f"{result['mock_ms'] / reference:.2f}×"))),
        ("mock: the mock call with prefetch, after 1 s of training", *cell("mock_prefetched_ms")),
    ]
    size = "1 GB" if result is None else f"{result['bytes'] / 1e9:.2f} GB"
    lines = [f"| {size} CUDA batch | ms | ratio |", "|---|---:|---:|"]
    lines += [f"| {what} | {ms} | {ratio} |" for what, ms, ratio in rows]
    if result is not None:
        lines += ["", f"Ratios: dump rows against the floor, mock rows against read + copy. Median of "
                      f"{result['repeat']} rounds after a warm-up. Replayed batch bit-identical to the "
                      f"recorded one, on the device: {'yes' if result['mock_bitwise_equal'] else '**no**'}."]
    return "\n".join(lines)


def main_transfers(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    if not torch.cuda.is_available() or not args.device.startswith("cuda"):
        print(f"no CUDA device (torch {torch.__version__}): the transfer measurements need one; "
              f"{NOT_MEASURED}.\n\n{render_transfers(None)}")
        if args.json is not None:
            args.json.write_text(json.dumps({"transfers": None, "skipped": "no CUDA device"}))
        return 0
    started = time.perf_counter()
    result = transfers(args.transfer_mb, max(3, args.repeat), args.device)
    result["repeat"] = max(3, args.repeat)
    seconds = time.perf_counter() - started
    table = render_transfers(result)
    print(table)
    path = args.json or RESULTS / f"bench_gpu_transfers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(SCRIPT.parent), "argv": argv, "transfers": result,
                                "table": table}, indent=1))
    print(f"\nwrote {path} ({seconds:.0f} s)")
    if args.update_readme:
        body = (f"`python benchmarks/bench_gpu.py {' '.join(argv)}`, run on {time.strftime('%Y-%m-%d')} on "
                f"{result['gpu']} (torch {result['torch']}, CUDA {result['cuda']}).\n\n{table}")
        update_readme(TRANSFERS_TAG, body)
        update_readme(TRANSFERS_TAG, body, path=PERFORMANCE_DOCS)
        print("updated benchmarks/README.md and docs/performance.md")
    return 0


# --------------------------------------------------------------------------- the parent


def child_env(config: Config) -> dict[str, str]:
    """This environment without any determinism variable, plus the configuration's own."""
    hidden = {*FINGERPRINT_ENV_VARS, SEED_VAR, PROFILE_VAR, TF32_VAR}
    env = {name: value for name, value in os.environ.items() if name not in hidden}
    return env | config.env


def summarise(name: str, runs: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One row from the runs of one configuration."""
    row: dict[str, Any] = {"config": name, "runs": len(runs)}
    if any(run is None for run in runs):
        row["error"] = "child process failed (its stderr is printed above)"
        return row
    done = [run for run in runs if run is not None]
    errors = sorted({run["error"] for run in done if "error" in run})
    if errors:
        row["error"] = errors[0]
    checks = [run["check"] for run in done]
    row["check"] = next((check for check in checks if check["agreed"] is False), checks[0])  # the worst
    row["check_consistent"] = all(c["agreed"] == checks[0]["agreed"] for c in checks)
    row["too_late"] = sorted({v for run in done for v in run.get("too_late", [])})
    timed = [run for run in done if "step_s" in run]
    if timed:
        medians = [run["step_s"] for run in timed]
        row.update(step_s=statistics.median(medians), step_min_s=min(medians), step_max_s=max(medians))
    if len(timed) >= 2 and not errors:
        row["bitwise_equal"] = len({run["digest"] for run in timed}) == 1
        losses = [run["losses"] for run in timed]
        row["first_differing_step"] = next(
            (i for i, values in enumerate(zip(*losses)) if len(set(values)) > 1), None)
    return row


def _check_cell(row: dict[str, Any]) -> str:
    check = row.get("check")
    if check is None:
        return "—"
    if not check["ran"]:
        return "nothing to check" + (" (no CUDA device)" if "no CUDA device" in check["skipped"] else "")
    parts = []
    for device in check["devices"]:
        if device["error"]:
            parts.append(f"error: {device['error'][:80]}")
        elif device["agreed"]:
            parts.append("agreed")
        else:
            parts.append(f"**disagreed** ({', '.join(device['differing'])})")
    mixed = "" if row.get("check_consistent", True) else " (not in every run)"
    return "; ".join(parts) + mixed


def _equal_cell(row: dict[str, Any]) -> str:
    if "bitwise_equal" not in row:
        return "—"
    if row["bitwise_equal"]:
        return "yes"
    step = row.get("first_differing_step")
    return "**no**" + (f" (loss from step {step})" if step is not None else " (final parameters)")


def render(rows: dict[str, dict[str, Any]] | None, steps: int = 0, runs: int = 0) -> str:
    """The Markdown table; ``rows=None`` gives the table with no figures (not measured yet)."""
    lines = [
        "| configuration | sets | step ms | vs `none` | runs bitwise equal | atomics self-check | note |",
        "|---|---|---:|---:|---|---|---|",
    ]
    base = (rows or {}).get("none", {}).get("step_s")
    for name, config in CONFIGS.items():
        if rows is None:
            lines.append(f"| `{name}` | {config.sets} | {NOT_MEASURED} | — | — | — | {config.note} |")
            continue
        if name not in rows:
            continue
        row = rows[name]
        if "step_s" in row:
            step = f"{row['step_s'] * 1e3:.1f}"
            if runs > 1:
                step += f" ({row['step_min_s'] * 1e3:.1f}–{row['step_max_s'] * 1e3:.1f})"
            ratio = f"{row['step_s'] / base:.2f}×" if base else "—"
        else:
            step, ratio = f"raises: {row.get('error', '?')[:120]}", "—"
        note = config.note + (f"; too late: {', '.join(row['too_late'])}" if row.get("too_late") else "")
        lines.append(f"| `{name}` | {config.sets} | {step} | {ratio} | {_equal_cell(row)} | {_check_cell(row)} "
                     f"| {note} |")
    if rows is not None:
        lines += ["", f"Step ms: median of {steps} timed steps per run, then of {runs} run(s) (each a fresh "
                      "process; the range of the runs in brackets)."]
    return "\n".join(lines)


def failures(rows: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with the profile rows: the script's exit status."""
    found = []
    for name, row in rows.items():
        if CONFIGS[name].profile is None:
            continue
        if "error" in row:
            found.append(f"{name}: {row['error']}")
        if row.get("check", {}).get("agreed") is False:
            found.append(f"{name}: the self-check disagreed ({_check_cell(row)})")
        if row.get("bitwise_equal") is False:
            found.append(f"{name}: two runs ended with different parameters ({_equal_cell(row)})")
    return found


def _describe(info: dict[str, Any], gpu: dict[str, Any] | None) -> str:
    m = info["machine"]
    where = (f"{gpu['name']}, torch {gpu['torch']}, CUDA {gpu['cuda']}, cuDNN {gpu['cudnn']}"
             if gpu else f"CPU only, torch {m['torch']}")
    return f"{where}; host {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 30; --tiny: 3)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2, help="runs per configuration, each a fresh process")
    parser.add_argument("--configs", default="", help="comma list of configurations (default: all; see --list)")
    parser.add_argument("--tiny", action="store_true", help="a toy model (the CPU smoke test)")
    parser.add_argument("--list", action="store_true", help="print the configurations and exit")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true",
                        help="rewrite the bench_gpu sections of benchmarks/README.md and docs/determinism.md")
    parser.add_argument("--transfers", action="store_true",
                        help="measure CUDA batches in dump and mock mode instead (see above)")
    parser.add_argument("--transfer-mb", type=int, default=1024, help="--transfers: the batch in MB (default 1024)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = TINY if args.tiny else Size()
    steps = args.steps if args.steps is not None else (3 if args.tiny else 30)
    if args.list:
        for config in CONFIGS.values():
            print(f"{config.name:40} {config.sets}")
        return 0
    if args.child is not None:
        print(json.dumps(child(CONFIGS[args.child], args.device, size, steps, args.warmup)))
        return 0
    if args.transfers:
        if args.update_readme and not args.device.startswith("cuda"):
            parser.error("--update-readme needs --device cuda: the tables hold GPU figures")
        return main_transfers(args, argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; --list shows them")
    if steps < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--steps and --repeat must be at least 1, --warmup at least 0")
    if args.update_readme and not args.device.startswith("cuda"):
        parser.error("--update-readme needs --device cuda: the tables hold GPU figures")
    info = {"machine": machine(SCRIPT.parent), "argv": argv, "size": asdict(size), "steps": steps,
            "warmup": args.warmup, "repeat": args.repeat}
    print(json.dumps(info), flush=True)
    started = time.perf_counter()
    child_args = ["--device", args.device, "--steps", str(steps), "--warmup", str(args.warmup)]
    child_args += ["--tiny"] if args.tiny else []
    runs: dict[str, list[dict[str, Any] | None]] = {name: [] for name in names}
    for round_index in range(args.repeat):  # interleaved: drift spreads over every row alike
        for name in names:
            result = run_child(SCRIPT, [name, *child_args], timeout=300, env=child_env(CONFIGS[name]))
            runs[name].append(result)
            done = f"{result['step_s'] * 1e3:.1f} ms" if result and "step_s" in result else (result or {}).get("error")
            print(f"round {round_index + 1}/{args.repeat} {name}: {done}", flush=True)
    seconds = time.perf_counter() - started
    rows = {name: summarise(name, results) for name, results in runs.items()}
    gpu = next((run["gpu"] for results in runs.values() for run in results if run and "gpu" in run), None)
    table = render(rows, steps, args.repeat)
    print("\n" + table)
    path = args.json or RESULTS / f"bench_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**info, "gpu": gpu, "rows": rows, "runs": runs, "seconds": seconds,
                                "table": table}, indent=1))
    print(f"\nwrote {path} ({seconds:.0f} s)")
    if args.update_readme:
        command = " ".join(["python benchmarks/bench_gpu.py", *argv])
        body = (f"`{command}`, run on {time.strftime('%Y-%m-%d')} in {seconds:.0f} s. "
                f"{_describe(info, gpu)}\n\n{table}")
        update_readme(TAG, body)
        update_readme(TAG, body, path=DOCS)
        print("updated benchmarks/README.md and docs/determinism.md")
    problems = failures(rows)
    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
