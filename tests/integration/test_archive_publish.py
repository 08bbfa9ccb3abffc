"""Sending an archive record while Redis is away: retried until it is back, given up only on a stop.

A real `redis-server` of the test's own (stopped and started again on the same port) and the orchestrator's
real `Publisher` on a real Celery producer app; the message is then read from the queue as a worker would.
The failed tries are counted (`CountingOutage`), so a test waits for tries, never for time.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from orchestrator.archive import build_archive_send, build_turn_record
from orchestrator.model import TurnOutcome, TurnRequest, UserMessage
from orchestrator.outage import RedisRetry, is_redis_failure
from orchestrator.publishing.publisher import PUBLISH_ATTEMPTS, Publisher
from orchestrator.redis_server import RedisServer
from tests.support.counting_outage import CountingOutage, tries_failed
from tests.support.waiting import DEFAULT_TIMEOUT_S
from workers.app import create_app
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE = "toolloop.archive"


def build_options(turn_id: str) -> dict[str, object]:
    outcome = TurnOutcome(turn_id=turn_id, status="completed", messages=[UserMessage(content="hi")])
    record = build_turn_record(turn_id, TurnRequest(prompt="hi"), outcome, {}, 1.0)
    return build_archive_send(record, task="teamapp.archive_turn", queue=QUEUE)


def build_publisher(url: str) -> tuple[Publisher, RedisRetry, CountingOutage]:
    outage = CountingOutage(url)
    retry = RedisRetry(outage)
    publisher = Publisher(create_app(WorkerSettings(redis_url=url), main="archive-test"), retry)
    return publisher, retry, outage


async def test_a_record_sent_while_redis_is_away_goes_out_once_it_is_back(own_redis: RedisServer) -> None:
    publisher, _, outage = build_publisher(own_redis.url)
    own_redis.stop(keep_data=True)
    sending = asyncio.create_task(publisher.publish_archive(build_options("turn_away")))
    # More tries than a failure of another kind gets: for want of Redis it still retries, not given up.
    await tries_failed(outage, sending, PUBLISH_ATTEMPTS + 1)
    assert not sending.done()

    own_redis.start()
    assert await asyncio.wait_for(sending, DEFAULT_TIMEOUT_S) is None
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
    publisher, retry, outage = build_publisher(own_redis.url)
    own_redis.stop(keep_data=True)
    sending = asyncio.create_task(publisher.publish_archive(build_options("turn_stopped")))
    await tries_failed(outage, sending, 1)
    assert not sending.done()  # retrying
    retry.stopping.set()
    error = await asyncio.wait_for(sending, DEFAULT_TIMEOUT_S)
    assert error is not None and is_redis_failure(error)
    await publisher.aclose()
