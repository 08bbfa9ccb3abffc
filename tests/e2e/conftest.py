"""End-to-end fixtures: per module, a Redis of its own, a prefork worker, an orchestrator and a model server.

A module gets its own `redis-server` (not the session's) so that its orchestrator never claims another
suite's turns and its worker's tools never mix with the session worker's catalogue on the same queue.

Helpers: `wait_outcome` (a turn's outcome, or the events it got to), `event_data` (a turn's events so far, by
name) and `assert_every_call_answered_once`. Waiting on anything else: `tests.support.waiting`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from ops.redis_server import RedisServer, find_free_port
from orchestrator.client import Client
from orchestrator.model import Message, ToolMessage, TurnOutcome
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for
from workers import keys

E2E_TOOLS = "tests.support.e2e_tools"


@pytest.fixture(scope="module")
def e2e_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def model_server() -> Iterator[RecordingModelServer]:
    with RecordingModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def e2e_worker(e2e_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(e2e_redis.url, [E2E_TOOLS], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator_process(
    e2e_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(
        e2e_redis.url,
        model_base_url=model_server.base_url,
        env={"TOOLLOOP_METRICS_PORT": str(find_free_port())},
    )
    yield handle
    handle.stop()


@pytest.fixture
def client(e2e_redis: RedisServer) -> Iterator[Client]:
    c = Client(e2e_redis.url)
    yield c
    c.redis.close()


def wait_outcome(client: Client, turn_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> TurnOutcome:
    """The turn's outcome once it is terminal; failing, the status and every event the turn got to."""
    try:
        return wait_for(lambda: client.outcome(turn_id), f"turn {turn_id} to finish", timeout_s)
    except AssertionError as timed_out:
        listing = "\n".join(
            f"  {fields.get('name')}: {fields.get('data')}" for fields in _events(client, turn_id)
        )
        raise AssertionError(f"{timed_out} ({client.get(turn_id).status}); events:\n{listing}") from None


def event_data(client: Client, turn_id: str, name: str) -> list[dict[str, Any]]:
    """The data of every event `name` the turn has so far (a snapshot: it never waits for more)."""
    return [json.loads(fields["data"]) for fields in _events(client, turn_id) if fields.get("name") == name]


def _events(client: Client, turn_id: str) -> list[dict[str, str]]:
    entries = cast("list[tuple[str, dict[str, str]]]", client.redis.xrange(keys.turn_events(turn_id)))
    return [fields for _id, fields in entries]


def assert_every_call_answered_once(messages: list[Message]) -> None:
    """Every tool call in the history has exactly one tool message, right after its assistant message."""
    for index, message in enumerate(messages):
        if message.role != "assistant" or not message.tool_calls:
            continue
        expected = [call.id for call in message.tool_calls]
        following = messages[index + 1 : index + 1 + len(expected)]
        answered = [m.tool_call_id for m in following if isinstance(m, ToolMessage)]
        assert answered == expected, f"calls {expected} answered by {answered}"
    all_calls = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    all_answers = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(all_calls) == sorted(all_answers)
    assert len(set(all_answers)) == len(all_answers)
    if messages:
        last = messages[-1]
        assert last.role != "assistant" or not last.tool_calls, "history ends with unanswered tool calls"


@pytest.fixture
def e2e_redis_client(e2e_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(e2e_redis.url)
    yield c
    c.close()
