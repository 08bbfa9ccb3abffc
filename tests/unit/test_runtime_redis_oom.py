"""The orchestrator runtime, in this process, against a real Redis that refuses writes (out of memory under
`maxmemory` with `noeviction`): a turn whose writes are refused is retried, not abandoned, and goes on once
memory is freed; a publish refused (through kombu, or the store client's script) is retried until it goes
out, not answered `worker_lost`; stopping never raises. `maxmemory 1` makes Redis refuse every write that
would add memory, at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from prometheus_client import REGISTRY

from ops.bench.instant import INSTANT_BASE_URL, INSTANT_MODEL, build_instant_http
from orchestrator.model import TurnRequest
from orchestrator.outage import RedisOutage, RedisRetry
from orchestrator.publishing.publisher import PUBLISH_ATTEMPTS, Publisher, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.runtime.process import Runtime
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from tests.support.waiting import async_wait_until
from workers import keys
from workers.contract import ToolCallRequest, ToolSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Served by no worker here: its calls stay queued, and the turn's deadline answers them.
SPEC = ToolSpec(name="oom_probe", description="A tool nobody runs.", soft_time_limit_s=5, time_limit_s=10)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def sync_redis(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    entry = {"seen_at": time.time() + 3600, "tools": [SPEC.model_dump(mode="json")]}
    client.hset(keys.CATALOGUE, "probe@test", json.dumps(entry))
    yield client
    client.close()


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[TurnStore]:
    store = TurnStore.from_url(server.url)
    yield store
    await store.aclose()


def refuse_writes(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)


def free_memory(client: redis.Redis) -> None:
    client.config_set("maxmemory", 0)


def redis_errors(loop: str) -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "toolloop_redis_errors"
        for sample in metric.samples
        if sample.name == "toolloop_redis_errors_total" and sample.labels["loop"] == loop
    )


def probe_request() -> TurnRequest:
    """A turn that calls the tool nobody runs, then waits for its deadline (1.5 s)."""
    plan = {"plan": [{"calls": [{"name": SPEC.name, "arguments": {}}]}]}
    return TurnRequest(prompt=json.dumps(plan), tools=[SPEC.name], limits={"deadline_s": 1.5})


def build_settings(url: str) -> Settings:
    return Settings(redis_url=url, scripted_base_url=INSTANT_BASE_URL, model=INSTANT_MODEL, lease_ttl_s=3)


async def test_a_turn_whose_writes_are_refused_goes_on_once_memory_is_freed(
    server: RedisServer, sync_redis: redis.Redis, store: TurnStore
) -> None:
    settings = build_settings(server.url)
    async with build_instant_http() as http:
        runtime = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        running = asyncio.create_task(runtime.run())
        turn_id = await store.submit(probe_request())
        await async_wait_until(lambda: sync_redis.llen(SPEC.queue), "the call published")
        refuse_writes(sync_redis)
        before = redis_errors("steps")
        # The deadline passes: the step that answers the call `deadline_exceeded` is refused, and retried —
        # several times, never given up.
        await async_wait_until(lambda: redis_errors("steps") >= before + 3, "the step refused 3 times")
        assert not running.done(), "the runtime must ride out a Redis that refuses writes"
        assert await store.get_outcome(turn_id) is None
        free_memory(sync_redis)
        outcome = await store.wait_outcome(turn_id, 20)
        assert (outcome.status, outcome.stop_reason) == ("stopped", "deadline")
        assert redis_errors("steps") > before
        runtime.request_stop()
        await running


async def test_stopping_never_raises_while_redis_refuses_writes(
    server: RedisServer, sync_redis: redis.Redis, store: TurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = build_settings(server.url)
    async with build_instant_http() as http:
        runtime = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        running = asyncio.create_task(runtime.run())
        turn_id = await store.submit(probe_request())
        await async_wait_until(lambda: sync_redis.llen(SPEC.queue), "the call published")
        before = redis_errors("steps")
        refuse_writes(sync_redis)
        # Stopping lands right after the deadline's step is first refused, while it retries.
        await async_wait_until(lambda: redis_errors("steps") > before, "the deadline's step refused")
        assert not running.done()
        runtime.request_stop()
        await running  # the step retrying gives up, unregistering is refused: said, never raised
        said = [r.getMessage() for r in caplog.records]
        assert any(m.startswith(f"orchestrator {runtime.orchestrator_id} stopped") for m in said), said
        assert any("refuses writes: out of memory" in m for m in said), said
        # The turn given up is not lost: the next orchestrator resumes it from its last saved step.
        free_memory(sync_redis)
        successor = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        serving = asyncio.create_task(successor.run())
        outcome = await store.wait_outcome(turn_id, 30)
        assert (outcome.status, outcome.stop_reason) == ("stopped", "deadline")
        successor.request_stop()
        await serving


@pytest.mark.parametrize("path", ["kombu", "wire"])
async def test_a_publish_refused_for_want_of_memory_goes_out_once_memory_is_freed(
    server: RedisServer, sync_redis: redis.Redis, store: TurnStore, path: str
) -> None:
    settings = build_settings(server.url)
    broker = store.redis if path == "wire" else None
    publisher = Publisher(get_producer_app(settings), RedisRetry(RedisOutage(server.url)), broker=broker)
    if path == "wire":
        # The queue declared and the wire open first: what Redis refuses below is the script itself.
        first = ToolCallRequest(call_id="turn_x/call_0", tool=SPEC.name, arguments={}, turn_id="turn_x")
        assert await publisher.publish([(SPEC, first, "turn_x/call_0:1")]) == {}
        assert publisher.writes_directly
        sync_redis.delete(SPEC.queue)
    request = ToolCallRequest(call_id="turn_x/call_1", tool=SPEC.name, arguments={}, turn_id="turn_x")
    refuse_writes(sync_redis)
    before = redis_errors("publish")
    publishing = asyncio.create_task(publisher.publish([(SPEC, request, "turn_x/call_1:1")]))
    # More refusals in a row than a publish failing otherwise gets: want of memory is no reason to give up.
    refusals = before + PUBLISH_ATTEMPTS + 1
    await async_wait_until(lambda: redis_errors("publish") >= refusals, "the publish refused 5 times")
    assert not publishing.done()
    free_memory(sync_redis)
    assert await asyncio.wait_for(publishing, 10) == {}
    assert sync_redis.llen(SPEC.queue) == 1
    await publisher.aclose()
