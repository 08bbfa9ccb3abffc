"""Redis stopped and restarted around one tool call, with a real redis-server and a real prefork worker.

- Redis down as the tool ends: the worker keeps the outcome and writes it once Redis is back; the outcome
  lands once (no late duplicate), and the tool ran once.
- Redis (the state one; the broker stays up) down as the call arrives: the call waits, is handed back to
  Celery unstarted when the outage outlasts its wait, and runs once when Redis is back — never blind.
- A Redis URL with redis-py query options (`?socket_timeout=5`) serves as the broker too (no broker_url).

The tools are defined here and record their runs in files (Redis is down while they run), served by workers
of this module's own Redis servers (`TOOLLOOP_TOOL_MODULES` names this module).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ops.redis_server import RedisServer
from orchestrator.direct import call_tool
from orchestrator.runtime.publish import dispatch_call, get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_until
from workers import keys, tool
from workers.contract import ToolCallRequest, ToolOutcome, parse_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

THIS_MODULE = __name__
URL_OPTIONS = "?socket_timeout=5"
# kombu's hash of the messages delivered to a worker and not acked yet (its Redis transport's `unacked_key`).
UNACKED_KEY = "unacked"


def _record(runs_file: str, event: str) -> None:
    with Path(runs_file).open("a") as out:
        out.write(event + "\n")


@tool(soft_time_limit=20, time_limit=30)
def outage_work(runs_file: str, gate_file: str, max_s: float = 15.0) -> str:
    """Records its start, works until `gate_file` exists (the test's go; `max_s` at most), records its end;
    touches no Redis."""
    _record(runs_file, "start")
    deadline = time.monotonic() + max_s
    while not Path(gate_file).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _record(runs_file, "done")
    return "done"


@tool(soft_time_limit=2, time_limit=6)
def outage_quick(runs_file: str) -> str:
    """Records its start and returns at once; its short soft limit keeps its wait for Redis short."""
    _record(runs_file, "start")
    return "quick"


# --- helpers -------------------------------------------------------------------------------------------


def _runs(runs_file: Path) -> list[str]:
    return runs_file.read_text().split() if runs_file.exists() else []


def _publish(settings: Settings, spec_source: redis.Redis, name: str, arguments: dict[str, object]) -> str:
    request = ToolCallRequest(call_id=f"outage-{uuid.uuid4().hex}", tool=name, arguments=arguments)
    dispatch_call(get_producer_app(settings), read_catalogue(spec_source)[name], request)
    return request.call_id


def _read_outcome(client: redis.Redis, call_id: str) -> ToolOutcome:
    wait_until(lambda: client.exists(keys.outcome(call_id)) == 1, f"the outcome of {call_id}")
    raw = client.get(keys.outcome(call_id))
    assert raw is not None
    return parse_tool_outcome(raw)


def _broker_holds(broker: redis.Redis, call_id: str, queue: str) -> bool:
    """Whether a message of the call is still queued, or delivered and not acked yet (a copy restored after
    the outage, a retry waiting for its countdown): once neither, no delivery of it is left to run or to
    write. A message's headers carry its task id, `<call id>:<attempt>`."""
    needle = call_id.encode()
    messages = [*broker.hvals(UNACKED_KEY), *broker.lrange(queue, 0, -1)]
    return any(needle in message for message in messages)


# --- one Redis (broker and state), its URL with redis-py options ------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as redis_server:
        yield redis_server


@pytest.fixture(scope="module")
def url(server: RedisServer) -> str:
    return server.url + URL_OPTIONS


@pytest.fixture(scope="module")
def worker(url: str) -> Iterator[WorkerHandle]:
    handle = start_worker(url, [THIS_MODULE], concurrency=1)
    yield handle
    handle.stop()


def test_a_url_with_redis_py_options_is_the_broker_too(url: str, worker: WorkerHandle) -> None:
    settings = Settings(redis_url=url)
    assert "socket_timeout" not in settings.effective_broker_url
    outcome = call_tool(url, "outage_quick", {"runs_file": "/dev/null"}, timeout_s=20, settings=settings)
    assert outcome.ok and outcome.content == "quick", outcome


def test_redis_down_when_the_tool_ends_the_outcome_lands_once(
    server: RedisServer, url: str, worker: WorkerHandle, tmp_path: Path
) -> None:
    runs_file, gate = tmp_path / "runs", tmp_path / "gate"
    client = redis.Redis.from_url(url)
    try:
        arguments: dict[str, object] = {"runs_file": str(runs_file), "gate_file": str(gate)}
        call_id = _publish(Settings(redis_url=url), client, "outage_work", arguments)
        wait_until(lambda: _runs(runs_file) == ["start"], "the tool to start")
        server.stop(keep_data=True)
        try:
            gate.touch()  # the tool ends while Redis is down
            wait_until(lambda: _runs(runs_file) == ["start", "done"], "the tool to end")
            # The worker meets a Redis that is down, and keeps trying.
            wait_until(
                lambda: "redis unavailable for the outcome of " + call_id in worker.log_text(),
                "the worker to find Redis down for the outcome",
            )
        finally:
            server.start()
        outcome = _read_outcome(client, call_id)
        assert outcome.ok and outcome.content == "done" and outcome.attempts == 1, outcome
        # A second run or a second write could only come from a delivery still held: wait until none is.
        queue = read_catalogue(client)["outage_work"].queue
        wait_until(
            lambda: not _broker_holds(client, call_id, queue), "every delivery of the call to be acked"
        )
        assert _runs(runs_file) == ["start", "done"]
        assert client.llen(keys.late_outcomes(call_id)) == 0
        assert client.exists(keys.running(call_id)) == 0, "the running guard is dropped with the outcome"
    finally:
        client.close()


# --- the state Redis down while the broker stays up ----------------------------------------------------


def test_a_call_that_cannot_start_is_retried_by_celery_and_runs_once(tmp_path: Path) -> None:
    runs_file = tmp_path / "runs"
    with RedisServer() as broker, RedisServer(appendonly=True) as state:
        settings = Settings(redis_url=state.url, broker_url=broker.url)
        handle = start_worker(
            state.url, [THIS_MODULE], concurrency=1, env={"TOOLLOOP_BROKER_URL": broker.url}
        )
        client = redis.Redis.from_url(state.url)
        broker_client = redis.Redis.from_url(broker.url)
        try:
            spec_source = client
            catalogue = read_catalogue(spec_source)  # read while the state Redis is up
            state.stop(keep_data=True)
            request = ToolCallRequest(
                call_id=f"outage-{uuid.uuid4().hex}",
                tool="outage_quick",
                arguments={"runs_file": str(runs_file)},
            )
            dispatch_call(get_producer_app(settings), catalogue["outage_quick"], request)
            # The call waits at most half its 2 s soft limit for Redis, then goes back to the broker.
            wait_until(
                lambda: "redis unavailable before the call started" in handle.log_text(), "a hand-back"
            )
            assert _runs(runs_file) == [], "a call must not run while its outcome cannot be recorded"
            state.start()
            outcome = _read_outcome(client, request.call_id)
            assert outcome.ok and outcome.content == "quick", outcome
            # A second run could only come from a delivery still held: wait until none is.
            queue = catalogue["outage_quick"].queue
            wait_until(
                lambda: not _broker_holds(broker_client, request.call_id, queue), "the call's retries to end"
            )
            assert _runs(runs_file) == ["start"]
            assert client.llen(keys.late_outcomes(request.call_id)) == 0
        finally:
            client.close()
            broker_client.close()
            handle.stop()
