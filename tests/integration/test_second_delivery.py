"""A call's message delivered a second time while its first copy still runs (issue 19).

Redis redelivers a message that stays unacked past its visibility timeout, and a worker hands back the
messages it holds when its broker connection drops — both while the tool may still be running. The test does
what kombu does then (`QoS.restore_by_tag`: the running copy's message goes back on its queue, same body,
same delivery tag), on a real prefork worker with two pool processes, so that both copies run at once.

The promise (`workers.execution`, "another execution holds the call"): the second copy meets the call's
running guard before anything else — for an idempotent tool too, before its idempotency claim — so it runs
nothing and is handed back to Celery as a retry (`ToolCallRetried`, Flower's RETRY). It is not simply
acked: the redelivered copy shares the first one's delivery tag, so acking it acks the first copy's message
too, and the retry is then what keeps the call in the broker. The retry finds the call answered once the
first copy ends, and runs nothing either. So: the body ran once, one outcome, no late one.

How a delivery ended is read from the worker's Celery task events, as Flower reads it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support import second_delivery_tools
from tests.support.calls import stored_outcome
from tests.support.processes import WorkerHandle, start_worker
from tests.support.second_delivery_tools import RELEASE, RUNS
from tests.support.task_events import TaskEvents
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.contract import ToolCallRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The reason `workers.execution` gives a delivery that found another execution holding the call.
HELD_REASON = "another execution holds the call"
ENDS = frozenset({"task-succeeded", "task-failed", "task-retried", "task-rejected", "task-revoked"})


def _first_end(events: TaskEvents, task_id: str) -> dict[str, Any] | None:
    """The first event that says how a delivery of the task ended (a retry too), if any did yet."""
    return next((e for e in events.of_task(task_id) if e["type"] in ENDS), None)


def _unacked_tag(channel: Any, task_id: str) -> str | None:
    """The delivery tag of the task's message in kombu's unacked hash (where a received message waits for
    its ack), or None while it is not there."""
    for tag, raw in channel.client.hgetall(channel.unacked_key).items():
        payload, _exchange, _routing_key = json.loads(raw)
        if payload["headers"].get("id") == task_id:
            return str(tag.decode() if isinstance(tag, bytes) else tag)
    return None


def redeliver(app: Celery, task_id: str) -> None:
    """Deliver the task's unacked message again, exactly as kombu's Redis transport does once its visibility
    timeout has passed (`QoS.restore_visible` → `restore_by_tag`): back on its queue, marked redelivered."""
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        tag = wait_for(lambda: _unacked_tag(channel, task_id), "the first copy's message among the unacked")
        channel.qos.restore_by_tag(tag)


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    # Two pool processes: the second copy runs while the first one holds the other.
    handle = start_worker(module_redis.url, [second_delivery_tools.__name__], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def producer(module_redis: RedisServer) -> Celery:
    return get_producer_app(Settings(redis_url=module_redis.url))


@pytest.fixture
def db(module_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(module_redis.url)
    yield client
    client.close()


@pytest.fixture
def events(module_redis: RedisServer, held_worker: WorkerHandle) -> Iterator[TaskEvents]:
    # Returns once it hears the held worker (this Redis's only one): none of its later events is missed.
    with TaskEvents(module_redis.url) as recorder:
        yield recorder


# --- the test ------------------------------------------------------------------------------------------


def _runs(db: redis.Redis, tag: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in db.lrange(RUNS + tag, 0, -1)]


@pytest.mark.parametrize("tool_name", ["held_plain", "held_idempotent"])
def test_a_second_delivery_while_the_first_runs_runs_nothing_and_is_retried(
    tool_name: str, producer: Celery, db: redis.Redis, events: TaskEvents
) -> None:
    tag = uuid.uuid4().hex
    request = ToolCallRequest(call_id=f"second-delivery-{tag}", tool=tool_name, arguments={"tag": tag})
    spec = read_catalogue(db)[tool_name]
    assert (spec.idempotency is not None) == (tool_name == "held_idempotent")
    task_id = dispatch_call(producer, spec, request)
    try:
        wait_until(lambda: _runs(db, tag), "the first copy's body to start")
        redeliver(producer, task_id)
        # The first copy holds until released: the first delivery to end is the second copy.
        second = wait_for(lambda: _first_end(events, task_id), "the second copy to end")
        assert second["type"] == "task-retried", f"the second copy was not handed back: {second}"
        assert second["exception"] == f"ToolCallRetried('{HELD_REASON}')", second
        assert len(_runs(db, tag)) == 1, "the second copy ran the body beside the first"
        assert stored_outcome(db, request.call_id) is None, "the second copy answered the call"
    finally:
        db.rpush(RELEASE + tag, "go")
    outcome = wait_for(lambda: stored_outcome(db, request.call_id), "the call's outcome")
    # "Ran once" is checked once every delivery ended: the first copy, then the second copy's retries, one
    # after the other (each one held publishes the next), until one finds the outcome and succeeds.
    wait_until(lambda: events.count(task_id, "task-succeeded") == 2, "the second copy's last retry to end")
    assert outcome.ok, outcome
    assert outcome.result == {"run": 1} and not outcome.idempotent_replay, outcome
    assert outcome.attempts == 1, outcome
    (run,) = _runs(db, tag)
    assert run["call_id"] == request.call_id and run["attempt"] == 1, run
    assert db.llen(keys.late_outcomes(request.call_id)) == 0, "a second outcome was written"
    assert db.exists(keys.running(request.call_id)) == 0, "the running guard outlived the call"
    # Every delivery received ended: the first copy and the last retry succeeded, the others were retried,
    # each for the held call.
    seen = events.of_task(task_id)
    ends = [e["type"] for e in seen if e["type"] in ENDS]
    assert len(ends) == events.count(task_id, "task-received"), seen
    assert sorted(ends) == ["task-retried"] * (len(ends) - 2) + ["task-succeeded"] * 2, seen
    retried = {e["exception"] for e in seen if e["type"] == "task-retried"}
    assert retried == {f"ToolCallRetried('{HELD_REASON}')"}, seen
