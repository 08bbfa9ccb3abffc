"""Tools the end-to-end tests run on real prefork workers (`TOOLLOOP_TOOL_MODULES=tests.support.e2e_tools`).

Each one makes a fault observable: a slow one to cancel or outlast a deadline, a stubborn one that swallows
the soft limit so only the hard limit stops it, counted ones that record every execution in Redis so a test
can prove a tool ran exactly once, and one that needs a person's confirmation.
"""

from __future__ import annotations

import time
from functools import lru_cache

import redis
from celery.exceptions import SoftTimeLimitExceeded

from workers import tool
from workers.settings import get_worker_settings

COUNTER_PREFIX = "e2e:runs:"


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def count_runs(key: str) -> int:
    """Record one execution under `key`; returns how many there have been."""
    return int(_redis().incr(COUNTER_PREFIX + key))


@tool()
def e2e_add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool()
def e2e_multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@tool(soft_time_limit=60, time_limit=90)
def e2e_sleep(seconds: float) -> str:
    """Sleep for `seconds`, then say so: long enough to be cancelled or outlast a deadline."""
    time.sleep(seconds)
    return f"slept {seconds} s"


@tool(soft_time_limit=1, time_limit=2)
def e2e_stubborn(seconds: float) -> str:
    """Sleep for `seconds` and ignore the soft time limit, so that only the hard limit ends it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            # Swallowed on purpose: a tool's broad except is exactly what the hard limit guards against.
            continue
    return "finished"


@tool(idempotency="args", soft_time_limit=20, time_limit=30)
def e2e_counted(key: str, seconds: float = 0.0) -> str:
    """Count one execution under `key` in Redis, sleep `seconds`, and report the count."""
    runs = count_runs(key)
    time.sleep(seconds)
    return f"run {runs} of {key}"


@tool(retries=1, soft_time_limit=4, time_limit=5)
def e2e_fragile(key: str, seconds: float) -> str:
    """Sleep `seconds` on the first execution only (long enough to kill its worker), then answer at once."""
    runs = count_runs(key)
    if runs == 1:
        time.sleep(seconds)
    return f"run {runs} of {key}"


@tool(requires_confirmation=True)
def e2e_transfer(amount: float, to: str) -> str:
    """Move money: runs only once a person approved the call."""
    count_runs(f"transfer:{to}")
    return f"sent {amount} to {to}"
