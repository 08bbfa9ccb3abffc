"""Tools that report progress (`ctx.progress`), run by real workers in the progress tests.

`progress_steps` reports one step at a time, slower than the rate limit, with its `api_key` argument (a
sensitive one) in every message; `progress_burst` reports far faster than the rate limit allows;
`progress_through_freeze` reports, then waits for the test to freeze Redis and reports again, coordinating
through files (Redis is frozen meanwhile).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.waiting import wait_at_most
from workers import ToolContext, tool

FREEZE_WAIT_S = 20.0


@tool(soft_time_limit=20, time_limit=30)
def progress_steps(api_key: str, steps: int, pause_s: float, ctx: ToolContext) -> str:
    """Works `steps` steps of `pause_s` each, reporting each one with its fraction."""
    for step in range(1, steps + 1):
        ctx.progress(f"step {step} of {steps} with key {api_key}", fraction=step / steps)
        time.sleep(pause_s)
    return f"{steps} steps done"


@tool(soft_time_limit=20, time_limit=30)
def progress_burst(reports: int, ctx: ToolContext) -> str:
    """Reports `reports` times in a tight loop, then returns."""
    for index in range(1, reports + 1):
        ctx.progress(f"item {index}", fraction=index / reports)
    return f"{reports} reported"


@tool(soft_time_limit=40, time_limit=50)
def progress_through_freeze(flag_dir: str, reports: int, ctx: ToolContext) -> str:
    """Reports once, writes `reported`, waits for `frozen` (the test froze Redis) and past the rate limit,
    reports `reports` times more, then writes `returned` with how long each of those reports held it, and
    returns."""
    flags = Path(flag_dir)
    ctx.progress("before the freeze", fraction=0.0)
    (flags / "reported").touch()
    wait_at_most((flags / "frozen").exists, FREEZE_WAIT_S, poll_s=0.02)
    time.sleep(0.3)  # past the rate limit: the first report below goes to Redis at once
    held_s = []
    for index in range(reports):
        started = time.monotonic()
        ctx.progress(f"during the freeze {index}", fraction=(index + 1) / reports)
        held_s.append(time.monotonic() - started)
    (flags / "returned").write_text(json.dumps(held_s))
    return "survived"
