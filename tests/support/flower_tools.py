"""Tools for the Flower tests, on their own queue so that only those tests' workers serve them.

Each ends a call one way: a success, a raised error (`execution_error`), a transient error then a success
(a retry), a hang past the hard limit (killed), a long sleep (revoked while it runs).
"""

from __future__ import annotations

import contextlib
import os
import time

import redis

from workers import ToolContext, TransientToolError, tool

FLOWER_QUEUE = "flower_test"
# What a failed call's outcome says; the Flower tests look for it in the task's exception.
CLOSED_MESSAGE = "account {account} is closed"


@tool(queue=FLOWER_QUEUE, soft_time_limit=5, time_limit=10)
def lookup_account(account: str, api_token: str) -> str:
    """Look an account up with a secret token (the token must never show in Flower)."""
    return f"account {account} ok (token of {len(api_token)} chars)"


@tool(queue=FLOWER_QUEUE, soft_time_limit=5, time_limit=10)
def close_account(account: str, api_token: str) -> str:
    """Always fails: the account is closed (a tool that raises, as tools do)."""
    raise ValueError(CLOSED_MESSAGE.format(account=account))


@tool(queue=FLOWER_QUEUE, soft_time_limit=60, time_limit=70, retries=1, retry_backoff=2.0)
def flaky_account(account: str, api_token: str, ctx: ToolContext, hold_until: str = "") -> str:
    """Busy on the first attempt (a transient error, retried after a backoff), fine on the second. With
    `hold_until`, the first attempt waits until that Redis key exists: the test decides when it ends."""
    if ctx.attempt == 1:
        if hold_until:
            client = redis.Redis.from_url(os.environ["TOOLLOOP_REDIS_URL"])
            try:
                while not client.exists(hold_until):
                    time.sleep(0.05)
            finally:
                client.close()
        raise TransientToolError(f"account service busy for {account}")
    return f"account {account} ok on attempt {ctx.attempt}"


@tool(queue=FLOWER_QUEUE, soft_time_limit=1, time_limit=2)
def stuck_account(account: str) -> str:
    """Ignores its soft limit (a broad except swallows it) until the hard limit kills it."""
    while True:
        # The point: a tool whose broad except swallows SoftTimeLimitExceeded.
        with contextlib.suppress(Exception):
            time.sleep(0.05)


@tool(queue=FLOWER_QUEUE, soft_time_limit=30, time_limit=40)
def slow_account(account: str, seconds: float) -> str:
    """Sleeps long enough to be revoked while it runs."""
    time.sleep(seconds)
    return f"account {account} slept {seconds} s"
