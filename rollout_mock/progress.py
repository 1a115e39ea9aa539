"""Progress bars: ``tqdm``, quiet unless the stream is a terminal and not under CI."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(total: float, *, stream: TextIO | None = None, enabled: bool | None = None,
                 unit: str = "B", unit_scale: bool = True, desc: str = "") -> Any:
    """A ``tqdm`` bar on ``stream`` (stderr); by default shown only on a TTY outside CI."""
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        isatty = getattr(stream, "isatty", None)
        enabled = bool(isatty and isatty()) and not os.environ.get("CI")
    return tqdm(total=total, file=stream, disable=not enabled or total <= 0, unit=unit,
                unit_scale=unit_scale, desc=desc, delay=0.5, leave=False, dynamic_ncols=True)
