"""Faults through the real system: deadlines, hard limits, cancellation, and processes killed mid-turn.

The first tests share the module's Redis, worker and orchestrator. The two that SIGKILL a process get a
Redis, workers and orchestrators of their own, so that nothing they kill is shared with another test.

No test times the system: a stop that came "in time" is one that answered the call for the tool (a
synthetic outcome) while the tool itself would still be running; speed is `make bench`'s business.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, start_orchestrator
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.plans import plan_prompt
from tests.support.processes import start_worker
from tests.support.turns import assert_every_call_answered_once, event_data, wait_outcome
from tests.support.waiting import wait_until
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def only_tool_message(messages: list[Any]) -> ToolMessage:
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert len(tools) == 1, tools
    return tools[0]


@pytest.mark.usefixtures("orchestrator_process")
def test_deadline_during_a_long_tool_ends_the_turn_at_once(client: Client) -> None:
    prompt = plan_prompt([{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 30}}]}])
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits={"deadline_s": 3})
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "deadline", True)
    # "At once": toolloop answered the call itself; the 30 s tool never got to answer it.
    answer = only_tool_message(outcome.messages)
    assert answer.failure_kind == FailureKind.DEADLINE_EXCEEDED
    assert answer.synthetic
    assert not event_data(client.redis, turn_id, "tool_finished")
    assert_every_call_answered_once(outcome.messages)


@pytest.mark.usefixtures("orchestrator_process")
def test_a_hard_limited_tool_is_answered_timeout_and_the_turn_goes_on(client: Client) -> None:
    stubborn = {"name": "e2e_stubborn", "arguments": {"seconds": 20}}
    prompt = plan_prompt([{"calls": [stubborn]}, {"text": "ok"}])
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.text) == ("completed", "ok")
    # Killed by its hard limit: answered `timeout`, never "finished" (what it says after its 20 s).
    answer = only_tool_message(outcome.messages)
    assert answer.failure_kind == FailureKind.TIMEOUT
    assert answer.content.startswith("Error: ")
    assert outcome.llm_calls == 2
    assert_every_call_answered_once(outcome.messages)


@pytest.mark.usefixtures("orchestrator_process")
def test_cancel_mid_tool_ends_the_turn_cancelled(client: Client) -> None:
    prompt = plan_prompt([{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 30}}]}])
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    wait_until(lambda: event_data(client.redis, turn_id, "tool_started"), "the tool to start")
    assert client.cancel(turn_id)
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.stop_reason) == ("cancelled", "cancelled")
    # Ended while the 30 s tool still ran: the call is answered by toolloop, not by the tool.
    answer = only_tool_message(outcome.messages)
    assert answer.failure_kind == FailureKind.CANCELLED
    assert answer.synthetic
    assert_every_call_answered_once(outcome.messages)
    assert not client.cancel(turn_id)  # already over


def test_an_orchestrator_killed_mid_turn_is_replaced_and_the_tool_runs_once(
    own_redis: RedisServer, model_server: RecordingModelServer
) -> None:
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=1)
    first = start_orchestrator(own_redis.url, model_base_url=model_server.base_url)
    second = None
    client = Client(own_redis.url)
    try:
        key = f"takeover-{uuid.uuid4().hex[:8]}"
        call = {"name": "e2e_counted", "arguments": {"key": key, "seconds": 2}}
        turn_id = client.submit(prompt=plan_prompt([{"calls": [call]}]), model="scripted:plan")
        wait_until(lambda: event_data(client.redis, turn_id, "tool_started"), "the tool to start")
        first.kill()
        second = start_orchestrator(own_redis.url, model_base_url=model_server.base_url)
        outcome = wait_outcome(client, turn_id)
        assert outcome.status == "completed", outcome
        assert only_tool_message(outcome.messages).content == f"run 1 of {key}"
        assert int(client.redis.get(f"{COUNTER_PREFIX}{key}") or 0) == 1
        assert client.redis.get(keys.turn_lease(turn_id)) is None  # released when it finished
        assert_every_call_answered_once(outcome.messages)
        # The first owner is dead: the turn was resumed once, by the second.
        assert len(event_data(client.redis, turn_id, "turn_resumed")) == 1
    finally:
        client.redis.close()
        for process in (first, second):
            if process is not None:
                process.stop()
        worker.stop()


def test_a_worker_killed_mid_tool_is_survived(
    own_redis: RedisServer, model_server: RecordingModelServer
) -> None:
    workers = [start_worker(own_redis.url, [E2E_TOOLS], concurrency=1) for _ in range(2)]
    orchestrator = start_orchestrator(own_redis.url, model_base_url=model_server.base_url)
    client = Client(own_redis.url)
    try:
        key = f"fragile-{uuid.uuid4().hex[:8]}"
        call = {"name": "e2e_fragile", "arguments": {"key": key, "seconds": 30}}
        turn_id = client.submit(prompt=plan_prompt([{"calls": [call]}]), model="scripted:plan")
        wait_until(lambda: event_data(client.redis, turn_id, "tool_started"), "the tool to start")
        ran_on = event_data(client.redis, turn_id, "tool_started")[0]["worker"]
        victim = next(w for w in workers if w.hostname == ran_on)
        os.killpg(victim.pid, signal.SIGKILL)  # the main process and its pool: the whole worker dies
        outcome = wait_outcome(client, turn_id)
        assert outcome.status == "completed", outcome
        # Found lost by the orchestrator's timer (hard limit plus grace) and sent again as attempt 2, not
        # redelivered by the broker once its visibility timeout (hours) is over.
        assert only_tool_message(outcome.messages).content == f"run 2 of {key}"
        assert [e["attempt"] for e in event_data(client.redis, turn_id, "tool_redispatched")] == [2]
        assert_every_call_answered_once(outcome.messages)
    finally:
        client.redis.close()
        orchestrator.stop()
        for worker in workers:
            worker.stop()
