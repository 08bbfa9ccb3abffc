"""The API's SSE streams over a real redis-server (issue 12): one events reader for every stream, bounded
connections, slow clients, and streams that ride out a Redis restart without losing or repeating an event.

The turns here are driven by hand (`TurnStore.append_event`, `save_outcome`: what an orchestrator writes);
tests/faults/test_sse_streams.py runs the same against real workers and orchestrators.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis

from orchestrator.api.app import create_app
from orchestrator.api.connections import ApiRedis, RedisGate
from orchestrator.api.fanout import EventFanout, parse_stream_id
from orchestrator.api.sse import follow_turn
from orchestrator.model import AssistantMessage, TurnOutcome, TurnRequest, UserMessage
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.turns import TurnStore
from tests.support.api_server import serve_app
from tests.support.sse import SseStream, follow_sse, read_sse
from tests.support.turns import event_ids
from tests.support.waiting import DEFAULT_TIMEOUT_S, async_wait_until
from workers.connect import connect_redis_async

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

API_CLIENT_PREFIX = "toolloop-api"


def build_outcome(turn_id: str) -> TurnOutcome:
    messages = [UserMessage(content="2+2?"), AssistantMessage(content="4")]
    return TurnOutcome(turn_id=turn_id, status="completed", text="4", messages=messages, llm_calls=1)


async def submit(store: TurnStore) -> str:
    return await store.submit(TurnRequest(prompt="2+2?"))


def api_connections(url: str) -> list[str]:
    """The names of the connections the API holds now (CLIENT LIST)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return [c["name"] for c in client.client_list() if c["name"].startswith(API_CLIENT_PREFIX)]
    finally:
        client.close()


def stream_ids(url: str, turn_id: str) -> list[str]:
    """Every event id the turn's stream holds, from Redis itself."""
    client = redis.Redis.from_url(url)
    try:
        return event_ids(client, turn_id)
    finally:
        client.close()


def check_whole(stream: SseStream, url: str, turn_id: str, after: str = "0") -> None:
    """Every event of the turn after `after`, each once, in order, ending with turn_finished."""
    assert stream.status == 200, stream.body
    expected = [i for i in stream_ids(url, turn_id) if parse_stream_id(i) > parse_stream_id(after)]
    assert stream.ids == expected
    assert stream.names[-1] == codec.TURN_FINISHED and stream.names.count(codec.TURN_FINISHED) == 1
    assert all(m.json()["turn_id"] == turn_id for m in stream.messages)


def waits_for_redis(stream: SseStream) -> bool:
    """Whether the stream has told its client that it waits for Redis (a keep-alive comment)."""
    return any(c.startswith("waiting for Redis") for c in stream.comments)


def open_http(base_url: str) -> httpx.AsyncClient:
    # httpx's own pool is 100 connections: these tests open more streams than that.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30)


async def test_many_streams_share_one_reader_and_leave_the_pool_to_requests(
    db_url: str, store: TurnStore
) -> None:
    # More streams than redis-py's default pool (100): each used to hold a connection with its XREAD BLOCK.
    count, pool = 150, 4
    settings = Settings(redis_url=db_url, api_redis_max_connections=pool, api_sse_keepalive_s=1)
    turn_ids = [await submit(store) for _ in range(count)]
    started = {t: asyncio.Event() for t in turn_ids}
    with serve_app(create_app(settings)) as base_url:
        async with open_http(base_url) as http:
            streams = [
                asyncio.create_task(
                    read_sse(http, f"/v1/turns/{t}/events", on_message=lambda _m, t=t: started[t].set())
                )
                for t in turn_ids
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 30)
            # Every stream open: requests and the health check are served all the same.
            reply = await http.post("/v1/turns", json={"prompt": "while 150 streams are open"})
            assert reply.status_code == 202, reply.text
            assert (await http.get(f"/v1/turns/{turn_ids[0]}")).status_code == 200
            assert (await http.get("/healthz")).json() == {"status": "ok", "redis": "ok"}
            held = api_connections(db_url)
            assert held.count(f"{API_CLIENT_PREFIX}-events") == 1
            assert len(held) <= pool + 2, held
            for turn_id in turn_ids:
                await store.append_event(turn_id, "turn_started", {"turn_id": turn_id})
                await store.save_outcome(turn_id, build_outcome(turn_id))
            results = await asyncio.wait_for(asyncio.gather(*streams), 30)
    for turn_id, stream in zip(turn_ids, results, strict=True):
        assert stream.names == ["turn_queued", "turn_started", "turn_finished"]
        check_whole(stream, db_url, turn_id)


async def test_streams_ride_out_a_redis_restart_without_losing_or_repeating_an_event() -> None:
    with RedisServer(appendonly=True) as server:
        settings = Settings(redis_url=server.url, api_sse_keepalive_s=0.3)
        store = TurnStore.from_url(server.url)
        try:
            turn_ids = [await submit(store) for _ in range(5)]
            with serve_app(create_app(settings)) as base_url:
                async with open_http(base_url) as http:
                    live = [SseStream(0) for _ in turn_ids]
                    streams = [
                        asyncio.create_task(follow_sse(http, f"/v1/turns/{t}/events", stream))
                        for t, stream in zip(turn_ids, live, strict=True)
                    ]
                    for step in range(3):
                        for turn_id in turn_ids:
                            await store.append_event(turn_id, f"before_{step}", {"turn_id": turn_id})
                    await async_wait_until(
                        lambda: all(len(stream.messages) == 4 for stream in live),
                        "every stream to show the events before the restart",
                    )
                    resume_after = stream_ids(server.url, turn_ids[0])[1]
                    server.stop(keep_data=True)
                    # A client reconnecting while Redis is away: the stream opens once Redis is back.
                    reconnected = asyncio.create_task(
                        read_sse(http, f"/v1/turns/{turn_ids[0]}/events", {"Last-Event-ID": resume_after})
                    )
                    await async_wait_until(
                        lambda: all(waits_for_redis(stream) for stream in live),
                        "every open stream to tell its client it waits for Redis",
                    )
                    server.start()
                    # The writer's pooled connections died with the server: a fresh one (the API's own
                    # connections are what this test is about).
                    await store.aclose()
                    store = TurnStore.from_url(server.url)
                    for step in range(3):
                        for turn_id in turn_ids:
                            await store.append_event(turn_id, f"after_{step}", {"turn_id": turn_id})
                    for turn_id in turn_ids:
                        await store.save_outcome(turn_id, build_outcome(turn_id))
                    results = await asyncio.wait_for(asyncio.gather(*streams), DEFAULT_TIMEOUT_S)
                    again = await asyncio.wait_for(reconnected, DEFAULT_TIMEOUT_S)
        finally:
            await store.aclose()
        for turn_id, stream in zip(turn_ids, results, strict=True):
            check_whole(stream, server.url, turn_id)
            assert len(stream.messages) == 1 + 3 + 3 + 1
            assert waits_for_redis(stream), stream.comments
        check_whole(again, server.url, turn_ids[0], after=resume_after)
        assert again.names[0] == "before_1"


async def test_a_slow_client_is_detached_and_catches_up_on_its_own(db_url: str, store: TurnStore) -> None:
    settings = Settings(redis_url=db_url, api_stream_buffer_events=2)
    api = ApiRedis.open(settings)
    try:
        turn_id = await submit(store)
        stream = follow_turn(api, turn_id, "0", keepalive_s=5)
        first = await anext(stream)
        assert first.event == "turn_queued"
        # The follower waits on the reader now; its client reads nothing while 30 events come.
        waiting = asyncio.create_task(anext(stream))
        await async_wait_until(lambda: api.fanout.following == 1, "the stream to follow the reader")
        for n in range(30):
            await store.append_event(turn_id, f"event_{n}", {"n": n})
        await store.save_outcome(turn_id, build_outcome(turn_id))
        await async_wait_until(lambda: api.fanout.detached_total > 0, "the slow stream to be detached")
        names = [first.event, (await waiting).event]
        names += [message.event async for message in stream if message.event is not None]
        assert names == ["turn_queued", *(f"event_{n}" for n in range(30)), "turn_finished"]
        assert api.fanout.following == 0
    finally:
        await api.aclose()


async def test_subscriptions_of_one_turn_from_different_points_each_get_their_own_rest(
    db_url: str, store: TurnStore
) -> None:
    fanout = EventFanout(connect_redis_async(db_url), buffer_events=100)
    fanout.start()
    try:
        turn_id = await submit(store)
        for n in range(3):
            await store.append_event(turn_id, f"event_{n}", {"n": n})
        ids = stream_ids(db_url, turn_id)
        whole = fanout.subscribe(turn_id, "0")
        late = fanout.subscribe(turn_id, ids[2])
        await store.save_outcome(turn_id, build_outcome(turn_id))

        async def drain(subscription_queue: asyncio.Queue[codec.TurnEvent]) -> list[str]:
            names: list[str] = []
            while not names or names[-1] != codec.TURN_FINISHED:
                names.append((await asyncio.wait_for(subscription_queue.get(), 10)).name)
            return names

        assert await drain(whole.queue) == ["turn_queued", "event_0", "event_1", "event_2", "turn_finished"]
        assert await drain(late.queue) == ["event_2", "turn_finished"]
        assert whole.finished and late.finished and fanout.following == 0
    finally:
        await fanout.aclose()


async def test_a_request_that_finds_no_connection_free_in_time_is_a_redis_connection_error() -> None:
    gate = RedisGate(1, wait_s=0.2)
    async with gate.slot():
        with pytest.raises(redis.ConnectionError, match=r"no Redis connection free within 0\.2 s"):
            async with gate.slot():
                pass
    async with gate.slot():  # freed again
        pass


async def test_a_new_subscription_ends_the_blocking_read_so_the_next_covers_it(
    db_url: str, store: TurnStore
) -> None:
    # The reader blocks on one turn; a stream that subscribes to another meanwhile writes the reader's wake
    # stream, which ends that read (its cursor moves past the wake entry), and the next read covers it.
    waker = connect_redis_async(db_url)
    fanout = EventFanout(connect_redis_async(db_url), buffer_events=100, waker=waker)
    fanout.start()
    sync = redis.Redis.from_url(db_url)
    try:
        quiet, busy = await submit(store), await submit(store)
        fanout.subscribe(quiet, stream_ids(db_url, quiet)[-1])
        await async_wait_until(lambda: fanout._current is not None, "the reader to block on the quiet turn")
        subscription = fanout.subscribe(busy, stream_ids(db_url, busy)[-1])
        await async_wait_until(lambda: fanout._wake_cursor != "0-0", "the wake to end the read under way")
        assert sync.xlen(fanout._wake_key) == 1
        await store.append_event(busy, "text_delta", {"text": "first"})
        event = await asyncio.wait_for(subscription.queue.get(), DEFAULT_TIMEOUT_S)
        assert event.name == "text_delta"
        # A subscription the read under way already covers wakes nobody.
        cursor = fanout._wake_cursor
        fanout.subscribe(busy, event.id)
        await asyncio.sleep(0.3)
        assert fanout._wake_cursor == cursor
    finally:
        await fanout.aclose()
        await waker.aclose()
        sync.close()
