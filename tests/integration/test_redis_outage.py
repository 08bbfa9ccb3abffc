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

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.client.direct import call_tool
from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.broker import broker_holds
from tests.support.calls import publish_call, read_runs, record_run, wait_tool_outcome
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_at_most, wait_until
from workers import keys, tool
from workers.contract import ToolCallRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

THIS_MODULE = __name__
URL_OPTIONS = "?socket_timeout=5"


@tool(soft_time_limit=20, time_limit=30)
def outage_work(runs_file: str, gate_file: str, max_s: float = 15.0) -> str:
    """Records its start, works until `gate_file` exists (the test's go; `max_s` at most), records its end;
    touches no Redis."""
    record_run(runs_file, "start")
    wait_at_most(Path(gate_file).exists, max_s)
    record_run(runs_file, "done")
    return "done"


@tool(soft_time_limit=2, time_limit=6)
def outage_quick(runs_file: str) -> str:
    """Records its start and returns at once; its short soft limit keeps its wait for Redis short."""
    record_run(runs_file, "start")
    return "quick"


# --- helpers -------------------------------------------------------------------------------------------


# --- one Redis (broker and state), its URL with redis-py options ------------------------------------------


@pytest.fixture(scope="module")
def url(module_persistent_redis: RedisServer) -> str:
    return module_persistent_redis.url + URL_OPTIONS


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
    module_persistent_redis: RedisServer, url: str, worker: WorkerHandle, tmp_path: Path
) -> None:
    runs_file, gate = tmp_path / "runs", tmp_path / "gate"
    client = redis.Redis.from_url(url)
    try:
        arguments: dict[str, object] = {"runs_file": str(runs_file), "gate_file": str(gate)}
        call_id = publish_call(Settings(redis_url=url), client, "outage_work", arguments, prefix="outage")
        wait_until(lambda: read_runs(runs_file) == ["start"], "the tool to start")
        module_persistent_redis.stop(keep_data=True)
        try:
            gate.touch()  # the tool ends while Redis is down
            wait_until(lambda: read_runs(runs_file) == ["start", "done"], "the tool to end")
            # The worker meets a Redis that is down, and keeps trying.
            wait_until(
                lambda: "redis unavailable for the outcome of " + call_id in worker.log_text(),
                "the worker to find Redis down for the outcome",
            )
        finally:
            module_persistent_redis.start()
        outcome = wait_tool_outcome(client, call_id)
        assert outcome.ok and outcome.content == "done" and outcome.attempts == 1, outcome
        # A second run or a second write could only come from a delivery still held: wait until none is.
        queue = read_catalogue(client)["outage_work"].queue
        wait_until(lambda: not broker_holds(client, call_id, queue), "every delivery of the call to be acked")
        assert read_runs(runs_file) == ["start", "done"]
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
            assert read_runs(runs_file) == [], "a call must not run while its outcome cannot be recorded"
            state.start()
            outcome = wait_tool_outcome(client, request.call_id)
            assert outcome.ok and outcome.content == "quick", outcome
            # A second run could only come from a delivery still held: wait until none is.
            queue = catalogue["outage_quick"].queue
            wait_until(
                lambda: not broker_holds(broker_client, request.call_id, queue), "the call's retries to end"
            )
            assert read_runs(runs_file) == ["start"]
            assert client.llen(keys.late_outcomes(request.call_id)) == 0
        finally:
            client.close()
            broker_client.close()
            handle.stop()
