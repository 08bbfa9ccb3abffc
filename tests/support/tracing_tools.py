"""Tools of the tracing end-to-end test (`TOOLLOOP_TOOL_MODULES=tests.support.tracing_tools`): one that takes
a password, one that fails transiently before it succeeds (a retried call), one slow enough to outlive its
orchestrator."""

from __future__ import annotations

import time
from functools import lru_cache

import redis

from workers import TransientToolError, tool
from workers.settings import get_worker_settings


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


@tool()
def trace_login(user: str, password: str) -> str:
    """Log a user in (the password is never shown, nor traced)."""
    return f"{user} logged in with a password of {len(password)} characters"


@tool(retries=2, retry_backoff=0.1, retry_backoff_max=0.2)
def trace_flaky(key: str) -> str:
    """Fail transiently on the first execution under `key`, then succeed."""
    runs = int(_redis().incr(f"trace:runs:{key}"))
    if runs == 1:
        raise TransientToolError("the backend is busy, try again")
    return f"run {runs} of {key}"


@tool(soft_time_limit=30, time_limit=40)
def trace_sleep(seconds: float) -> str:
    """Sleep for `seconds`, then say so."""
    time.sleep(seconds)
    return f"slept {seconds} s"
