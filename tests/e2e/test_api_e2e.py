"""The HTTP API end to end: a real `toolloop api` (uvicorn) on Redis, a prefork worker, an orchestrator and
the scripted model, all separate processes; the tests speak HTTP (and SSE) only, with the bearer token.

Two tests hold a turn silent for 7 s (a tool sleeping), longer than redis-py's default 5 s socket timeout:
SSE, `Client.wait`, `AsyncClient.wait` and `toolloop submit --wait` must wait it out rather than fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops.redis_server import RedisServer, find_free_port
from orchestrator.client import AsyncClient, Client
from orchestrator.model import TurnOutcome
from tests.e2e.conftest import assert_every_call_answered_once
from tests.support.processes import ROOT, TOOLLOOP_BIN
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60), pytest.mark.usefixtures("orchestrator_process")]

TOKEN = "e2e-api-token"
QUIET_TOOL_S = 7  # longer than redis-py's default socket timeout (5 s)
QUIET_SLEEP = {"name": "e2e_sleep", "arguments": {"seconds": QUIET_TOOL_S}}


def plan_prompt(rounds: list[dict[str, Any]]) -> str:
    """A prompt the scripted `plan` model plays round by round; unique, so no two tests share a turn."""
    return f"marker-{uuid.uuid4().hex} " + json.dumps({"plan": rounds})


@pytest.fixture(scope="module")
def api_base_url(e2e_redis: RedisServer) -> Iterator[str]:
    """`toolloop api` as an operator runs it, with a token; its process group is killed at teardown."""
    port = find_free_port()
    env = {**os.environ, "TOOLLOOP_REDIS_URL": e2e_redis.url, "TOOLLOOP_API_TOKEN": TOKEN}
    env["PYTHONPATH"] = str(ROOT)
    log = Path(tempfile.mkstemp(prefix="toolloop-api-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(TOOLLOOP_BIN), "api", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, process, log)
        yield base_url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)
        log.unlink(missing_ok=True)


def _wait_healthy(base_url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"toolloop api exited with {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"toolloop api not healthy in {timeout_s} s:\n{log.read_text()}")


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


def poll_turn(http: httpx.Client, turn_id: str, timeout_s: float, until: str = "outcome") -> dict[str, Any]:
    """GET the turn until it has an outcome (or, with `until="waiting"`, until it waits for approval)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view: dict[str, Any] = http.get(f"/v1/turns/{turn_id}").raise_for_status().json()
        if (until == "outcome" and view["outcome"]) or view["status"] == until:
            return view
        time.sleep(0.05)
    raise AssertionError(f"turn {turn_id} not {until} in {timeout_s} s: {view['status']}")


def stream_events(http: httpx.Client, turn_id: str, on_event: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """The turn's SSE stream read to its end, as (name, event) pairs; `on_event(name, event)` sees each."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    with http.stream("GET", f"/v1/turns/{turn_id}/events") as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
                if on_event is not None:
                    on_event(name, events[-1][1])
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
    view = poll_turn(http, turn_id, 30)
    outcome = view["outcome"]
    assert view["status"] == "completed"
    assert (outcome["status"], outcome["stop_reason"], outcome["llm_calls"]) == ("completed", None, 2)
    answers = tool_answers(outcome)
    assert [answers[c]["content"] for c in ("call_r0_0", "call_r0_1")] == ["13.0", "42.0"]
    assert "13.0" in outcome["text"] and outcome["usage"]["total_tokens"] > 0
    assert_every_call_answered_once(TurnOutcome.model_validate(outcome).messages)


def test_sse_and_both_clients_wait_through_a_quiet_tool(http: httpx.Client, e2e_redis: RedisServer) -> None:
    turn_id = submit(http, [{"calls": [QUIET_SLEEP]}])

    def async_wait() -> TurnOutcome:
        async def wait() -> TurnOutcome:
            async with AsyncClient(e2e_redis.url) as client:
                return await client.wait(turn_id, 40)

        return asyncio.run(wait())

    def sync_wait() -> TurnOutcome:
        with Client(e2e_redis.url) as client:
            return client.wait(turn_id, 40)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        waits = [pool.submit(sync_wait), pool.submit(async_wait)]
        events = stream_events(http, turn_id)
        outcomes = [w.result(timeout=45) for w in waits]
    assert time.monotonic() - started >= QUIET_TOOL_S
    names = [name for name, _ in events]
    assert names[-1] == "turn_finished" and names.count("turn_finished") == 1
    for expected in ("turn_started", "model_called", "tool_dispatched", "tool_started", "tool_finished"):
        assert expected in names
    finished_at = {name: data["at"] for name, data in events}
    assert finished_at["tool_finished"] - finished_at["tool_started"] >= QUIET_TOOL_S - 0.5
    assert all(data["turn_id"] == turn_id for _, data in events)
    for outcome in outcomes:
        assert outcome.status == "completed" and outcome.turn_id == turn_id
        assert (
            f"slept {QUIET_TOOL_S}" in tool_answers(outcome.model_dump(mode="json"))["call_r0_0"]["content"]
        )


def test_toolloop_submit_wait_outlasts_a_quiet_tool(e2e_redis: RedisServer) -> None:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": e2e_redis.url, "PYTHONPATH": str(ROOT)}
    command = [str(TOOLLOOP_BIN), "submit", "--prompt", plan_prompt([{"calls": [QUIET_SLEEP]}])]
    command += ["--model", "scripted:plan", "--wait", "--timeout", "40"]
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= QUIET_TOOL_S
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


def poll_until(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        time.sleep(0.05)


def test_one_confirmation_approved_and_another_denied_over_http(
    http: httpx.Client, e2e_redis: RedisServer
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
        assert (view["status"], view["pending_approvals"]) == ("waiting", waiting)
        assert json.loads(toolloop_show(e2e_redis, turn_id))["pending_approvals"] == waiting
        reply = http.post(f"/v1/turns/{turn_id}/approvals/call_r0_0", json={"approved": True})
        assert reply.status_code == 202 and reply.json() == {"id": turn_id, "accepted": True}
        # Once the orchestrator took the answer, only the other call is left to render.
        poll_until(lambda: http.get(f"/v1/turns/{turn_id}").json()["pending_approvals"] == waiting[1:], 10)
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
    cancelled_at: list[float] = []

    def cancel_once_started(name: str, _data: dict[str, Any]) -> None:
        if name == "tool_started" and not cancelled_at:
            cancelled_at.append(time.monotonic())
            reply = http.post(f"/v1/turns/{turn_id}/cancel")
            assert reply.status_code == 202 and reply.json()["accepted"]

    names = [name for name, _ in stream_events(http, turn_id, cancel_once_started)]
    assert cancelled_at and time.monotonic() - cancelled_at[0] < 5
    assert names[-1] == "turn_finished"
    outcome = http.get(f"/v1/turns/{turn_id}").json()["outcome"]
    assert (outcome["status"], outcome["stop_reason"]) == ("cancelled", "cancelled")
    assert tool_answers(outcome)["call_r0_0"]["failure_kind"] == FailureKind.CANCELLED.value
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
    outcome = poll_turn(http, turn_id, 30)["outcome"]
    assert (outcome["status"], outcome["text"]) == ("completed", "all fine")  # nothing above touched it


def sse_ids(text: str) -> list[str]:
    """The `id` fields of an SSE body, in order."""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("id:")]


def read_sse_ids(
    http: httpx.Client, turn_id: str, headers: dict[str, str], stop_after: int | None = None
) -> list[str]:
    """The SSE ids of the turn's stream: all of it, or the first `stop_after` (then the client hangs up)."""
    ids: list[str] = []
    with http.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            ids += sse_ids(line)
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
