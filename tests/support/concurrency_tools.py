"""Tools with concurrency limits, run by real workers in tests/integration/test_tool_concurrency.py.

Each notes its start and its end in `runs_file` (`<start|end> <epoch s> <label>`, one line each, appended
in one write), so that the test can count how many ran at once across processes and workers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workers import ToolContext, tool


def note_run(runs_file: str, event: str, label: str) -> None:
    """Append one `<event> <epoch s> <label>` line to `runs_file` in a single write (O_APPEND)."""
    line = f"{event} {time.time():.6f} {label}\n".encode()
    fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_notes(runs_file: Path) -> list[tuple[str, float, str]]:
    """In the test: (event, epoch s, label) of every line so far."""
    if not runs_file.exists():
        return []
    notes = []
    for line in runs_file.read_text().splitlines():
        event, at, label = line.split(" ", 2)
        notes.append((event, float(at), label))
    return notes


def _work(runs_file: str, label: str, seconds: float) -> None:
    note_run(runs_file, "start", label)
    time.sleep(seconds)
    note_run(runs_file, "end", label)


@tool(max_concurrency=2, soft_time_limit=20, time_limit=30)
def limited_pair(runs_file: str, n: int, seconds: float) -> int:
    """At most two run at once across the fleet; answers n * 10."""
    _work(runs_file, str(n), seconds)
    return n * 10


@tool(max_concurrency_per_tenant=1, soft_time_limit=20, time_limit=30)
def one_per_tenant(runs_file: str, n: int, seconds: float, ctx: ToolContext) -> str:
    """At most one runs at once per tenant; answers which tenant it ran for."""
    _work(runs_file, f"{ctx.tenant}:{n}", seconds)
    return f"{ctx.tenant}:{n}"


@tool(max_concurrency=1, soft_time_limit=2, time_limit=3)
def single_slot(runs_file: str, n: int, seconds: float, pid_file: str = "") -> int:
    """One at a time across the fleet, with short limits: its slot expires 11 s after it was taken. With
    `pid_file`, its pool process's id is written there as it starts (to be killed)."""
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    _work(runs_file, str(n), seconds)
    return n
