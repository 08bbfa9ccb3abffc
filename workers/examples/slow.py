"""A slow tool: sleeps, and returns what it managed when its soft time limit interrupts it."""

from __future__ import annotations

import time
from typing import Annotated

from billiard.exceptions import SoftTimeLimitExceeded
from pydantic import Field

from workers import tool


@tool(soft_time_limit=10, time_limit=15)
def slow(seconds: Annotated[float, Field(ge=0, le=3600)] = 1.0) -> dict[str, float | bool]:
    """Sleep for a number of seconds, then report how long it slept.

    If the soft time limit interrupts the sleep, it returns a partial result instead of failing.

    Args:
        seconds: how long to sleep
    """
    started = time.monotonic()
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return {"slept_s": round(time.monotonic() - started, 3), "completed": False}
    return {"slept_s": round(time.monotonic() - started, 3), "completed": True}
