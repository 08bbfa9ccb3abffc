"""Agents that compose, on the shipped processes: a real `toolloop orchestrator`, a prefork worker and the
scripted `plan` model behind a server that records every request.

A planner calls a `researcher` sub-agent: its child turn runs its own tool on the worker, and its answer is
the planner's tool result, its usage inside the planner's. Cancelling the parent cancels the child; killing
the orchestrator mid-child completes both, the child run once; `max_agent_depth` stops an agent that calls
itself; a handoff changes the instructions and tools the next model request carries.

Each agent's plan travels in its prompt: the planner's plan calls `researcher` with the researcher's own plan
as its `prompt`, which the child turn's scripted model plays.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.plans import marked_plan_prompt, plan_prompt
from tests.support.turns import event_data
from tests.support.waiting import wait_until
from workers import AgentSpec
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MODEL = "scripted:plan"


def _name(base: str) -> str:
    # Agents live in one Redis hash for the module: each test names its own.
    return f"{base}-{uuid.uuid4().hex[:6]}"


def _tool_messages(outcome: TurnOutcome) -> list[ToolMessage]:
    return [m for m in outcome.messages if isinstance(m, ToolMessage)]


def _child_plan(key: str, seconds: float = 0.0, text: str = "the researcher found 5") -> str:
    calls = [{"name": "e2e_counted", "arguments": {"key": key, "seconds": seconds}}]
    return plan_prompt([{"calls": calls}, {"text": text}])


@pytest.fixture
def agents(client: Client) -> Iterator[dict[str, str]]:
    researcher, planner = _name("researcher"), _name("planner")
    client.register_agent(
        AgentSpec(
            name=researcher,
            description="Researches a question and answers with what it found.",
            instructions="You research.",
            model=MODEL,
            tools=["e2e_counted"],
        )
    )
    client.register_agent(
        AgentSpec(name=planner, instructions="You plan.", model=MODEL, tools=[researcher, "e2e_add"])
    )
    yield {"researcher": researcher, "planner": planner}


def test_a_planner_calls_a_researcher_whose_child_turn_runs_its_own_tool(
    client: Client, orchestrator_process: OrchestratorHandle, agents: dict[str, str]
) -> None:
    del orchestrator_process
    key = uuid.uuid4().hex
    rounds: list[dict[str, Any]] = [
        {"calls": [{"name": agents["researcher"], "arguments": {"prompt": _child_plan(key)}}]},
        {"text": "the planner is done"},
    ]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=agents["planner"])
    outcome = client.wait(turn_id, timeout=60)
    assert outcome.status == "completed", outcome
    assert outcome.agent == agents["planner"]
    (answer,) = _tool_messages(outcome)
    assert answer.content == "the researcher found 5"
    (child,) = outcome.children
    assert (child.agent, child.status, child.call_id) == (
        agents["researcher"],
        "completed",
        answer.tool_call_id,
    )
    child_outcome = client.outcome(child.turn_id)
    assert child_outcome is not None and child_outcome.status == "completed"
    assert [m.content for m in _tool_messages(child_outcome)] == [f"run 1 of {key}"]  # its own tool
    assert client.redis.get(COUNTER_PREFIX + key) == "1"
    # The parent's usage includes the child's, which is also reported on its own.
    assert child.usage.total_tokens == child_outcome.usage.total_tokens > 0
    assert outcome.usage.total_tokens >= child.usage.total_tokens + 1
    own = sum(record.usage.total_tokens for record in outcome.llm_call_records)
    assert outcome.usage.total_tokens == own + child.usage.total_tokens
    view = client.get(child.turn_id)
    assert view.request.parent is not None and view.request.parent.turn_id == turn_id
    started = event_data(client.redis, turn_id, "child_turn_started")
    assert [e["child_turn_id"] for e in started] == [child.turn_id]


def test_cancelling_the_parent_cancels_its_child(
    client: Client, orchestrator_process: OrchestratorHandle, agents: dict[str, str]
) -> None:
    del orchestrator_process
    key = uuid.uuid4().hex
    rounds = [
        {"calls": [{"name": agents["researcher"], "arguments": {"prompt": _child_plan(key, seconds=20)}}]},
        {"text": "never"},
    ]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=agents["planner"])
    started = lambda: client.redis.get(COUNTER_PREFIX + key) is not None  # noqa: E731
    wait_until(started, "the child's tool to start", timeout_s=30)
    child_id = event_data(client.redis, turn_id, "child_turn_started")[0]["child_turn_id"]
    assert client.cancel(turn_id)
    assert client.wait(turn_id, timeout=30).status == "cancelled"
    assert client.wait(child_id, timeout=30).status == "cancelled"


def test_an_agent_that_calls_itself_is_stopped_by_max_agent_depth(
    client: Client, orchestrator_process: OrchestratorHandle
) -> None:
    del orchestrator_process
    looper = _name("looper")
    client.register_agent(AgentSpec(name=looper, model=MODEL, tools=[looper]))
    # Each level's plan calls the agent again with the next level's plan: deeper than the limit allows.
    prompt = plan_prompt([{"text": "the deepest level answered"}])
    for _ in range(4):
        prompt = plan_prompt([{"calls": [{"name": looper, "arguments": {"prompt": prompt}}]}, {"text": "up"}])
    turn_id = client.submit(prompt=prompt, agent=looper, limits={"max_agent_depth": 2})
    outcome = client.wait(turn_id, timeout=60)
    assert outcome.status == "completed", outcome
    # Depth 1 and 2 ran; the call at depth 2 that would start depth 3 was answered by the limit.
    level1 = client.outcome(outcome.children[0].turn_id)
    assert level1 is not None
    level2 = client.outcome(level1.children[0].turn_id)
    assert level2 is not None and level2.children == []
    (refused,) = _tool_messages(level2)
    assert refused.failure_kind == FailureKind.NOT_ALLOWED
    assert "agent depth limit was reached" in str(refused.content)


def test_a_handoff_changes_the_instructions_and_tools_of_the_next_model_request(
    client: Client, orchestrator_process: OrchestratorHandle, model_server: RecordingModelServer
) -> None:
    del orchestrator_process
    triage, billing = _name("triage"), _name("billing")
    client.register_agent(
        AgentSpec(name=billing, instructions="You are billing.", model=MODEL, tools=["e2e_multiply"])
    )
    client.register_agent(
        AgentSpec(
            name=triage, instructions="You are triage.", model=MODEL, tools=["e2e_add"], handoffs=[billing]
        )
    )
    rounds = [{"calls": [{"name": f"transfer_to_{billing}", "arguments": {}}]}, {"text": "billing answered"}]
    prompt, marker = marked_plan_prompt(rounds)
    turn_id = client.submit(prompt=prompt, agent=triage)
    outcome = client.wait(turn_id, timeout=60)
    assert outcome.status == "completed", outcome
    assert outcome.agent == billing
    bodies = [b for b in model_server.requests() if marker in json.dumps(b)]
    assert len(bodies) == 2
    first, second = bodies

    def system(body: dict[str, Any]) -> str:
        return str(body["messages"][0]["content"])

    def tools(body: dict[str, Any]) -> set[str]:
        return {t["function"]["name"] for t in body.get("tools", [])}

    assert system(first) == "You are triage." and tools(first) == {"e2e_add", f"transfer_to_{billing}"}
    assert system(second) == "You are billing." and tools(second) == {"e2e_multiply"}
    (handoff,) = event_data(client.redis, turn_id, "agent_handoff")
    assert (handoff["from_agent"], handoff["to_agent"]) == (triage, billing)


def test_an_unknown_agent_is_refused_at_submit(client: Client) -> None:
    with pytest.raises(ValueError, match="unknown agent"):
        client.submit(prompt="hi", agent=_name("nobody"))


def test_killing_the_orchestrator_mid_child_completes_both_and_runs_the_child_once(
    client: Client, module_redis: RedisServer, model_server: RecordingModelServer, agents: dict[str, str]
) -> None:
    # An orchestrator of its own, killed while the child's tool runs; a second takes both turns over.
    first = start_orchestrator(module_redis.url, model_base_url=model_server.base_url)
    second: OrchestratorHandle | None = None
    try:
        key = uuid.uuid4().hex
        rounds = [
            {"calls": [{"name": agents["researcher"], "arguments": {"prompt": _child_plan(key, seconds=3)}}]},
            {"text": "the planner is done"},
        ]
        turn_id = client.submit(prompt=plan_prompt(rounds), agent=agents["planner"])
        started = lambda: client.redis.get(COUNTER_PREFIX + key) is not None  # noqa: E731
        wait_until(started, "the child's tool to start", timeout_s=30)
        first.kill()
        second = start_orchestrator(module_redis.url, model_base_url=model_server.base_url)
        outcome = client.wait(turn_id, timeout=90)
        assert outcome.status == "completed", outcome
        (child,) = outcome.children
        child_outcome = client.outcome(child.turn_id)
        assert child_outcome is not None and child_outcome.status == "completed"
        time.sleep(0.5)
        # The child's tool ran once: one child, never started twice.
        assert client.redis.get(COUNTER_PREFIX + key) == "1"
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_childs_call_waiting_for_a_person_shows_on_the_parent_and_is_approved_through_it(
    client: Client, orchestrator_process: OrchestratorHandle
) -> None:
    del orchestrator_process
    teller, boss = _name("teller"), _name("boss")
    client.register_agent(AgentSpec(name=teller, model=MODEL, tools=["e2e_transfer"]))
    client.register_agent(AgentSpec(name=boss, model=MODEL, tools=[teller]))
    transfer = [
        {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 5, "to": "ann"}}]},
        {"text": "sent"},
    ]
    rounds = [{"calls": [{"name": teller, "arguments": {"prompt": plan_prompt(transfer)}}]}, {"text": "done"}]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=boss)
    wait_until(
        lambda: event_data(client.redis, turn_id, "child_call_waiting"), "the child's wait on the parent"
    )
    (shown,) = event_data(client.redis, turn_id, "child_call_waiting")
    assert (shown["tool"], shown["arguments"]) == ("e2e_transfer", {"amount": 5, "to": "ann"})
    assert client.approve(turn_id, shown["call_id"], approved=True, decided_by="ops")
    outcome = client.wait(turn_id, timeout=60)
    assert outcome.status == "completed", outcome
    child = client.outcome(shown["child_turn_id"])
    assert child is not None and [a.decided_by for a in child.approvals] == ["ops"]
