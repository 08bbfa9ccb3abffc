"""Whole turns through the real system: Redis, a prefork worker, `toolloop orchestrator` and a model server.

The model is the scripted `plan` model over HTTP: each test's first user message holds the rounds it plays,
so a test says exactly which tool calls the model makes. Turns go in and come out through the Client.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.plans import marked_plan_prompt, plan_prompt
from tests.support.turns import assert_every_call_answered_once, wait_outcome
from tests.support.waiting import wait_until
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.usefixtures("orchestrator_process")]


def tool_messages(messages: list[Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def test_multi_tool_turn_completes(client: Client) -> None:
    prompt, _ = marked_plan_prompt(
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
    outcome = wait_outcome(client, turn_id)
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
    prompt, _ = marked_plan_prompt(
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
    outcome = wait_outcome(client, turn_id)
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
    prompt, marker = marked_plan_prompt(
        [{"calls": [{"name": "e2e_add", "arguments": {"a": 1, "b": 1}}], "repeat": True}]
    )
    limits = {"max_llm_calls": 3, "repeat_guard_rounds": None}
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits=limits)
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "max_llm_calls", True)
    assert outcome.llm_calls == 3
    assert model_server.requests_with(marker) == 3
    assert_every_call_answered_once(outcome.messages)


def test_a_provider_that_keeps_failing_ends_the_turn_failed(
    client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt(
        [{"error": {"status": 503, "message": "overloaded, try later"}, "repeat": True}]
    )
    limits = {"max_model_retries": 1}
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits=limits)
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.stop_reason) == ("failed", "provider_error")
    assert outcome.error is not None
    assert outcome.error.status == 503
    assert "overloaded" in outcome.error.message
    assert model_server.requests_with(marker) == 2  # the first call and its one retry


def test_one_confirmation_approved_and_another_denied(
    client: Client, module_redis_client: redis.Redis
) -> None:
    suffix = uuid.uuid4().hex[:8]
    alice, bob = f"alice-{suffix}", f"bob-{suffix}"
    prompt, _ = marked_plan_prompt(
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
    wait_until(lambda: client.get(turn_id).status.value == "waiting", "the turn to wait for approval")
    assert client.approve(turn_id, "call_r0_0", True)
    assert client.approve(turn_id, "call_r0_1", False)
    outcome = wait_outcome(client, turn_id)
    answers = tool_messages(outcome.messages)
    assert answers["call_r0_0"].content == f"sent 5.0 to {alice}"
    assert answers["call_r0_1"].failure_kind == FailureKind.CONFIRMATION_DENIED
    assert (outcome.status, outcome.stop_reason) == ("stopped", "confirmation_denied")
    assert int(module_redis_client.get(f"{COUNTER_PREFIX}transfer:{alice}") or 0) == 1
    assert module_redis_client.get(f"{COUNTER_PREFIX}transfer:{bob}") is None
    assert_every_call_answered_once(outcome.messages)


def test_one_orchestrator_drives_many_turns_at_once(client: Client) -> None:
    # Eight turns, each a 1 s tool, on a worker of two processes. Driven side by side, two turns' tools run
    # at once; driven one after another, no turn's tool would start before the previous one finished.
    sleep = {"name": "e2e_sleep", "arguments": {"seconds": 1}}
    turn_ids = [
        client.submit(prompt=plan_prompt([{"calls": [sleep]}]), model="scripted:plan") for _ in range(8)
    ]
    outcomes = [wait_outcome(client, turn_id) for turn_id in turn_ids]
    assert [o.status for o in outcomes] == ["completed"] * 8
    runs = [tool_run(client, turn_id) for turn_id in turn_ids]
    assert most_at_once(runs) >= 2, f"no two tools ran at once: {sorted(runs)}"


def tool_run(client: Client, turn_id: str) -> tuple[float, float]:
    """When the turn's one tool call started and finished, as its orchestrator recorded them."""
    at = {e.name: e.at for e in client.events(turn_id) if e.name in ("tool_started", "tool_finished")}
    return at["tool_started"], at["tool_finished"]


def most_at_once(runs: list[tuple[float, float]]) -> int:
    """The most runs under way at one moment (one that finishes as another starts does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in runs] + [(finish, -1) for _, finish in runs])
    under_way = most = 0
    for _at, step in edges:
        under_way += step
        most = max(most, under_way)
    return most


Counters = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def read_counters(url: str) -> Counters:
    """Every sample of the orchestrator's `/metrics`, keyed by its name and labels."""
    body = httpx.get(url, timeout=10).raise_for_status().text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_the_orchestrator_exposes_prometheus_metrics(
    client: Client, orchestrator_process: OrchestratorHandle
) -> None:
    # The test runs the turn it counts: what other tests of the module ran before it is only the baseline.
    url = f"http://127.0.0.1:{orchestrator_process.env['TOOLLOOP_METRICS_PORT']}/metrics"
    calls = [{"name": "e2e_add", "arguments": {"a": 1, "b": 2}}, {"name": "no_such_tool", "arguments": {}}]
    expected: Counters = {
        ("toolloop_tool_calls_total", (("kind", "ok"), ("tool", "e2e_add"))): 1,
        ("toolloop_tool_calls_total", (("kind", "not_found"), ("tool", "no_such_tool"))): 1,
        ("toolloop_turns_finished_total", (("status", "completed"), ("stop_reason", "none"))): 1,
        ("toolloop_model_calls_total", (("outcome", "ok"), ("provider", "scripted"))): 2,
    }
    before = read_counters(url)
    turn_id = client.submit(prompt=plan_prompt([{"calls": calls}]), model="scripted:plan")
    outcome = wait_outcome(client, turn_id)
    assert (outcome.status, outcome.llm_calls) == ("completed", 2)

    def counted() -> Counters:
        after = read_counters(url)
        return {key: after.get(key, 0) - before.get(key, 0) for key in expected}

    # Counted by the orchestrator once the turn is over: waited for, not raced.
    wait_until(lambda: all(counted()[k] >= v for k, v in expected.items()), "the turn's counts in /metrics")
    assert counted() == expected


def test_an_orchestrator_stops_gracefully_on_sigterm(
    module_redis: RedisServer, model_server: RecordingModelServer, module_redis_client: redis.Redis
) -> None:
    # An orchestrator of its own: the module's one goes on serving the other tests, whatever their order.
    own = start_orchestrator(module_redis.url, model_base_url=model_server.base_url)
    try:
        assert module_redis_client.zscore(keys.ORCHESTRATORS, own.orchestrator_id) is not None
        assert own.stop(timeout_s=60) == 0, own.log_text()
        # A clean exit: it said goodbye, so no other orchestrator waits for its lease to expire.
        assert module_redis_client.zscore(keys.ORCHESTRATORS, own.orchestrator_id) is None
    finally:
        own.kill()
