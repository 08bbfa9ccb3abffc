"""Tools the RabbitMQ tests run on real prefork workers (TOOLLOOP_TOOL_MODULES=tests.support.rabbitmq_tools).

Each counts its executions in Redis, so that a test proves how many times a body ran, and has short limits,
so that a dead worker's call is taken over well within a test's time.
"""

from __future__ import annotations

import time
from functools import lru_cache

import redis
from celery.exceptions import SoftTimeLimitExceeded

from workers import tool
from workers.settings import get_worker_settings

RABBIT_QUEUE = "rabbit"
COUNTER_PREFIX = "rabbit:runs:"


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def count_runs(key: str) -> int:
    """Record one execution under `key`; returns how many there have been."""
    return int(_redis().incr(COUNTER_PREFIX + key))


@tool(idempotency="args", retries=1, soft_time_limit=6, time_limit=8, queue=RABBIT_QUEUE)
def rabbit_counted(key: str, first_run_s: float = 0.0) -> str:
    """Count one execution under `key`; the first one sleeps `first_run_s` (long enough to be killed)."""
    runs = count_runs(key)
    if runs == 1:
        time.sleep(first_run_s)
    return f"run {runs} of {key}"


@tool(retries=1, soft_time_limit=6, time_limit=8, queue=RABBIT_QUEUE)
def rabbit_once(key: str, first_run_s: float = 0.0) -> str:
    """`rabbit_counted` without idempotency: a second execution of one call runs the body again."""
    runs = count_runs(key)
    if runs == 1:
        time.sleep(first_run_s)
    return f"run {runs} of {key}"


@tool(soft_time_limit=1, time_limit=2, queue=RABBIT_QUEUE)
def rabbit_stubborn(seconds: float) -> str:
    """Ignore the soft limit for `seconds`: only the hard limit (the parent kills the child) ends it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            continue  # swallowed on purpose: the hard limit is the guarantee
    return "finished"


# The worker-kill test's own queue: its two workers serve it alone, so the calls land on the worker it kills.
KILL_QUEUE = "rabbit.kill"


@tool(idempotency="args", retries=1, soft_time_limit=6, time_limit=8, queue=KILL_QUEUE)
def rabbit_kill_counted(key: str, first_run_s: float = 0.0) -> str:
    """`rabbit_counted` on the kill test's queue."""
    return rabbit_counted(key, first_run_s)


@tool(retries=1, soft_time_limit=6, time_limit=8, queue=KILL_QUEUE)
def rabbit_kill_once(key: str, first_run_s: float = 0.0) -> str:
    """`rabbit_once` on the kill test's queue."""
    return rabbit_once(key, first_run_s)
