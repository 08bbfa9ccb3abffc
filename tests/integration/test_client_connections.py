"""One `Client` shared by a web app's threads (docs/guides/web-apps.md: one per process): each blocking read
holds a connection while it blocks, and more than redis-py's default 100 at once must still be served, not
taken for Redis being away."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.client.redis_client import AsyncClient, Client
from orchestrator.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WAITERS = 150


def test_more_waits_than_redis_pys_default_pool_and_a_submit_beside_them(module_redis: RedisServer) -> None:
    with Client(module_redis.url, retry_s=2.0) as client:
        # No orchestrator here: the turn stays queued, and every wait blocks until its timeout.
        turn_id = client.submit(prompt="hello", model="scripted:demo")

        def wait() -> str:
            try:
                client.wait(turn_id, timeout=4.0)
            except Exception as exc:  # the kind of failure is what the test reads
                return type(exc).__name__
            return "ended"

        with ThreadPoolExecutor(WAITERS) as pool:
            waits = [pool.submit(wait) for _ in range(WAITERS)]
            second = client.submit(prompt="again", model="scripted:demo")  # beside them: served at once
            kinds = [w.result() for w in waits]
        assert second != turn_id
        assert set(kinds) == {"TimeoutError"}, sorted(set(kinds))  # each wait ran out, none met "no Redis"


def test_more_waits_than_redis_pys_default_pool_on_the_async_client(module_redis: RedisServer) -> None:
    async def scenario() -> tuple[set[str], str, str]:
        async with AsyncClient(module_redis.url, retry_s=2.0) as client:
            turn_id = await client.submit(prompt="hello", model="scripted:demo")

            async def wait() -> str:
                try:
                    await client.wait(turn_id, timeout=4.0)
                except Exception as exc:  # the kind of failure is what the test reads
                    return type(exc).__name__
                return "ended"

            waits = [asyncio.create_task(wait()) for _ in range(WAITERS)]
            await asyncio.sleep(0.5)  # every wait blocking on its own connection
            second = await client.submit(prompt="again", model="scripted:demo")
            return set(await asyncio.gather(*waits)), turn_id, second

    kinds, first, second = asyncio.run(scenario())
    assert second != first
    assert kinds == {"TimeoutError"}, sorted(kinds)
