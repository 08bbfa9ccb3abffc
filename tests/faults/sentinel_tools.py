"""The tool the Sentinel fault test runs (`TOOLLOOP_TOOL_MODULES=tests.faults.sentinel_tools`).

It counts its starts in the Redis behind Sentinel — opened as every toolloop process opens it, through
`workers.connect` with the worker's own settings — so that the test can fail the master over once work is
under way. Its hard limit is short and it may be retried: a call whose message or outcome the old master took
and then dropped (writes in the moments before the sentinels switch) is found lost soon after its hard limit
(the orchestrator's lost-call grace) and dispatched again. It is not idempotent: an idempotency lock taken
just before a failover can outlive its release, which the old master took and dropped, and a retry of that
call within the lock's life would be answered `timeout` (docs/operations/sentinel.md says so; the
lock itself is tested with hung workers, `tests/faults/test_hung_worker.py`).
"""

from __future__ import annotations

import contextlib
import time
from functools import lru_cache

import redis

from workers import tool
from workers.connect import connect_redis
from workers.settings import get_worker_settings

STARTS = "sentinel-faults:starts"


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    settings = get_worker_settings()
    return connect_redis(settings.redis_url, master_name=settings.redis_master_name)


@tool(retries=3, retry_backoff=0.1, soft_time_limit=4, time_limit=6)
def sentinel_work(tag: str, seconds: float = 0.3) -> str:
    """Work that takes `seconds`; counts its starts (a count lost to a failover fails no call)."""
    with contextlib.suppress(redis.RedisError):
        _redis().incr(STARTS)
    time.sleep(seconds)
    return f"done {tag}"
