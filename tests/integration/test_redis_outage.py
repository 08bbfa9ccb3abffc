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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from ops.redis_server import RedisServer
from orchestrator.direct import call_tool
from orchestrator.runtime.publish import dispatch_call, get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.processes import WorkerHandle, start_worker
from workers import keys, tool
from workers.contract import ToolCallRequest, ToolOutcome, parse_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

THIS_MODULE = __name__
URL_OPTIONS = "?socket_timeout=5"


def _record(runs_file: str, event: str) -> None:
    with Path(runs_file).open("a") as out:
        out.write(event + "\n")


@tool(soft_time_limit=20, time_limit=30)
def outage_work(runs_file: str, seconds: float) -> str:
    """Records its start, works `seconds`, records its end; touches no Redis."""
    _record(runs_file, "start")
    time.sleep(seconds)
    _record(runs_file, "done")
    return "done"


@tool(soft_time_limit=2, time_limit=6)
def outage_quick(runs_file: str) -> str:
    """Records its start and returns at once; its short soft limit keeps its wait for Redis short."""
    _record(runs_file, "start")
    return "quick"


# --- helpers -------------------------------------------------------------------------------------------


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _runs(runs_file: Path) -> list[str]:
    return runs_file.read_text().split() if runs_file.exists() else []


def _publish(settings: Settings, spec_source: redis.Redis, name: str, arguments: dict[str, object]) -> str:
    request = ToolCallRequest(call_id=f"outage-{uuid.uuid4().hex}", tool=name, arguments=arguments)
    dispatch_call(get_producer_app(settings), read_catalogue(spec_source)[name], request)
    return request.call_id


def _read_outcome(client: redis.Redis, call_id: str, timeout_s: float) -> ToolOutcome:
    _wait_for(lambda: client.exists(keys.outcome(call_id)) == 1, timeout_s, f"the outcome of {call_id}")
    raw = client.get(keys.outcome(call_id))
    assert raw is not None
    return parse_tool_outcome(raw)


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
    runs_file = tmp_path / "runs"
    client = redis.Redis.from_url(url)
    try:
        call_id = _publish(
            Settings(redis_url=url), client, "outage_work", {"runs_file": str(runs_file), "seconds": 0.5}
        )
        _wait_for(lambda: _runs(runs_file) == ["start"], 20, "the tool to start")
        server.stop(keep_data=True)
        try:
            _wait_for(lambda: _runs(runs_file) == ["start", "done"], 10, "the tool to end")
            time.sleep(1.5)  # the worker meets a Redis that is down, and keeps trying
        finally:
            server.start()
        outcome = _read_outcome(client, call_id, 20)
        assert outcome.ok and outcome.content == "done" and outcome.attempts == 1, outcome
        time.sleep(1.0)  # room for a second run or a second write, which must not come
        assert _runs(runs_file) == ["start", "done"]
        assert client.llen(keys.late_outcomes(call_id)) == 0
        assert client.exists(keys.running(call_id)) == 0, "the running guard is dropped with the outcome"
        assert "redis unavailable for the outcome of " + call_id in worker.log_text()
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
            _wait_for(
                lambda: "redis unavailable before the call started" in handle.log_text(), 15, "a hand-back"
            )
            assert _runs(runs_file) == [], "a call must not run while its outcome cannot be recorded"
            state.start()
            outcome = _read_outcome(client, request.call_id, 20)
            assert outcome.ok and outcome.content == "quick", outcome
            time.sleep(1.0)
            assert _runs(runs_file) == ["start"]
            assert client.llen(keys.late_outcomes(request.call_id)) == 0
        finally:
            client.close()
            handle.stop()
