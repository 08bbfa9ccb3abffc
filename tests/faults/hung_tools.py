"""Tools of the hung-worker suite (`TOOLLOOP_TOOL_MODULES=tests.faults.hung_tools`), on real prefork workers.

Every body records itself in Redis under its tag — the pool process it ran in and when (`hung:starts:`), and
its completions (`hung:done:`) — so a test can tell which worker ran the body and whether it ran beside a
frozen one. Short limits keep the orchestrator's lost-call timer (hard limit + grace) quick; both tools are
idempotent, and retried once so that the orchestrator dispatches a lost call again.
"""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache

import redis

from workers import tool
from workers.settings import get_worker_settings

STARTS = "hung:starts:"
DONE = "hung:done:"


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def _record_start(tag: str) -> None:
    _redis().rpush(STARTS + tag, json.dumps({"pid": os.getpid(), "at": time.time()}))


@tool(idempotency="args", retries=2, soft_time_limit=4, time_limit=5)
def hung_work(tag: str, seconds: float = 2.0) -> str:
    """Idempotent work of `seconds`: records its start and its completion under `tag`."""
    _record_start(tag)
    time.sleep(seconds)
    _redis().incr(DONE + tag)
    return f"done {tag}"


@tool(idempotency="args", retries=2, soft_time_limit=4, time_limit=5)
def hung_gate(tag: str, fail: bool = False) -> str:
    """Idempotent and quick: records its run under `tag`; with `fail`, then fails (so nothing is stored that
    a later execution could replay: only the fence keeps it from running again)."""
    _record_start(tag)
    if fail:
        raise RuntimeError(f"gate {tag} failed on purpose")
    return f"gate {tag}"
