"""A slow tool that notes when each call starts, run by one worker process in
tests/integration/test_priorities.py (`concurrency_tools.note_run` lines: `start <epoch s> <label>`)."""

from __future__ import annotations

import time

from tests.support.concurrency_tools import note_run
from workers import tool


@tool(queue="toolloop.priority_test", soft_time_limit=20, time_limit=30)
def slow_note(runs_file: str, label: str, seconds: float) -> str:
    """Note the start of this call under `label`, then take `seconds`."""
    note_run(runs_file, "start", label)
    time.sleep(seconds)
    return label
