"""`HttpClient` and `AsyncHttpClient` over a real `toolloop api` (with a token), a real orchestrator, a real
prefork worker serving `workers.examples` and a real redis-server: the scripted models' tool-calling turns,
streams, approvals, cancels, direct tool calls, the errors of the tree, and an API restart ridden out mid-wait
and mid-stream.

The clients never touch Redis: while a test runs, every `REDIS` variable is gone from the environment and
opening a Redis client in this process fails the test (`no_redis`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from orchestrator import AsyncHttpClient, HttpClient
from orchestrator.errors import (
    ApiAuthError,
    ApiUnavailableError,
    CallNotWaitingError,
    ModelConfigError,
    UnknownToolError,
    UnknownTurnError,
)
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer, find_free_port
from orchestrator.store.turn_stream import (
    StreamEvent,
    TextDeltaEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
    TurnFinishedEvent,
)
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import WorkerHandle, start_worker
from tests.support.served import Served, answers, start_toolloop
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOKEN = "http-client-token"
TOOL_MODULES = ["workers.examples.arithmetic", "workers.examples.demo", "workers.examples.slow"]
WAIT_S = 60.0


class RestartableApi:
    """`toolloop api` on one port, to stop (killed, or SIGTERM) and start again there."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.port = find_free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.served: Served | None = None

    def start(self) -> None:
        env = {"TOOLLOOP_REDIS_URL": self.redis_url, "TOOLLOOP_API_TOKEN": TOKEN}
        self.served = start_toolloop(["api", "--host", "127.0.0.1", "--port", str(self.port)], env=env)
        self.served.wait_for(lambda: answers(f"{self.base_url}/healthz"), "the API answers")

    def stop(self, *, graceful: bool) -> None:
        assert self.served is not None
        if graceful:
            self.served.stop_with(signal.SIGTERM, within_s=15)
        self.served.kill()

    def restart(self, *, graceful: bool = False) -> None:
        self.stop(graceful=graceful)
        self.start()


@pytest.fixture(scope="module")
def examples_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, TOOL_MODULES, concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator(module_redis: RedisServer, examples_worker: WorkerHandle) -> Iterator[OrchestratorHandle]:
    # The scripted models are served inside the orchestrator: no model server of the test's.
    handle = start_orchestrator(module_redis.url, env={"TOOLLOOP_METRICS_PORT": str(find_free_port())})
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def api(module_redis: RedisServer, orchestrator: OrchestratorHandle) -> Iterator[RestartableApi]:
    served = RestartableApi(module_redis.url)
    served.start()
    yield served
    if served.served is not None:
        served.served.kill()


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Redis URL in the environment, and no Redis client opened by this process."""
    for name in [name for name in os.environ if "REDIS" in name.upper()]:
        monkeypatch.delenv(name)

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an HTTP client opened a Redis client")

    monkeypatch.setattr(redis.Redis, "__init__", forbidden)
    monkeypatch.setattr(aioredis.Redis, "__init__", forbidden)


@pytest.fixture
def client(api: RestartableApi) -> Iterator[HttpClient]:
    with HttpClient(api.base_url, token=TOKEN) as http_client:
        yield http_client


def tool_messages(outcome: TurnOutcome) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in outcome.messages if isinstance(m, ToolMessage)}


def assert_one_pass(ids: list[str]) -> None:
    """Stream ids in order, none twice."""
    keys = [tuple(int(part) for part in i.split("-")) for i in ids]
    assert keys == sorted(set(keys)), ids


def test_the_sync_client_runs_a_tool_calling_turn(client: HttpClient) -> None:
    assert client.ping()
    turn_id = client.submit(prompt="What is 2+3, times 4?", tools=["add", "multiply"], model="scripted:demo")
    typed = list(client.stream(turn_id))
    finished = typed[-1]
    assert isinstance(finished, TurnFinishedEvent) and finished.outcome.status == "completed"
    assert [e.tool for e in typed if isinstance(e, ToolFinishedEvent)] == ["add", "multiply"]
    assert "".join(e.text for e in typed if isinstance(e, TextDeltaEvent)) == finished.outcome.text
    outcome = client.wait(turn_id, timeout=WAIT_S)
    assert outcome.status == "completed" and "20" in (outcome.text or "")
    assert [m.content for m in tool_messages(outcome).values()] == ["5.0", "20.0"]
    view = client.get(turn_id)
    assert view.status == "completed" and view.outcome == outcome == client.outcome(turn_id)
    # The same events, raw, from the start and after any point: nothing lost, nothing repeated.
    events = list(client.events(turn_id))
    assert [e.id for e in events] == [e.id for e in typed]
    assert events[0].name == "turn_queued" and events[-1].name == "turn_finished"
    assert [e.id for e in client.events(turn_id, after=events[2].id)] == [e.id for e in events[3:]]


async def test_the_async_client_runs_a_tool_calling_turn(api: RestartableApi) -> None:
    async with AsyncHttpClient(api.base_url, token=TOKEN) as client:
        assert await client.ping()
        turn_id = await client.submit(
            prompt="What is the weather in Tokyo, and 6 times 7?",
            tools=["get_weather", "multiply"],
            model="scripted:demo",
        )
        assert (await client.get(turn_id)).id == turn_id
        typed = [event async for event in client.stream(turn_id)]
        outcome = await client.wait(turn_id, timeout=WAIT_S)
        events = [event async for event in client.events(turn_id)]
    assert isinstance(typed[-1], TurnFinishedEvent) and typed[-1].outcome == outcome
    assert outcome.status == "completed" and "42" in (outcome.text or "") and "Tokyo" in (outcome.text or "")
    assert sorted(e.tool for e in typed if isinstance(e, ToolFinishedEvent)) == ["get_weather", "multiply"]
    assert [e.id for e in events] == [e.id for e in typed]


def test_approvals_and_denials_and_the_errors_they_map_to(client: HttpClient) -> None:
    calls = [
        {"name": "close_ticket", "arguments": {"ticket_id": "t-approved"}},
        {"name": "close_ticket", "arguments": {"ticket_id": "t-denied"}},
    ]
    prompt = plan_prompt([{"calls": calls}, {"text": "done"}])
    turn_id = client.submit(prompt=prompt, tools=["close_ticket"], model="scripted:plan")
    waiting = wait_for(lambda: client.get(turn_id).pending_approvals or None, "two calls waiting")
    assert [(p.call_id, p.arguments) for p in waiting] == [
        ("call_r0_0", {"ticket_id": "t-approved"}),
        ("call_r0_1", {"ticket_id": "t-denied"}),
    ]
    with pytest.raises(ValueError, match="ticket_id"):  # edited arguments the tool's schema refuses (422)
        client.approve(turn_id, "call_r0_0", True, arguments={"ticket_id": ""})
    assert client.approve(turn_id, "call_r0_0", True, arguments={"ticket_id": "t-edited"})
    # 409: the first answer stands (`decided` while the orchestrator has not taken it in yet).
    with pytest.raises(CallNotWaitingError) as decided:
        client.approve(turn_id, "call_r0_0", False)
    assert decided.value.call_id == "call_r0_0"
    with pytest.raises(CallNotWaitingError) as unknown:  # 409 call_not_waiting
        client.approve(turn_id, "call_nope", True)
    assert not unknown.value.decided
    assert client.approve(turn_id, "call_r0_1", False, reason="not today")

    outcome = client.wait(turn_id, timeout=WAIT_S)
    answered = tool_messages(outcome)
    assert "t-edited" in str(answered["call_r0_0"].content)  # ran with the edited id (no such ticket)
    assert "not today" in str(answered["call_r0_1"].content)
    assert outcome.status == "stopped" and "not today" in (outcome.text or "")  # a denial stops the turn
    # The turn has ended: 409 turn_ended is False, as from the Redis clients.
    assert client.approve(turn_id, "call_r0_1", True) is False
    assert client.cancel(turn_id) is False


async def test_a_turn_cancelled_while_its_tool_runs(api: RestartableApi) -> None:
    prompt = plan_prompt([{"calls": [{"name": "slow", "arguments": {"seconds": 30}}]}, {"text": "slept"}])
    async with AsyncHttpClient(api.base_url, token=TOKEN) as client:
        turn_id = await client.submit(prompt=prompt, tools=["slow"], model="scripted:plan")
        seen: list[StreamEvent] = []
        async for event in client.stream(turn_id):
            seen.append(event)
            if isinstance(event, ToolStartedEvent):
                assert await client.cancel(turn_id)
        outcome = await client.wait(turn_id, timeout=WAIT_S)
        assert await client.cancel(turn_id) is False
    assert outcome.status == "cancelled"
    assert isinstance(seen[-1], TurnFinishedEvent) and seen[-1].outcome.status == "cancelled"


def test_refusals_map_into_the_error_tree(client: HttpClient, api: RestartableApi) -> None:
    for read in (client.get, client.cancel, lambda t: list(client.events(t)), lambda t: client.wait(t, 5)):
        with pytest.raises(UnknownTurnError, match="turn_nope"):
            read("turn_nope")
    with pytest.raises(UnknownTurnError, match="turn_nope"):
        client.approve("turn_nope", "call_1", True)
    assert client.outcome("turn_nope") is None  # as `Client.outcome`: no outcome stored under that id
    with pytest.raises(ValueError, match="call_id"):  # refused before anything is sent, as by `Client`
        client.approve("turn_nope", "", True)
    with pytest.raises(UnknownToolError) as unknown:
        client.submit(prompt="2+2?", tools=["add", "no_such_tool"], model="scripted:demo")
    assert unknown.value.unknown == ["no_such_tool"] and "add" in unknown.value.available
    with pytest.raises(UnknownToolError, match=r"unknown tool 'ad' \(did you mean 'add'\?\)"):  # as Client's
        client.submit(prompt="2+2?", tools=["ad"], model="scripted:demo")
    with pytest.raises(ModelConfigError):
        client.submit(prompt="2+2?", model="no-such-model")
    with pytest.raises(ValueError, match="output_schema"):  # checked by the API, not by the client
        client.submit(prompt="2+2?", model="scripted:demo", output_schema={"type": 12})
    # A caller's id: a submit repeated with it (a retry after a lost answer) stores the turn once.
    first = client.submit(prompt="2+2?", tools=["add"], model="scripted:demo", turn_id="my_turn_1")
    assert first == client.submit(prompt="again", model="scripted:demo", turn_id="my_turn_1") == "my_turn_1"
    assert client.wait(first, timeout=WAIT_S).text is not None
    with pytest.raises(ValueError, match="turn_id"):
        client.submit(prompt="2+2?", turn_id="has spaces/and slashes")
    # A silent turn outlasts a short wait.
    slow = plan_prompt([{"calls": [{"name": "slow", "arguments": {"seconds": 5}}]}, {"text": "slept"}])
    turn_id = client.submit(prompt=slow, tools=["slow"], model="scripted:plan")
    with pytest.raises(TimeoutError, match=turn_id):
        client.wait(turn_id, timeout=0.5)
    # The token is checked: without it (or with a wrong one), a 401, as `ApiAuthError` (a PermissionError).
    for token in (None, "wrong"):
        with HttpClient(api.base_url, token=token) as anonymous, pytest.raises(ApiAuthError) as refused:
            anonymous.get(turn_id)
        assert refused.value.status_code == 401 and isinstance(refused.value, PermissionError)
        assert api.base_url in str(refused.value) and "token" in str(refused.value)
    assert client.wait(turn_id, timeout=WAIT_S).text == "slept"


def test_a_wait_rides_out_an_api_restart(client: HttpClient, api: RestartableApi) -> None:
    prompt = plan_prompt([{"calls": [{"name": "slow", "arguments": {"seconds": 3}}]}, {"text": "slept"}])
    turn_id = client.submit(prompt=prompt, tools=["slow"], model="scripted:plan")
    got: list[TurnOutcome | BaseException] = []

    def wait() -> None:
        try:
            got.append(client.wait(turn_id, timeout=WAIT_S))
        except BaseException as exc:  # handed to the test's thread
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: client.get(turn_id).status == "running", "the turn runs")
    api.restart(graceful=True)  # a deploy: SIGTERM, then the new process on the same port
    waiter.join(timeout=WAIT_S)
    assert len(got) == 1 and isinstance(got[0], TurnOutcome), got
    assert got[0].status == "completed" and got[0].text == "slept"


async def test_a_stream_rides_out_an_api_crash_without_losing_or_repeating_an_event(
    api: RestartableApi,
) -> None:
    rounds: list[dict[str, Any]] = [
        {"calls": [{"name": "slow", "arguments": {"seconds": 3}}]},
        {"text": "after the crash"},
    ]
    async with AsyncHttpClient(api.base_url, token=TOKEN) as client:
        turn_id = await client.submit(prompt=plan_prompt(rounds), tools=["slow"], model="scripted:plan")
        seen: list[StreamEvent] = []
        async for event in client.stream(turn_id):
            seen.append(event)
            if isinstance(event, ToolStartedEvent):
                await asyncio.to_thread(api.restart)  # SIGKILL: the stream's connection drops
        every = [event.id async for event in client.events(turn_id)]
    assert [e.id for e in seen] == every
    assert_one_pass(every)
    assert isinstance(seen[-1], TurnFinishedEvent) and seen[-1].outcome.text == "after the crash"


def test_a_direct_tool_call_returns_the_outcome_the_redis_client_returns(client: HttpClient) -> None:
    # No model: `POST /v1/tools/add/calls`, held open until the worker's outcome is in.
    added = client.call_tool("add", {"a": 2, "b": 3}, timeout_s=WAIT_S)
    assert added.ok and added.tool == "add" and added.result == 5.0 and added.content == "5.0"
    # Failures are outcomes, as from `Client.call_tool`: nothing raises.
    misspelt = client.call_tool("ad", {"a": 2, "b": 3})
    assert not misspelt.ok and misspelt.failure_kind == "not_found" and "add" in (misspelt.error or "")
    refused = client.call_tool("add", {"a": "two"})
    assert refused.failure_kind == "validation" and "'add'" in (refused.error or "")
    unconfirmed = client.call_tool("close_ticket", {"ticket_id": "t-1"})
    assert unconfirmed.failure_kind == "confirmation_denied" and unconfirmed.attempts == 0
    slept = client.call_tool("slow", {"seconds": 10}, timeout_s=0.5)
    assert slept.failure_kind == "timeout" and slept.synthetic
    # A name no route could take as one segment ("/", "..") is a tool name like any other.
    for name in ("a/b", ".."):
        assert client.call_tool(name, {}).failure_kind == "not_found"
    with pytest.raises(ValueError, match="timeout_s"):  # checked by the API: JSON has no infinity
        client.call_tool("add", {"a": 1, "b": 2}, timeout_s=float("inf"))


async def test_the_async_client_calls_a_tool(api: RestartableApi) -> None:
    async with AsyncHttpClient(api.base_url, token=TOKEN) as client:
        outcomes = await asyncio.gather(
            *(client.call_tool("multiply", {"a": n, "b": 2}, context={"who": "test"}) for n in range(4))
        )
        approved = await client.call_tool("close_ticket", {"ticket_id": "t-none"}, approve=True)
    assert [o.result for o in outcomes] == [0.0, 2.0, 4.0, 6.0]
    assert approved.failure_kind != "confirmation_denied" and approved.attempts >= 1  # it ran


def test_an_api_that_is_not_there_is_api_unavailable_error(api: RestartableApi) -> None:
    nobody = f"http://127.0.0.1:{find_free_port()}"
    with HttpClient(nobody, token=TOKEN, retry_s=0.5) as client:
        for call in (lambda: client.get("t"), lambda: client.call_tool("add", {"a": 1, "b": 2})):
            with pytest.raises(ApiUnavailableError, match=nobody) as away:
                call()
            assert isinstance(away.value, TimeoutError) and away.value.base_url == nobody
        with pytest.raises(ApiUnavailableError, match=nobody):
            client.wait("t", timeout=0.5)  # away for all of the wait: not "the turn did not finish"
        with pytest.raises(ApiUnavailableError, match=r"tried for 0\.0 s"):  # never retried, as `Client.ping`
            client.ping()
