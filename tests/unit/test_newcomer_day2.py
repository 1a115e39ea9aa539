"""A newcomer's second day (issue 30): each friction reproduced, then checked gone."""

from __future__ import annotations

import pydoc
import re
from pathlib import Path

import pytest

import rollout_mock

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ help() shows plain text
@pytest.mark.parametrize("name", ["MockScheduler", "wrap_scheduler", "mock_class", "open_dump", "Dump", "load_step",
                                  "load_config", "wrap_trl", "MetricsWriter", "verify", "diff_dumps"])
def test_help_on_the_public_api_is_plain_text(name: str) -> None:
    text = pydoc.render_doc(getattr(rollout_mock, name), renderer=pydoc.plaintext)
    assert re.findall(r"``|:[a-z]+:`", text) == []
    assert [line for line in text.splitlines() if line.strip(" |").startswith("# ")] == []


def test_help_on_mock_scheduler_names_the_typed_entry_point() -> None:
    text = pydoc.render_doc(rollout_mock.MockScheduler, renderer=pydoc.plaintext)
    assert "wrap_scheduler is the typed entry point" in text
    assert "load_config takes" in text  # ":func:`~rollout_mock.load_config` takes", rendered
