"""Tools of the partition scenarios (`TOOLLOOP_TOOL_MODULES=tests.faults.partition_tools`): no Redis of their
own, so that a worker cut off from Redis still finishes them; their limits short, so that the lost-call
rule's first look (hard limit + grace) comes well within a partition."""

from __future__ import annotations

import time

from workers import tool


@tool(soft_time_limit=3, time_limit=5)
def partition_work(tag: str, seconds: float = 1.0) -> str:
    """Work that takes `seconds` and says which call it was."""
    time.sleep(seconds)
    return f"done {tag}"
