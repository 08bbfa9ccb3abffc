"""The orchestrator's batched publishing (`Publisher` → `runtime.task_messages`), against real things.

A real `redis-server` and a real prefork `toolloop worker` (the session's): the messages a batch publishes
are the very messages `Celery.send_task` publishes for the same options (read raw from a queue no worker
serves, header by header), their `task-sent` events — what Flower shows a task by — are Celery's too,
calls published in one batch run and answer, and a batch sent while Redis is away goes out once it is back.
Each on both paths: through kombu (a broker of its own) and written by the store's client (`task_wire`,
the broker being the state Redis), whose messages must be kombu's to the byte.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from celery import Celery

from orchestrator.client.direct import build_direct_request
from orchestrator.outage import RedisRetry
from orchestrator.publishing.messages import TaskSender
from orchestrator.publishing.publisher import (
    PUBLISH_ATTEMPTS,
    Publisher,
    Send,
    build_send_options,
    build_task_id,
)
from orchestrator.publishing.wire import open_task_wire
from orchestrator.redis_server import RedisServer
from orchestrator.store.catalogue import read_catalogue
from tests.support.calls import wait_tool_outcome
from tests.support.counting_outage import CountingOutage, tries_failed
from tests.support.processes import WorkerHandle
from tests.support.task_events import TaskEvents
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for
from workers.app import BODY_ENCODING, ToolloopCelery, create_app
from workers.contract import ToolCallRequest, ToolSpec, build_task_name
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
# What differs between two deliveries of the same event by design: when and in which order it was sent.
EVENT_MOMENT = frozenset({"timestamp", "clock", "local_received"})


# How a batch goes out: kombu's producer in the publishing thread, or the store's client (`task_wire`).
PATHS = ["kombu", "wire"]


@pytest.fixture
def app(redis_url: str) -> Iterator[ToolloopCelery]:
    app = create_app(WorkerSettings(redis_url=redis_url), main="publish-messages-test")
    yield app
    app.close()


def connect_broker(path: str, redis_url: str) -> aioredis.Redis | None:
    """The `broker` a runtime hands its publisher on `path`: the state Redis's client, or none (kombu)."""
    return aioredis.Redis.from_url(redis_url) if path == "wire" else None


def prefixed(app: Celery) -> bool:
    return bool((app.conf.broker_transport_options or {}).get("global_keyprefix"))


def publish(
    app: ToolloopCelery, sends: Sequence[Send], trace: Mapping[str, str] | None = None, *, path: str = "kombu"
) -> dict[str, Exception]:
    """`Publisher.publish` of `sends` in one batch (the turns' trace context `trace`), as a runtime does."""

    async def run() -> dict[str, Exception]:
        broker = connect_broker(path, app.settings.redis_url)
        publisher = Publisher(app, trace_of=lambda turn_id: trace, broker=broker)
        try:
            errors = await publisher.publish(sends)
            assert publisher.writes_directly is (path == "wire" and not prefixed(app))
            return errors
        finally:
            await publisher.aclose()
            if broker is not None:
                await broker.aclose()

    return asyncio.run(run())


def read_queue(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages waiting on `queue`, oldest first (kombu LPUSHes, a worker takes from the right)."""
    return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]


def decode_body(message: Mapping[str, Any]) -> Any:
    # The body as it is, not in kombu's default base64 (`workers.app.BODY_ENCODING`).
    assert message["properties"]["body_encoding"] == BODY_ENCODING
    return json.loads(message["body"])


def differences(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each key whose value differs, with (new, old): empty when the two agree key by key."""
    return {
        key: (new.get(key), old.get(key)) for key in new.keys() | old.keys() if new.get(key) != old.get(key)
    }


def sent_events(events: TaskEvents, task_id: str, count: int) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (
            found
            if len(found := [e for e in events.of_type("task-sent") if e["uuid"] == task_id]) >= count
            else None
        ),
        f"{count} task-sent events of {task_id}",
    )


def held_call(deadline_at: float | None) -> tuple[ToolSpec, ToolCallRequest, str]:
    """A call of a tool no worker serves (its message stays queued to be read), in a turn."""
    name = f"held_{uuid.uuid4().hex[:12]}"
    spec = ToolSpec(name=name, soft_time_limit_s=7, time_limit_s=9)
    request = ToolCallRequest(
        call_id=f"turn_{name}/call_1",
        tool=name,
        arguments={"path": "/tmp/ünïcode", "n": 3, "nested": {"list": [1, None, "x"]}},
        turn_id=f"turn_{name}",
        context={"user": "u1"},
        deadline_at=deadline_at,
        dispatched_at=time.time(),
    )
    return spec, request, f"{request.call_id}:r1:a1"


# No deadline: the tool's own limits, no expiry. A deadline already past (a publish retried that long):
# limits cut to the margin and an expiry of 0 s — both fixed, so the two messages must agree to the byte.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("deadline_in_s", [None, -5.0], ids=["no-deadline", "deadline-past"])
def test_a_batch_publishes_the_very_message_and_event_send_task_does(
    app: Celery, redis_client: redis.Redis, worker: WorkerHandle, deadline_in_s: float | None, path: str
) -> None:
    spec, request, task_id = held_call(None if deadline_in_s is None else time.time() + deadline_in_s)
    with TaskEvents(worker.redis_url) as events:
        assert publish(app, [(spec, request, task_id)], trace=CARRIER, path=path) == {}
        app.send_task(**build_send_options(spec, request, time.time(), task_id=task_id, trace=CARRIER))
        new_event, old_event = sent_events(events, task_id, 2)

    new, old = read_queue(redis_client, spec.queue)
    assert differences(new["headers"], old["headers"]) == {}
    assert decode_body(new) == decode_body(old)
    assert decode_body(new)[1] == request.model_dump(mode="json")
    new_properties, old_properties = dict(new["properties"]), dict(old["properties"])
    # kombu's delivery tag names one message in the broker's unacked hash: unique per message by design.
    assert new_properties.pop("delivery_tag") != old_properties.pop("delivery_tag")
    assert differences(new_properties, old_properties) == {}
    assert differences({**new, "headers": 0, "properties": 0}, {**old, "headers": 0, "properties": 0}) == {}
    assert new["headers"]["traceparent"] == CARRIER["traceparent"]
    assert not {"argsrepr", "kwargsrepr", "reply_to"} & set(new_properties)  # app's before_task_publish ran

    assert new_event["name"] == build_task_name(spec.name) and new_event["queue"] == spec.queue
    moment = dict.fromkeys(EVENT_MOMENT)
    assert differences({**new_event, **moment}, {**old_event, **moment}) == {}
    assert new_event["clock"] != old_event["clock"]  # each forwards the app's logical clock
    redis_client.delete(spec.queue)


@pytest.mark.parametrize("path", PATHS)
def test_calls_published_in_one_batch_run_and_flower_hears_each(
    app: Celery, redis_client: redis.Redis, worker: WorkerHandle, path: str
) -> None:
    spec = read_catalogue(redis_client)["echo"]
    requests = [
        build_direct_request("echo", {"text": f"b{i}", "times": 2}, None, 60.0, time.time()) for i in range(6)
    ]
    sends = [(spec, request, build_task_id(request)) for request in requests]
    with TaskEvents(worker.redis_url) as events:
        assert publish(app, sends, path=path) == {}
        outcomes = [wait_tool_outcome(redis_client, request.call_id) for request in requests]
        for _, request, task_id in sends:
            (sent,) = sent_events(events, task_id, 1)
            assert sent["name"] == "tool.echo" and sent["queue"] == spec.queue
            assert sent["routing_key"] == spec.queue and sent["exchange"] == ""
            assert request.call_id in sent["kwargs"]  # Flower's redacted arguments
            ended = events.wait_ended(task_id)
            assert [event["type"] for event in ended] == ["task-succeeded"]
    assert [(o.ok, o.result, o.worker) for o in outcomes] == [
        (True, f"b{i}b{i}", worker.hostname) for i in range(6)
    ]


@pytest.mark.parametrize("path", PATHS)
async def test_a_batch_sent_while_redis_is_away_goes_out_once_it_is_back(
    own_persistent_redis: RedisServer, path: str
) -> None:
    app = create_app(WorkerSettings(redis_url=own_persistent_redis.url), main="publish-outage-test")
    outage = CountingOutage(own_persistent_redis.url)
    broker = connect_broker(path, own_persistent_redis.url)
    publisher = Publisher(app, RedisRetry(outage), broker=broker)
    calls = [held_call(time.time() + 600) for _ in range(3)]
    # Once with Redis up: the producer's connection and the queues' declarations are the ones that break.
    assert await publisher.publish(calls[:1]) == {}
    own_persistent_redis.stop(keep_data=True)
    sending = asyncio.create_task(publisher.publish(calls[1:]))
    # More tries than a failure of another kind gets: for want of Redis it still retries, not given up.
    await tries_failed(outage, sending, PUBLISH_ATTEMPTS + 1)
    assert not sending.done()

    own_persistent_redis.start()
    assert await asyncio.wait_for(sending, DEFAULT_TIMEOUT_S) == {}
    assert publisher.writes_directly is (path == "wire")
    await publisher.aclose()
    if broker is not None:
        await broker.aclose()
    app.close()
    client = redis.Redis.from_url(own_persistent_redis.url)
    try:
        for spec, _, task_id in calls:
            assert [message["headers"]["id"] for message in read_queue(client, spec.queue)] == [task_id]
    finally:
        client.close()


def test_a_broker_whose_keys_kombu_prefixes_is_published_to_through_kombu(redis_url: str) -> None:
    # kombu's client adds a `global_keyprefix` to every key itself, so the commands it hands a publish batch
    # do not name the keys it writes: no wire for such a broker, and the publisher keeps kombu's path.
    app = create_app(WorkerSettings(redis_url=redis_url), main="publish-prefix-test")
    app.conf.broker_transport_options = {"global_keyprefix": "pfx:"}
    try:
        assert open_task_wire(app, TaskSender(app)) is None
        spec, request, task_id = held_call(None)
        assert publish(app, [(spec, request, task_id)], path="wire") == {}
        client = redis.Redis.from_url(redis_url)
        try:
            assert [m["headers"]["id"] for m in read_queue(client, f"pfx:{spec.queue}")] == [task_id]
            assert not client.exists(spec.queue)
        finally:
            client.delete(f"pfx:{spec.queue}")
            client.close()
    finally:
        app.close()
