"""End-to-end fixtures: per module, a Redis of its own, a prefork worker, an orchestrator and a model server.

A module gets its own `redis-server` (not the session's) so that its orchestrator never claims another
suite's turns and its worker's tools never mix with the session worker's catalogue on the same queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from ops.redis_server import RedisServer, find_free_port
from orchestrator.client import Client
from orchestrator.model import Message, ToolMessage, TurnOutcome
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
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


def wait_outcome(client: Client, turn_id: str, timeout_s: float) -> TurnOutcome:
    """Poll the turn until it is terminal (a short poll keeps the test independent of blocking reads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = client.outcome(turn_id)
        if outcome is not None:
            return outcome
        time.sleep(0.05)
    raw = client.redis.xrange(keys.turn_events(turn_id))
    listing = "\n".join(f"  {fields.get('name')}: {fields.get('data')}" for _id, fields in raw)
    raise AssertionError(
        f"turn {turn_id} not finished in {timeout_s} s ({client.get(turn_id).status}); events:\n{listing}"
    )


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    """Poll `predicate()` until true."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


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
