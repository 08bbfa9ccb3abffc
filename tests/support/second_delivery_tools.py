"""Tools for the second-delivery test (`tests/integration/test_second_delivery.py`), served by its own worker.

Each tool records every run of its body the moment it starts (`RUNS + tag`, one entry per run), then holds
until the test releases it (`RELEASE + tag`), so that the test decides when the first copy of a call ends
and can deliver a second copy meanwhile. One tool is idempotent by its arguments, the other is not.
"""

from __future__ import annotations

import json
import os

import redis

from workers import ToolContext, tool
from workers.settings import get_worker_settings

RUNS = "second-delivery:runs:"
RELEASE = "second-delivery:release:"
# A body never released gives up before its soft limit, so a broken test ends with an outcome, not a kill.
HOLD_MAX_S = 40


def _hold(tag: str, ctx: ToolContext) -> dict[str, int]:
    client = redis.Redis.from_url(get_worker_settings().redis_url)
    try:
        started = {"pid": os.getpid(), "attempt": ctx.attempt, "call_id": ctx.call_id}
        run = int(client.rpush(RUNS + tag, json.dumps(started)))
        if client.blpop([RELEASE + tag], timeout=HOLD_MAX_S) is None:
            raise RuntimeError(f"not released within {HOLD_MAX_S} s")
        return {"run": run}
    finally:
        client.close()


@tool(soft_time_limit=50, time_limit=60)
def held_plain(tag: str, ctx: ToolContext) -> dict[str, int]:
    """Not idempotent: records that its body started, then holds until released."""
    return _hold(tag, ctx)


@tool(soft_time_limit=50, time_limit=60, idempotency="args")
def held_idempotent(tag: str, ctx: ToolContext) -> dict[str, int]:
    """Idempotent by its arguments: records that its body started, then holds until released."""
    return _hold(tag, ctx)
