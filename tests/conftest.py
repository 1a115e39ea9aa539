"""Shared test helpers: small scheduler fakes in the shapes of ROLL, verl and AReaL."""

from __future__ import annotations

import importlib.util
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

# Keep torch's CPU results independent of the number of cores the CI machine has.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The bound on waiting for something that must happen (a process ends, a marker file appears, a
#: watchdog reports): there only so that a real hang fails one test instead of blocking the suite.
#: It is never the verdict (the event is), and it is far beyond what a loaded machine needs: the
#: suite must stay green on a 2-CPU machine that other jobs keep busy. ROLLOUT_MOCK_TEST_HANG_S
#: changes it.
HANG_S = float(os.environ.get("ROLLOUT_MOCK_TEST_HANG_S", "600"))


def wait_until(condition: Callable[[], object], what: str, *, bound: float = HANG_S, poll: float = 0.02) -> None:
    """Return as soon as ``condition()`` is true; fail naming ``what`` if it is still false after
    ``bound`` seconds (a hang, not slowness: see :data:`HANG_S`)."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: still not the case after {bound:g} s")
        time.sleep(poll)


def cpu_seconds(action: Callable[[], object]) -> float:
    """The CPU time ``action()`` takes in this process (all its threads): unlike wall-clock time it
    does not grow while other jobs have the CPUs, so "refused quickly" checks stay true on a busy
    machine (runaway work, e.g. a decompression or YAML bomb, still shows)."""
    started = time.process_time()
    action()
    return time.process_time() - started


#: How to install each optional package the tests may need (the reason a skip gives).
INSTALL = {
    "zstandard": "pip install -e '.[compress]'",
    "lz4": "pip install -e '.[compress]'",
    "verl": "pip install --no-deps verl && pip install -e '.[verl]'",
    "transformers": "pip install -e '.[verl]'",
    "ray": "pip install -e '.[ray]'",
    "matplotlib": "pip install -e '.[plot]'",
    "playwright": "pip install -e '.[test]'",
}


def requires(module: str) -> pytest.MarkDecorator:
    """Skip, saying how to install it, when the optional package ``module`` is absent.

    For parametrized cases (``pytest.param("zstd", marks=requires("zstandard"))``) and tests
    that need it only in their body; a module that needs it at import uses ``pytest.importorskip``.
    """
    try:
        missing = importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package of a dotted name is absent
        missing = True
    how = INSTALL.get(module.partition(".")[0], f"pip install {module.partition('.')[0]}")
    return pytest.mark.skipif(missing, reason=f"needs {module} ({how})")


#: Markers that mean "needs this optional package": a marked test is skipped, with the reason, without it.
_MARKER_NEEDS = {"verl": "verl", "ray": "ray"}

#: The first CI tier (``pytest -m fast``, under 3 minutes on 2 CPUs): these folders, less the
#: tests marked below and the files listed (browsers, subprocess-heavy checks, benchmarks' smoke
#: runs); ``pytest -m "not fast"`` is the rest.
_FAST_DIRS = ("unit", "adversarial")
_NOT_FAST_MARKERS = ("slow", "ray", "gpu")
_NOT_FAST_FILES = frozenset({
    "test_benchmarks.py",     # each benchmark's smoke run
    "test_hostile_dumps.py",  # every CLI entry point as a subprocess, per planted file
})


def _fast(item: pytest.Item) -> bool:
    path = Path(str(item.fspath))
    return (path.parent.name in _FAST_DIRS and path.name not in _NOT_FAST_FILES
            and not any(item.get_closest_marker(m) is not None for m in _NOT_FAST_MARKERS))


#: The second tier runs on pytest-xdist workers (``-n 2 --dist loadgroup``, the README's command):
#: each test file is one group, kept on one worker (its module fixtures are made once, its tests run
#: in order), and the files below share the ``serial`` group, one test at a time on one worker: real
#: Ray clusters (two ``ray.init`` at once starve a 2-CPU machine) and moto S3 servers.
_SERIAL_FILES = frozenset({
    "test_s3_store.py", "test_s3_ray.py", "test_bundle.py", "test_flight_recorder_scenario.py",
    "test_hmac_bound_bytes.py",
})
SERIAL = "serial"


def xdist_group(item: pytest.Item) -> str:
    """The pytest-xdist group of ``item`` (see :data:`_SERIAL_FILES`)."""
    path = Path(str(item.fspath))
    if item.get_closest_marker("ray") is not None or path.name in _SERIAL_FILES:
        return SERIAL
    return f"{path.parent.name}/{path.name}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups, and before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {marker: requires(module) for marker, module in _MARKER_NEEDS.items()}
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
        if _fast(item):
            item.add_marker(pytest.mark.fast)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


@pytest.fixture
def dump_dir(tmp_path: Path) -> Path:
    return tmp_path / "dumps"


def cfg(dump_dir: Path, mode: str = "dump", **extra: Any) -> dict[str, Any]:
    """A ``rollout_mock:`` block for tests."""
    return {"enable": True, "mode": mode, "dump_dir": str(dump_dir), **extra}


@contextmanager
def restored_process_state() -> Iterator[None]:
    """Put back the environment, torch's determinism switches, thread count and RNG states
    (the demo pipeline changes them process-wide, as a training script would)."""
    env = dict(os.environ)
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.get_num_threads(),
    )
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags[4], flags[5]
        torch.set_float32_matmul_precision(flags[6])
        torch.set_num_threads(flags[7])
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


@contextmanager
def local_ray_cluster(num_cpus: int = 2, *, hide: tuple[str, ...] = (),
                      runtime_env: dict[str, Any] | None = None) -> Iterator[None]:
    """A real Ray cluster on 127.0.0.1 for the length of the block; ``hide`` names environment
    variables kept away from it (and put back afterwards); ``runtime_env`` goes to ``ray.init``."""
    import ray

    loopback = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved = {name: os.environ.pop(name) for name in (*hide, "RAY_ADDRESS", loopback) if name in os.environ}
    # Ray turns "127.0.0.1" into the machine's outward address unless clustering is off: keep the
    # whole test cluster on the loopback interface.
    os.environ[loopback] = "0"
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    saved_flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if saved_flag is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
                 runtime_env=runtime_env)
        yield
    finally:
        ray.shutdown()
        if saved_flag is not None:
            constants.ENABLE_RAY_CLUSTER = saved_flag
        os.environ.pop(loopback, None)
        os.environ.update(saved)


@pytest.fixture
def progress_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every ``rollout_mock.text.progress_bar`` made: its arguments and ``updates``, the total
    it was advanced by (the bars themselves print nothing)."""
    import rollout_mock.text as progress

    calls: list[dict[str, Any]] = []
    real = progress.progress_bar

    def spy(total: float, **kwargs: Any) -> Any:
        bar = real(total, **{**kwargs, "enabled": False})
        calls.append({"total": total, "updates": 0, **kwargs})
        record, update = calls[-1], bar.update

        def counted(n: float = 1) -> Any:
            record["updates"] += n
            return update(n)

        bar.update = counted
        return bar

    monkeypatch.setattr(progress, "progress_bar", spy)
    return calls
