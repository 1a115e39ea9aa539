"""Comparing runs and reading dumps: metrics, ``verify``, ``diff``, readable traces, plots,
and the pytest plugin that turns them into a precision-regression job."""

__all__: list[str] = []
