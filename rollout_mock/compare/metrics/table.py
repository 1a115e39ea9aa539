"""A read-only table of metrics: ``table[name][step] -> float``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from rollout_mock.errors import MetricsFormatError

__all__ = ["MetricsTable"]



class MetricsTable(Mapping[str, Mapping[int, float]]):
    """Read-only mapping ``metric name -> {step: value}`` with steps in ascending order.

    ``source`` is the file it was read from and ``format`` one of ``"jsonl"``, ``"csv"``,
    ``"tensorboard"`` (``None`` for tables built in memory).
    """

    def __init__(
        self,
        data: Mapping[str, Mapping[int, float]],
        *,
        source: str | Path | None = None,
        format: str | None = None,
    ) -> None:
        self._data: dict[str, dict[int, float]] = {
            name: {int(s): float(v) for s, v in sorted(series.items())}
            for name, series in data.items()
        }
        self.source = None if source is None else str(source)
        self.format = format

    def __getitem__(self, name: str) -> Mapping[int, float]:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def steps(self) -> list[int]:
        """Every step that any metric was logged at, ascending."""
        return sorted({s for series in self._data.values() for s in series})

    def describe(self) -> str:
        """One line: source, format, metric count and step range (for reports)."""
        steps = self.steps
        span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
        src = self.source or "<memory>"
        return f"{src} ({self.format or 'table'}, {len(self)} metrics, {span})"

    def __repr__(self) -> str:
        return f"MetricsTable({self.describe()})"


class _TableBuilder:
    """Accumulates values and refuses duplicated ``(metric, step)`` pairs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, dict[int, float]] = {}
        self.where: dict[tuple[str, int], str] = {}

    def add(self, name: str, step: int, value: float, where: str) -> None:
        series = self.data.setdefault(name, {})
        if step in series:
            raise MetricsFormatError(
                f"{self.path}: metric {name!r} logged twice for step {step} ({self.where[(name, step)]} "
                f"and {where}); a resumed run must not re-log steps: truncate the file to the resume "
                "step or log into a new file",
                path=self.path,
                step=step,
            )
        series[step] = value
        self.where[(name, step)] = where

    def build(self, fmt: str) -> MetricsTable:
        if not self.data:
            raise MetricsFormatError(
                f"{self.path}: contains no metrics (empty file, or only steps without values)",
                path=self.path,
            )
        return MetricsTable(self.data, source=self.path, format=fmt)


# --------------------------------------------------------------------------------------------
