"""Sensitive tools a hostile model tries to reach (`TOOLLOOP_TOOL_MODULES=...,tests.hostile.hostile_tools`).

Each counts its runs in Redis: the tests prove they never ran.
"""

from __future__ import annotations

import redis

from workers import tool
from workers.settings import get_worker_settings

RUNS = "hostile:runs:"


def _count(name: str) -> None:
    redis.Redis.from_url(get_worker_settings().redis_url).incr(RUNS + name)


@tool(soft_time_limit=5, time_limit=10)
def delete_file(path: str) -> str:
    """Delete a file (sensitive by its name: never offered unless a turn names it)."""
    _count("delete_file")
    return f"deleted {path}"


@tool(soft_time_limit=5, time_limit=10, sensitive=True)
def transfer_funds(amount: float, to: str) -> str:
    """Move money (sensitive by declaration)."""
    _count("transfer_funds")
    return f"sent {amount} to {to}"
