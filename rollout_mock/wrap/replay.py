"""Mock mode: the pre-flight check, the fingerprint check and serving recorded steps."""

from __future__ import annotations

from typing import Any

from rollout_mock._text import logger
from rollout_mock.config import FingerprintPolicy
from rollout_mock.errors import FingerprintMismatchError, IncompleteDumpError
from rollout_mock.storage.base import format_ranges
from rollout_mock.storage.indexed import IndexedStore
from rollout_mock.storage.prefetch import Prefetcher

__all__ = ["ReplayMixin"]



class ReplayMixin:
    """The mock half of :class:`~rollout_mock.wrap.interceptor.Interceptor`."""

    def _open_mock(self) -> None:
        if isinstance(self.store, IndexedStore):
            self.store.require_manifest(mode=self.mode.value, split=self.split)
        recorded = self.store.steps(self.stream)
        if self.config.max_steps is not None and self.split == "train":
            missing = sorted(set(range(self.config.max_steps)) - set(recorded))
            if missing:
                raise IncompleteDumpError(
                    f"[RolloutMock] pre-flight check failed (mode=mock): max_steps="
                    f"{self.config.max_steps} but {self.stream} of {self.config.dump_dir} lacks steps "
                    f"{format_ranges(missing)} (recorded: {format_ranges(recorded)}). Lower max_steps, "
                    f"or dump the missing steps first.",
                    mode=self.mode.value,
                    split=self.split,
                    step=missing[0],
                    path=self.config.dump_dir,
                )
        elif not recorded:
            logger.warning(
                "[RolloutMock] %s has no recorded steps for %s; every call will fail "
                "(recorded streams: %s)",
                self.config.dump_dir,
                self.stream,
                ", ".join(s.key for s in self.store.stream_ids()) or "none"
                if isinstance(self.store, IndexedStore)
                else "?",
            )
        self._check_fingerprint()
        from rollout_mock.debug.expected import describe_expected

        if (note := describe_expected(self.config)) is not None:
            logger.info(note)
        self._prefetcher = Prefetcher(self._load, self._next_recorded, enabled=self.config.prefetch)

    def _check_fingerprint(self) -> None:
        if self.config.fingerprint is FingerprintPolicy.OFF:
            return
        recorded = self.store.fingerprint()
        if not recorded:
            return
        try:
            from rollout_mock.determinism import (
                compare_fingerprints,
                fingerprint,
                format_differences,
            )
        except ImportError:  # pragma: no cover
            return
        differences = compare_fingerprints(recorded, fingerprint())
        if not differences:
            return
        table = format_differences(differences)
        message = (
            f"[RolloutMock] this run's environment differs from the one that recorded "
            f"{self.config.dump_dir}; replayed numbers may not match:\n{table}"
        )
        relevant = any(d.numerics_relevant for d in differences)
        if self.config.fingerprint is FingerprintPolicy.ERROR and relevant:
            raise FingerprintMismatchError(
                message + "\nSet `fingerprint: warn` to only warn.",
                mode=self.mode.value,
                split=self.split,
                path=self.config.dump_dir,
            )
        logger.warning(message)

    def _load(self, step: int) -> Any:
        entry = self.store.entry(self.stream, step)
        if self.config.replay_rows is None and self.config.replay_keys is None:
            batch = self.store.load(self.stream, step, trusted=self.config.trust_pickle)
        else:
            batch = self._load_part(step, entry)
        logger.info(
            "[RolloutMock] Loaded step %d: %s (samples=%s)",
            step,
            self.store.describe_location(self.stream, step),
            None if entry is None else entry.samples,
        )
        return batch

    def _load_part(self, step: int, entry: Any) -> Any:
        """replay_rows / replay_keys: this rank's rows and the wanted keys only."""
        from rollout_mock.storage.partial import load_partial, rank_rows

        if entry is None:
            raise self.store.missing_step_error(self.stream, step, mode=self.mode.value)
        rows = None
        layout = self.config.replay_rows
        if layout is not None:
            if entry.samples is None:
                raise IncompleteDumpError(
                    f"[RolloutMock] replay_rows: step {step} of {self.stream} has no batch dimension "
                    f"recorded ({entry.type}); replay whole batches (remove replay_rows)",
                    mode=self.mode.value, split=self.split, step=step)
            rows = rank_rows(entry.samples, layout.dp_rank, layout.dp_size)
        return load_partial(self.store, self.stream, step, keys=self.config.replay_keys, rows=rows,
                            trusted=self.config.trust_pickle)

    def replay(self, step: int) -> Any:
        assert self._prefetcher is not None
        return self._prefetcher.get(step)

    async def replay_async(self, step: int) -> Any:
        assert self._prefetcher is not None
        return await self._prefetcher.get_async(step)

    @property
    def last_stall(self) -> float:
        return 0.0 if self._prefetcher is None else self._prefetcher.last_stall
