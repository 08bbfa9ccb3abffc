"""A Redis outage whose failed tries are counted, so that a test of a send retried while Redis is away waits
for tries, never for time.

    outage = CountingOutage(url)
    publisher = Publisher(app, RedisRetry(outage))
    sending = asyncio.create_task(publisher.publish(...))
    await tries_failed(outage, sending, PUBLISH_ATTEMPTS + 1)
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.outage import RedisOutage
from tests.support.waiting import async_wait_until


class CountingOutage(RedisOutage):
    """The outage every loop reports to, counting the failed tries."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        self.failures = 0

    def failed(self, exc: BaseException, loop: str = "other") -> None:
        self.failures += 1
        super().failed(exc, loop)


async def tries_failed(outage: CountingOutage, sending: asyncio.Task[Any], count: int) -> None:
    """Wait until `count` tries failed for want of Redis (or the send ended first: the caller sees it)."""
    await async_wait_until(
        lambda: sending.done() or outage.failures >= count, f"{count} tries to fail for want of Redis"
    )
