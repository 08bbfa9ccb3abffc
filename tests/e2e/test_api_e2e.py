"""The HTTP API end to end: a real `toolloop api` (uvicorn) on Redis, a prefork worker, an orchestrator and
the scripted model, all separate processes; the tests speak HTTP (and SSE) only, with the bearer token.

Two tests hold a turn silent for 7 s (a tool sleeping), longer than redis-py's default 5 s socket timeout:
SSE, `Client.wait`, `AsyncClient.wait` and `toolloop submit --wait` must wait it out rather than fail. That
they waited is shown by what they saw (the turn still running when they began, the tool's "slept 7 s"),
never by timing them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from orchestrator.client.redis_client import AsyncClient, Client
from orchestrator.model import TurnOutcome
from orchestrator.redis_server import RedisServer
from tests.support import served
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.sse import iter_sse
from tests.support.turns import assert_every_call_answered_once
from tests.support.waiting import wait_for, wait_until
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.usefixtures("orchestrator_process")]

TOKEN = "e2e-api-token"
QUIET_TOOL_S = 7  # longer than redis-py's default socket timeout (5 s)
QUIET_SLEEP = {"name": "e2e_sleep", "arguments": {"seconds": QUIET_TOOL_S}}


@pytest.fixture(scope="module")
def api_base_url(module_redis: RedisServer) -> Iterator[str]:
    """`toolloop api` as an operator runs it, with a token; its process group is killed at teardown."""
    with served.serving_api(module_redis.url, env={"TOOLLOOP_API_TOKEN": TOKEN}) as base_url:
        yield base_url


@pytest.fixture
def http(api_base_url: str) -> Iterator[httpx.Client]:
    # The read timeout outlasts the quiet tool: SSE sends nothing while the turn is silent.
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=api_base_url, headers=headers, timeout=30) as client:
        yield client


def submit(http: httpx.Client, rounds: list[dict[str, Any]]) -> str:
    reply = http.post("/v1/turns", json={"prompt": plan_prompt(rounds), "model": "scripted:plan"})
    assert reply.status_code == 202, reply.text
    turn_id: str = reply.json()["id"]
    return turn_id


def poll_turn(http: httpx.Client, turn_id: str) -> dict[str, Any]:
    """GET the turn until it has an outcome; its view then."""

    def finished() -> dict[str, Any] | None:
        view: dict[str, Any] = http.get(f"/v1/turns/{turn_id}").raise_for_status().json()
        return view if view["outcome"] else None

    return wait_for(finished, f"turn {turn_id} to finish")


def still_running(http: httpx.Client, turn_id: str) -> bool:
    """True while the turn has no outcome."""
    return http.get(f"/v1/turns/{turn_id}").raise_for_status().json()["outcome"] is None


def stream_events(http: httpx.Client, turn_id: str, on_event: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """The turn's SSE stream read to its end, as (name, event) pairs; `on_event(name, event)` sees each."""
    events: list[tuple[str, dict[str, Any]]] = []
    with http.stream("GET", f"/v1/turns/{turn_id}/events") as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for message in iter_sse(reply.iter_lines()):
            events.append((message.event or "", message.json()))
            if on_event is not None:
                on_event(*events[-1])
    return events


def tool_answers(outcome: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["tool_call_id"]: m for m in outcome["messages"] if m["role"] == "tool"}


def test_a_turn_submitted_over_http_completes(http: httpx.Client) -> None:
    tools = {t["name"]: t for t in http.get("/v1/tools").raise_for_status().json()}
    assert {"e2e_add", "e2e_multiply", "e2e_transfer"} <= set(tools)  # the real worker's catalogue
    assert tools["e2e_transfer"]["requires_confirmation"]
    calls = [
        {"name": "e2e_add", "arguments": {"a": 6, "b": 7}},
        {"name": "e2e_multiply", "arguments": {"a": 6, "b": 7}},
    ]
    turn_id = submit(http, [{"calls": calls}])
    view = poll_turn(http, turn_id)
    outcome = view["outcome"]
    assert view["status"] == "completed"
    assert (outcome["status"], outcome["stop_reason"], outcome["llm_calls"]) == ("completed", None, 2)
    answers = tool_answers(outcome)
    assert [answers[c]["content"] for c in ("call_r0_0", "call_r0_1")] == ["13.0", "42.0"]
    assert "13.0" in outcome["text"] and outcome["usage"]["total_tokens"] > 0
    assert_every_call_answered_once(TurnOutcome.model_validate(outcome).messages)


def test_sse_and_both_clients_wait_through_a_quiet_tool(
    http: httpx.Client, module_redis: RedisServer
) -> None:
    turn_id = submit(http, [{"calls": [QUIET_SLEEP]}])
    # Whether the turn was still running when each reader began: then its wait spans the quiet tool.
    began_early: dict[str, bool] = {}

    def async_wait() -> TurnOutcome:
        async def wait() -> TurnOutcome:
            async with AsyncClient(module_redis.url) as client:
                began_early["AsyncClient.wait"] = await client.outcome(turn_id) is None
                return await client.wait(turn_id, 60)

        return asyncio.run(wait())

    def sync_wait() -> TurnOutcome:
        with Client(module_redis.url) as client:
            began_early["Client.wait"] = client.outcome(turn_id) is None
            return client.wait(turn_id, 60)

    def on_first_event(_name: str, _data: dict[str, Any]) -> None:
        began_early.setdefault("SSE", still_running(http, turn_id))

    with ThreadPoolExecutor(max_workers=2) as pool:
        waits = [pool.submit(sync_wait), pool.submit(async_wait)]
        events = stream_events(http, turn_id, on_first_event)
        outcomes = [w.result(timeout=90) for w in waits]
    assert began_early == {"Client.wait": True, "AsyncClient.wait": True, "SSE": True}
    names = [name for name, _ in events]
    assert names[-1] == "turn_finished" and names.count("turn_finished") == 1
    for expected in ("turn_started", "model_called", "tool_dispatched", "tool_started", "tool_finished"):
        assert expected in names
    assert all(data["turn_id"] == turn_id for _, data in events)
    for outcome in outcomes:
        assert outcome.status == "completed" and outcome.turn_id == turn_id
        assert (
            f"slept {QUIET_TOOL_S}" in tool_answers(outcome.model_dump(mode="json"))["call_r0_0"]["content"]
        )


def test_toolloop_submit_wait_outlasts_a_quiet_tool(module_redis: RedisServer) -> None:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)}
    command = [str(TOOLLOOP_BIN), "submit", "--prompt", plan_prompt([{"calls": [QUIET_SLEEP]}])]
    command += ["--model", "scripted:plan", "--wait", "--timeout", "60"]
    # Submitted and waited on by one command: its wait began before the quiet tool did.
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["status"], outcome["stop_reason"]) == ("completed", None)
    assert f"slept {QUIET_TOOL_S}" in tool_answers(outcome)["call_r0_0"]["content"]


def toolloop_show(redis_server: RedisServer, turn_id: str) -> str:
    """`toolloop show TURN_ID` as an operator runs it; its stdout."""
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    command = [str(TOOLLOOP_BIN), "show", turn_id]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_confirmation_approved_and_another_denied_over_http(
    http: httpx.Client, module_redis: RedisServer
) -> None:
    suffix = uuid.uuid4().hex[:8]
    calls = [
        {"name": "e2e_transfer", "arguments": {"amount": 5, "to": f"alice-{suffix}"}},
        {"name": "e2e_transfer", "arguments": {"amount": 7, "to": f"bob-{suffix}"}},
    ]
    turn_id = submit(http, [{"calls": calls}])
    asked: list[str] = []

    waiting = [
        {"call_id": f"call_r0_{i}", "tool": "e2e_transfer", "arguments": call["arguments"]}
        for i, call in enumerate(calls)
    ]

    def answer_when_asked(name: str, data: dict[str, Any]) -> None:
        # The SSE stream names the calls to confirm; the turn's GET lists them too, with their arguments.
        if name != "approval_requested":
            return
        asked.extend(data["data"]["call_ids"])
        view = http.get(f"/v1/turns/{turn_id}").json()
        shown = ("call_id", "tool", "arguments")
        listed = [{k: w[k] for k in shown} for w in view["pending_approvals"]]
        assert (view["status"], listed) == ("waiting", waiting)
        assert {w["waiting_for"] for w in view["pending_approvals"]} == {"approval"}
        show = json.loads(toolloop_show(module_redis, turn_id))["pending_approvals"]
        assert [{k: w[k] for k in shown} for w in show] == waiting
        reply = http.post(f"/v1/turns/{turn_id}/approvals/call_r0_0", json={"approved": True})
        assert reply.status_code == 202 and reply.json() == {"id": turn_id, "accepted": True}
        # Once the orchestrator took the answer, only the other call is left to render.
        wait_until(
            lambda: (
                [
                    {k: w[k] for k in shown}
                    for w in http.get(f"/v1/turns/{turn_id}").json()["pending_approvals"]
                ]
                == waiting[1:]
            ),
            "the approved call to leave the pending list",
        )
        assert (
            http.post(f"/v1/turns/{turn_id}/approvals/call_r0_1", json={"approved": False}).status_code == 202
        )

    names = [name for name, _ in stream_events(http, turn_id, answer_when_asked)]
    assert sorted(asked) == ["call_r0_0", "call_r0_1"]
    assert names.count("approval_given") == 2 and names[-1] == "turn_finished"
    view = http.get(f"/v1/turns/{turn_id}").json()
    assert view["pending_approvals"] == []
    outcome = view["outcome"]
    answers = tool_answers(outcome)
    assert answers["call_r0_0"]["content"] == f"sent 5.0 to alice-{suffix}"
    assert answers["call_r0_1"]["failure_kind"] == FailureKind.CONFIRMATION_DENIED.value
    assert (outcome["status"], outcome["stop_reason"]) == ("stopped", "confirmation_denied")
    late = http.post(f"/v1/turns/{turn_id}/approvals/call_r0_1", json={"approved": True})
    assert late.status_code == 409


def test_cancel_over_http_mid_tool(http: httpx.Client) -> None:
    turn_id = submit(http, [{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 30}}]}])
    cancelled: list[str] = []

    def cancel_once_started(name: str, _data: dict[str, Any]) -> None:
        if name == "tool_started" and not cancelled:
            cancelled.append(turn_id)
            reply = http.post(f"/v1/turns/{turn_id}/cancel")
            assert reply.status_code == 202 and reply.json()["accepted"]

    names = [name for name, _ in stream_events(http, turn_id, cancel_once_started)]
    assert cancelled and names[-1] == "turn_finished"
    outcome = http.get(f"/v1/turns/{turn_id}").json()["outcome"]
    assert (outcome["status"], outcome["stop_reason"]) == ("cancelled", "cancelled")
    # Ended while the 30 s tool still ran: its call is answered by toolloop, not by the tool.
    answer = tool_answers(outcome)["call_r0_0"]
    assert (answer["failure_kind"], answer["synthetic"]) == (FailureKind.CANCELLED.value, True)
    assert http.post(f"/v1/turns/{turn_id}/cancel").status_code == 409


def test_the_token_is_enforced(api_base_url: str, http: httpx.Client) -> None:
    turn_id = submit(http, [{"text": "all fine"}])
    routes = [
        ("POST", "/v1/turns"),
        ("GET", f"/v1/turns/{turn_id}"),
        ("GET", f"/v1/turns/{turn_id}/events"),
        ("POST", f"/v1/turns/{turn_id}/cancel"),
        ("POST", f"/v1/turns/{turn_id}/approvals/call_r0_0"),
        ("GET", "/v1/tools"),
        ("GET", "/metrics"),
    ]
    with httpx.Client(base_url=api_base_url, timeout=10) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok", "redis": "ok"}
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
                reply = anonymous.request(
                    method, path, headers=headers, json={"prompt": "x", "approved": True}
                )
                assert reply.status_code == 401, (method, path, headers)
                assert reply.headers["www-authenticate"] == "Bearer"
    outcome = poll_turn(http, turn_id)["outcome"]
    assert (outcome["status"], outcome["text"]) == ("completed", "all fine")  # nothing above touched it


def sse_ids(text: str) -> list[str]:
    """The `id` fields of an SSE body, in order."""
    return [message.id for message in iter_sse(text.splitlines()) if message.id is not None]


def read_sse_ids(
    http: httpx.Client, turn_id: str, headers: dict[str, str], stop_after: int | None = None
) -> list[str]:
    """The SSE ids of the turn's stream: all of it, or the first `stop_after` (then the client hangs up)."""
    ids: list[str] = []
    with http.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        for message in iter_sse(reply.iter_lines()):
            ids += [message.id] if message.id is not None else []
            if stop_after is not None and len(ids) == stop_after:
                break
    return ids


def test_a_client_that_reconnects_with_last_event_id_gets_the_rest_once(http: httpx.Client) -> None:
    calls = [{"name": "e2e_sleep", "arguments": {"seconds": 1}}]
    turn_id = submit(http, [{"calls": calls}, {"calls": calls}])
    # An EventSource cut after three events reconnects with the last id it saw, as browsers do.
    first = read_sse_ids(http, turn_id, {}, stop_after=3)
    rest = read_sse_ids(http, turn_id, {"Last-Event-ID": first[-1]})
    whole = read_sse_ids(http, turn_id, {})
    assert first + rest == whole and len(set(whole)) == len(whole)
    # The query's `after` does the same for a client that is not an EventSource; the header wins over it.
    path = f"/v1/turns/{turn_id}/events"
    assert sse_ids(http.get(path, params={"after": whole[1]}).text) == whole[2:]
    both = http.get(path, params={"after": whole[1]}, headers={"Last-Event-ID": whole[-2]})
    assert sse_ids(both.text) == whole[-1:]
