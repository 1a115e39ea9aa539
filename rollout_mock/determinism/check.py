"""The self-check: a tiny atomics workload run twice on each visible GPU (``apply(check=True)``).

CUDA's ``index_add_`` and ``scatter_add_`` add duplicate indices with atomics, in whatever order
the threads finish; float32 addition is not associative, so two runs of the same call usually
differ in the low bits. With ``torch.use_deterministic_algorithms(True)`` torch switches to
sorted, ordered implementations and the two runs agree bit for bit. A float32 matmul is in the
workload too: torch refuses to run cuBLAS under deterministic algorithms when
``CUBLAS_WORKSPACE_CONFIG`` is not set, and that refusal is reported like a disagreement.

Agreement with the switches on is what the check is for: a disagreement means a switch did not
take. Agreement with the switches off proves nothing (atomics *may* happen to add in the same
order), so the result carries the state of torch's switch at the time of the check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

from rollout_mock.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceCheck", "SelfCheck", "self_check"]

_ROWS: Final = 512
_DIM: Final = 64
_ADDS: Final = 1 << 18  # 262,144 source rows: about 512 additions onto each output element
_MATMUL: Final = 256

#: What one run of the check does (it runs twice per device on the same inputs).
WORKLOAD: Final = (
    f"float32 index_add_ of {_ADDS:,} rows of {_DIM} onto {_ROWS} rows, scatter_add_ of {_ADDS:,} "
    f"values onto {_ROWS}, and a {_MATMUL}x{_MATMUL} float32 matmul; twice, on the same inputs"
)


@dataclass(frozen=True)
class DeviceCheck:
    """The check on one GPU.

    ``agreed`` is True when both runs gave the same bits for every output; ``differing`` names the
    outputs that did not; ``error`` is the first line of the exception a run raised (for example
    torch refusing cuBLAS without ``CUBLAS_WORKSPACE_CONFIG``), in which case ``agreed`` is False.
    """

    device: str
    name: str
    agreed: bool
    differing: tuple[str, ...] = ()
    error: str | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        """One line: ``cuda:0 (NVIDIA H100) agreed``, or what disagreed or failed."""
        head = f"{self.device} ({self.name})"
        if self.error is not None:
            return f"{head} could not run it: {self.error}"
        if self.agreed:
            return f"{head} agreed"
        return f"{head} DISAGREED on {', '.join(self.differing)}"


@dataclass(frozen=True)
class SelfCheck:
    """What :func:`self_check` ran and found.

    ``devices`` holds one :class:`DeviceCheck` per GPU checked, empty when nothing ran; then
    ``skipped`` says why. ``deterministic_algorithms`` is torch's switch when the check ran.
    """

    devices: tuple[DeviceCheck, ...]
    deterministic_algorithms: bool
    skipped: str | None = None
    workload: str = WORKLOAD

    @property
    def ran(self) -> bool:
        """True when at least one GPU was checked."""
        return bool(self.devices)

    @property
    def agreed(self) -> bool | None:
        """True when every GPU agreed, False when one did not, None when nothing ran."""
        if not self.devices:
            return None
        return all(device.agreed for device in self.devices)

    def summary(self) -> str:
        """One line for a log: what ran where, or why nothing did."""
        switch = "on" if self.deterministic_algorithms else "off"
        if not self.ran:
            return f"determinism self-check: nothing to check: {self.skipped}"
        seconds = sum(device.seconds for device in self.devices)
        where = "; ".join(device.describe() for device in self.devices)
        return (
            f"determinism self-check (atomics run twice, deterministic algorithms {switch}, "
            f"{seconds:.2f} s): {where}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "ran": self.ran,
            "agreed": self.agreed,
            "skipped": self.skipped,
            "deterministic_algorithms": self.deterministic_algorithms,
            "workload": self.workload,
            "devices": [{**asdict(d), "differing": list(d.differing)} for d in self.devices],
        }


def _inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed inputs, drawn from a private CPU generator: the user's random streams are untouched."""
    import torch

    generator = torch.Generator().manual_seed(0)
    index = torch.randint(0, _ROWS, (_ADDS,), generator=generator)
    source = torch.randn(_ADDS, _DIM, generator=generator)
    square = torch.randn(_MATMUL, _MATMUL, generator=generator)
    return index.to(device), source.to(device), square.to(device)


def _outputs(
    index: torch.Tensor, source: torch.Tensor, square: torch.Tensor
) -> dict[str, torch.Tensor]:
    """One run of the workload on the inputs' device."""
    import torch

    device = source.device
    return {
        "index_add_": torch.zeros(_ROWS, _DIM, device=device).index_add_(0, index, source),
        "scatter_add_": torch.zeros(_ROWS, device=device).scatter_add_(0, index, source[:, 0]),
        "matmul": square @ square,
    }


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _run_twice(device: torch.device) -> tuple[tuple[str, ...], str | None]:
    """The outputs that differ between two runs on ``device`` (any device), or the run's error.

    A RuntimeError (torch's refusal of a nondeterministic op, out of memory, a CUDA error) is the
    answer of the check, not a failure of it: it is returned as the error text.
    """
    import torch

    try:
        inputs = _inputs(device)
        first = _outputs(*inputs)
        second = _outputs(*inputs)
        differing = tuple(name for name in first if not torch.equal(first[name], second[name]))
    except RuntimeError as exc:
        return (), _first_line(exc)
    return differing, None


def _check_device(index: int) -> DeviceCheck:
    import torch

    device = torch.device("cuda", index)
    start = time.perf_counter()
    differing, error = _run_twice(device)
    torch.cuda.synchronize(device)
    return DeviceCheck(
        device=str(device),
        name=torch.cuda.get_device_name(index),
        agreed=error is None and not differing,
        differing=differing,
        error=error,
        seconds=time.perf_counter() - start,
    )


def self_check(devices: Sequence[int] | None = None) -> SelfCheck:
    """Run the atomics workload twice on each GPU in ``devices`` and compare the bits.

    ``devices`` are CUDA device indices; None (default) checks every visible device. Each
    device checked gets a CUDA context (a few hundred MB): in a job where every rank sees every
    GPU, pass this rank's own device (``[torch.cuda.current_device()]``). The check takes well
    under a second per device once CUDA is up, allocates about 70 MB there, draws its inputs from
    its own generator (no random stream of yours moves), and leaves torch's switches alone.

    With no CUDA device visible (CPU, MPS, XPU) nothing runs and ``skipped`` says so. An index
    that is not a visible device raises ConfigError. Errors a run raises (for example torch's
    refusal to run cuBLAS under deterministic algorithms without ``CUBLAS_WORKSPACE_CONFIG``) are
    reported in that device's ``error`` and count as a disagreement.
    """
    import torch

    switch = torch.are_deterministic_algorithms_enabled()
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return SelfCheck(
            (),
            switch,
            skipped="no CUDA device is visible to this process (the check exercises the atomics "
            "of CUDA kernels; it has nothing to run on the CPU)",
        )
    count = torch.cuda.device_count()
    chosen = list(range(count)) if devices is None else list(devices)
    bad = [d for d in chosen if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < count]
    if bad:
        raise ConfigError(
            f"self_check devices {bad!r} are not visible CUDA devices; this process sees "
            f"{count} (indices 0..{count - 1})"
        )
    if not chosen:
        return SelfCheck((), switch, skipped="no device was asked for (devices=[])")
    return SelfCheck(tuple(_check_device(d) for d in chosen), switch)
