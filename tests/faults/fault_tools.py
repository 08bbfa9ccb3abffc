"""Tools the fault suite runs on real prefork workers (`TOOLLOOP_TOOL_MODULES=tests.faults.fault_tools`).

Every execution is recorded in Redis: `starts` when a run begins, `done` (and the pool process that got there)
when it returns, so a test can tell "started twice because its first worker was killed" (allowed) from "ran
to completion twice" (never for an idempotent tool — unless the process that completed it first was killed
before its outcome was written, a window no worker can close without the tool's help).
"""

from __future__ import annotations

import contextlib
import os
import time
from functools import lru_cache

import redis

from workers import tool
from workers.settings import get_worker_settings

STARTS = "faults:starts:"
DONE = "faults:done:"
DONE_BY = "faults:done-by:"


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


@tool(
    idempotency="args", retries=3, retry_backoff=0.1, retry_backoff_max=0.5, soft_time_limit=10, time_limit=20
)
def fault_work(tag: str, seconds: float = 0.2) -> str:
    """Idempotent work that takes `seconds`; counts its starts and its completions under `tag`."""
    _redis().incr(STARTS + tag)
    time.sleep(seconds)
    _redis().rpush(DONE_BY + tag, os.getpid())
    _redis().incr(DONE + tag)
    return f"done {tag}"


@tool(soft_time_limit=0.5, time_limit=1.5)
def fault_hang(tag: str) -> str:
    """Never returns: swallows every exception, the soft limit included; only the hard limit ends it."""
    _redis().incr(STARTS + tag)
    while True:
        with contextlib.suppress(BaseException):
            time.sleep(0.05)


@tool(soft_time_limit=20, time_limit=40)
def fault_huge(megabytes: int) -> str:
    """Returns `megabytes` MB of text: far over the default max_result_bytes."""
    return "x" * (megabytes * 1024 * 1024)
