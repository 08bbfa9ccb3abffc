"""Sending an archive record while Redis is away: retried until it is back, given up only on a stop.

A real `redis-server` of the test's own (stopped and started again on the same port) and the orchestrator's
real `Publisher` on a real Celery producer app; the message is then read from the queue as a worker would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis

from ops.redis_server import RedisServer
from orchestrator.archive import build_archive_send, build_turn_record
from orchestrator.model import TurnOutcome, TurnRequest, UserMessage
from orchestrator.outage import RedisOutage, RedisRetry, is_redis_failure
from orchestrator.runtime.publish import Publisher
from workers.app import create_app
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE = "toolloop.archive"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def build_options(turn_id: str) -> dict[str, object]:
    outcome = TurnOutcome(turn_id=turn_id, status="completed", messages=[UserMessage(content="hi")])
    record = build_turn_record(turn_id, TurnRequest(prompt="hi"), outcome, {}, 1.0)
    return build_archive_send(record, task="teamapp.archive_turn", queue=QUEUE)


def build_publisher(url: str) -> tuple[Publisher, RedisRetry]:
    retry = RedisRetry(RedisOutage(url))
    return Publisher(create_app(WorkerSettings(redis_url=url), main="archive-test"), retry), retry


async def test_a_record_sent_while_redis_is_away_goes_out_once_it_is_back(own_redis: RedisServer) -> None:
    publisher, _ = build_publisher(own_redis.url)
    own_redis.stop(keep_data=True)
    sending = asyncio.create_task(publisher.publish_archive(build_options("turn_away")))
    await asyncio.sleep(2.0)
    assert not sending.done()  # still retrying, not given up

    own_redis.start()
    assert await asyncio.wait_for(sending, 30) is None
    await publisher.aclose()

    client = redis.Redis.from_url(own_redis.url)
    try:
        messages = client.lrange(QUEUE, 0, -1)
    finally:
        client.close()
    assert len(messages) == 1
    message = json.loads(messages[0])
    assert message["headers"]["task"] == "teamapp.archive_turn"
    assert message["headers"]["id"] == "toolloop.archive:turn_away"


async def test_a_stop_gives_the_record_up_instead_of_waiting_for_redis(own_redis: RedisServer) -> None:
    publisher, retry = build_publisher(own_redis.url)
    own_redis.stop(keep_data=True)
    sending = asyncio.create_task(publisher.publish_archive(build_options("turn_stopped")))
    await asyncio.sleep(1.0)
    retry.stopping.set()
    error = await asyncio.wait_for(sending, 30)
    assert error is not None and is_redis_failure(error)
    await publisher.aclose()
