"""The orchestrator's lease loop, in this process on a real Redis: a renewal Redis could not answer is tried
again after a short backoff, not a whole period later — a Redis that restarts again and again (down 2 s, up
3 s, as a newcomer's trial did) would otherwise be down at every renewal of a lease's lifetime, and the only
orchestrator running would lose its own turns and take them over."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Collection, Iterator
from itertools import pairwise

import pytest
import redis

from ops.bench.instant import INSTANT_BASE_URL, INSTANT_MODEL, build_instant_http
from orchestrator.model import TurnRequest
from orchestrator.publishing.publisher import get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.runtime.process import Runtime
from orchestrator.settings import Settings
from orchestrator.store.connection import connect_async
from orchestrator.store.turns import TurnStore
from tests.support.waiting import async_wait_until
from workers import keys
from workers.contract import ToolSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LEASE_TTL_S = 3.0  # a renewal every 1 s
REFUSED = 3
# Served by no worker: the turn waits on its call, holding its lease, until the test ends it.
SPEC = ToolSpec(name="lease_probe", description="A tool nobody runs.", soft_time_limit_s=5, time_limit_s=10)


class RenewalsRefused(TurnStore):
    """A store on a real Redis whose first `REFUSED` lease renewals fail as an unreachable Redis's do."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        super().__init__(client, lease_ttl_s=LEASE_TTL_S)
        self.tries: list[float] = []

    async def renew_leases(self, orchestrator_id: str, turn_ids: Collection[str], ttl_s: float) -> set[str]:
        if turn_ids:
            self.tries.append(time.monotonic())
            if len(self.tries) <= REFUSED:
                raise redis.ConnectionError("Error 111 connecting to Redis: Connection refused.")
        return await super().renew_leases(orchestrator_id, turn_ids, ttl_s)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[RenewalsRefused]:
    store = RenewalsRefused(connect_async(server.url))
    yield store
    await store.aclose()


async def test_a_renewal_redis_could_not_answer_is_tried_again_within_the_period(
    server: RedisServer, store: RenewalsRefused
) -> None:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    entry = {"seen_at": time.time() + 3600, "tools": [SPEC.model_dump(mode="json")]}
    client.hset(keys.CATALOGUE, "probe@test", json.dumps(entry))
    settings = Settings(
        redis_url=server.url, scripted_base_url=INSTANT_BASE_URL, model=INSTANT_MODEL, lease_ttl_s=LEASE_TTL_S
    )
    plan = {"plan": [{"calls": [{"name": SPEC.name, "arguments": {}}]}]}
    async with build_instant_http() as http:
        runtime = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        running = asyncio.create_task(runtime.run())
        turn_id = await store.submit(TurnRequest(prompt=json.dumps(plan), tools=[SPEC.name]))
        await async_wait_until(lambda: len(store.tries) > REFUSED, "the renewal after the refused ones")
        period = LEASE_TTL_S / 3
        gaps = [later - earlier for earlier, later in pairwise(store.tries)]
        # After each refusal the next try came at the backoff (0.1, 0.2, 0.4 s), well within the period.
        assert all(gap < period / 2 for gap in gaps[:REFUSED]), gaps
        assert turn_id in runtime.turns, "the turn was kept: its lease renewed in time"
        assert client.get(keys.turn_lease(turn_id)) == runtime.orchestrator_id
        runtime.request_stop()
        await running
    client.close()
