"""Whole turns through the real system: Redis, a prefork worker, `toolloop orchestrator` and a model server.

The model is the scripted `plan` model over HTTP: each test's first user message holds the rounds it plays,
so a test says exactly which tool calls the model makes. Turns go in and come out through the Client.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest
import redis

from orchestrator.client import Client
from orchestrator.model import ToolMessage
from tests.e2e.conftest import assert_every_call_answered_once, wait_for, wait_outcome
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.e2e_tools import COUNTER_PREFIX
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60), pytest.mark.usefixtures("orchestrator_process")]


def plan_prompt(rounds: list[dict[str, Any]]) -> tuple[str, str]:
    """A prompt that plays `rounds`, and a marker unique to it (to count its model requests)."""
    marker = f"marker-{uuid.uuid4().hex}"
    return f"{marker} " + json.dumps({"plan": rounds}), marker


def tool_messages(messages: list[Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def test_multi_tool_turn_completes(client: Client) -> None:
    prompt, _ = plan_prompt(
        [
            {
                "calls": [
                    {"name": "e2e_add", "arguments": {"a": 6, "b": 7}},
                    {"name": "e2e_multiply", "arguments": {"a": 6, "b": 7}},
                ]
            },
            {"calls": [{"name": "e2e_add", "arguments": {"a": 13, "b": 42}}]},
        ]
    )
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    outcome = wait_outcome(client, turn_id, 30)
    assert (outcome.status, outcome.stop_reason) == ("completed", None)
    answers = tool_messages(outcome.messages)
    assert [answers[c].content for c in ("call_r0_0", "call_r0_1", "call_r1_0")] == ["13.0", "42.0", "55.0"]
    assert not any(m.is_error for m in answers.values())
    assert outcome.llm_calls == 3
    assert outcome.tool_executions == 3
    assert outcome.text and "55.0" in outcome.text
    assert outcome.usage.total_tokens > 0
    assert_every_call_answered_once(outcome.messages)
    names = [event.name for event in client.events(turn_id)]
    for expected in ("turn_started", "model_called", "tool_dispatched", "tool_started", "tool_finished"):
        assert expected in names
    assert names[-1] == "turn_finished"


def test_parallel_calls_with_unknown_tool_and_bad_arguments_are_each_answered_once(client: Client) -> None:
    prompt, _ = plan_prompt(
        [
            {
                "calls": [
                    {"name": "e2e_add", "arguments": {"a": 1, "b": 2}},
                    {"name": "no_such_tool", "arguments": {}},
                    {"name": "e2e_multiply", "arguments": {"a": "six"}},
                    {"name": "e2e_add", "arguments_raw": "{not json"},
                ]
            }
        ]
    )
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    outcome = wait_outcome(client, turn_id, 30)
    assert outcome.status == "completed"
    answers = tool_messages(outcome.messages)
    assert answers["call_r0_0"].content == "3.0"
    assert answers["call_r0_1"].failure_kind == FailureKind.NOT_FOUND
    assert "no_such_tool" in answers["call_r0_1"].content and "e2e_add" in answers["call_r0_1"].content
    assert answers["call_r0_2"].failure_kind == FailureKind.VALIDATION
    assert answers["call_r0_3"].failure_kind == FailureKind.VALIDATION
    assert outcome.tool_executions == 1  # invalid calls are never dispatched
    assert_every_call_answered_once(outcome.messages)


def test_max_llm_calls_stops_after_exactly_n_model_calls(
    client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = plan_prompt(
        [{"calls": [{"name": "e2e_add", "arguments": {"a": 1, "b": 1}}], "repeat": True}]
    )
    limits = {"max_llm_calls": 3, "repeat_guard_rounds": None}
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits=limits)
    outcome = wait_outcome(client, turn_id, 30)
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "max_llm_calls", True)
    assert outcome.llm_calls == 3
    assert model_server.requests_with(marker) == 3
    assert_every_call_answered_once(outcome.messages)


def test_a_provider_that_keeps_failing_ends_the_turn_failed(
    client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = plan_prompt(
        [{"error": {"status": 503, "message": "overloaded, try later"}, "repeat": True}]
    )
    limits = {"max_model_retries": 1}
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits=limits)
    outcome = wait_outcome(client, turn_id, 30)
    assert (outcome.status, outcome.stop_reason) == ("failed", "provider_error")
    assert outcome.error is not None
    assert outcome.error.status == 503
    assert "overloaded" in outcome.error.message
    assert model_server.requests_with(marker) == 2  # the first call and its one retry


def test_one_confirmation_approved_and_another_denied(client: Client, e2e_redis_client: redis.Redis) -> None:
    suffix = uuid.uuid4().hex[:8]
    alice, bob = f"alice-{suffix}", f"bob-{suffix}"
    prompt, _ = plan_prompt(
        [
            {
                "calls": [
                    {"name": "e2e_transfer", "arguments": {"amount": 5, "to": alice}},
                    {"name": "e2e_transfer", "arguments": {"amount": 7, "to": bob}},
                ]
            }
        ]
    )
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    wait_for(lambda: client.get(turn_id).status.value == "waiting", 20, "the turn to wait for approval")
    assert client.approve(turn_id, "call_r0_0", True)
    assert client.approve(turn_id, "call_r0_1", False)
    outcome = wait_outcome(client, turn_id, 30)
    answers = tool_messages(outcome.messages)
    assert answers["call_r0_0"].content == f"sent 5.0 to {alice}"
    assert answers["call_r0_1"].failure_kind == FailureKind.CONFIRMATION_DENIED
    assert (outcome.status, outcome.stop_reason) == ("stopped", "confirmation_denied")
    assert int(e2e_redis_client.get(f"{COUNTER_PREFIX}transfer:{alice}") or 0) == 1
    assert e2e_redis_client.get(f"{COUNTER_PREFIX}transfer:{bob}") is None
    assert_every_call_answered_once(outcome.messages)


def test_one_orchestrator_drives_many_turns_at_once(client: Client) -> None:
    # Each turn holds a 1 s tool; with two worker processes, 8 turns one after another would take 8 s.
    sleep = {"name": "e2e_sleep", "arguments": {"seconds": 1}}
    turn_ids = [
        client.submit(prompt=plan_prompt([{"calls": [sleep]}])[0], model="scripted:plan") for _ in range(8)
    ]
    outcomes = [wait_outcome(client, turn_id, 30) for turn_id in turn_ids]
    assert [o.status for o in outcomes] == ["completed"] * 8
    started = [float(f["at"]) for t in turn_ids for f in _events(client, t, "tool_started")]
    finished = [float(f["at"]) for t in turn_ids for f in _events(client, t, "turn_finished")]
    assert max(finished) - min(started) < 7, "turns ran one after another"


def _events(client: Client, turn_id: str, name: str) -> list[dict[str, str]]:
    return [
        fields
        for _id, fields in client.redis.xrange(f"toolloop:turn:{turn_id}:events")
        if fields["name"] == name
    ]


def test_the_orchestrator_exposes_prometheus_metrics(orchestrator_process: OrchestratorHandle) -> None:
    port = orchestrator_process.env["TOOLLOOP_METRICS_PORT"]
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert re.search(r'toolloop_tool_calls_total\{kind="ok",tool="e2e_add"\} [1-9]', body), body
    assert re.search(r'toolloop_tool_calls_total\{kind="not_found",tool="no_such_tool"\} 1\.0', body)
    assert re.search(r'toolloop_turns_finished_total\{status="completed",stop_reason="none"\} [1-9]', body)
    assert re.search(r'toolloop_model_calls_total\{outcome="ok",provider="scripted"\} [1-9]', body)


def test_the_orchestrator_stops_gracefully_on_sigterm(orchestrator_process: OrchestratorHandle) -> None:
    # Runs last in this module: the module's orchestrator must exit cleanly on SIGTERM, well in time.
    assert orchestrator_process.stop(timeout_s=10) == 0, orchestrator_process.log_text()
