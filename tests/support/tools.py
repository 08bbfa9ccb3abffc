"""Tools the integration tests call through a real worker; each one provokes one behaviour.

Real executions are counted in Redis (`count:<tag>`), so a test can tell a replay from a run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import redis

from workers import ToolContext, TransientToolError, tool
from workers.settings import get_worker_settings

COUNT_PREFIX = "toolloop-test:count:"


def _client() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def count(tag: str) -> int:
    """Increment and return the execution counter of `tag`."""
    return int(_client().incr(COUNT_PREFIX + tag))


@tool(soft_time_limit=5, time_limit=10)
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


@tool(soft_time_limit=5, time_limit=10)
def boom(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


@tool(soft_time_limit=1, time_limit=4)
def sleepy(seconds: float) -> str:
    """Sleeps; does not catch its soft limit."""
    time.sleep(seconds)
    return "woke"


@tool(soft_time_limit=0.5, time_limit=1.5)
def spin(tag: str) -> int:
    """CPU-bound and swallows every exception, so only the hard limit stops it."""
    count(tag)
    n = 0
    while True:
        # Swallows everything, the soft limit included, wherever it lands, as a careless tool would.
        with contextlib.suppress(BaseException):
            while True:
                n += 1


@tool(soft_time_limit=5, time_limit=10, retries=1, retry_backoff=0.1, retry_backoff_max=0.2)
def die_once(tag: str) -> str:
    """SIGKILLs its own process on the first attempt; the retry survives."""
    if count(tag) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@tool(soft_time_limit=5, time_limit=10, retries=0)
def die_always(tag: str) -> str:
    """SIGKILLs its own process every time: no retries, so the outcome is worker_lost."""
    count(tag)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool(soft_time_limit=5, time_limit=10, retries=3, retry_backoff=0.1, retry_backoff_max=0.4)
def flaky(tag: str, failures: int, ctx: ToolContext) -> dict[str, Any]:
    """Raises TransientToolError for its first `failures` attempts."""
    n = count(tag)
    if n <= failures:
        raise TransientToolError(f"attempt {n} failed")
    return {"runs": n, "attempt": ctx.attempt, "key": ctx.idempotency_key}


@tool(soft_time_limit=5, time_limit=10, idempotency="args")
def idem(tag: str, value: int) -> dict[str, int]:
    """Idempotent by its arguments; counts real runs."""
    return {"value": value, "runs": count(tag)}


@tool(soft_time_limit=5, time_limit=10, idempotency="key:fixed-report")
def fixed_key(tag: str, value: int) -> dict[str, int]:
    """Idempotent under one fixed key."""
    return {"value": value, "runs": count(tag)}


@tool(soft_time_limit=5, time_limit=10, max_result_bytes=1000)
def big(size: int) -> str:
    """Returns a result larger than its max_result_bytes."""
    return "x" * size


@tool(soft_time_limit=5, time_limit=10, max_args_bytes=100)
def small_args(text: str) -> str:
    """Refuses large arguments before dispatch."""
    return text


@tool(soft_time_limit=5, time_limit=10)
def not_json() -> Any:
    """Returns something JSON cannot carry."""
    return {1, 2, 3}


@tool(soft_time_limit=5, time_limit=10)
def counted(tag: str, sleep_s: float = 0.0) -> int:
    """Counts its real runs, optionally after a pause."""
    time.sleep(sleep_s)
    return count(tag)


@tool(soft_time_limit=5, time_limit=10)
def whoami(ctx: ToolContext) -> dict[str, Any]:
    """Returns the context it received."""
    return {"user": ctx.context.get("user"), "call_id": ctx.call_id, "attempt": ctx.attempt}


@tool(soft_time_limit=5, time_limit=10, sensitive=True)
def secret_tool() -> str:
    """Sensitive: only callable when named."""
    return "hidden"
