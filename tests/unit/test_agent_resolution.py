"""Resolving a turn's named agent (`orchestrator.agents`): the agent's fields fill what the turn leaves
unset, runs cover every agent a handoff reaches, a child's prompt and report."""

from __future__ import annotations

import json

import pytest

from orchestrator.agents import (
    build_agent_runs,
    build_child_prompt,
    build_child_report,
    require_agent,
    resolve_agent,
)
from orchestrator.errors import UnknownAgentError
from orchestrator.model import ModelSettings, TurnOutcome, TurnRequest, Usage
from workers.agents import AgentRegistry, AgentSpec, agent
from workers.contract import ToolSpec
from workers.errors import ToolDefinitionError

pytestmark = pytest.mark.timeout(30)

CATALOGUE = {name: ToolSpec(name=name) for name in ("search", "fetch", "charge")}
AGENTS = {
    "researcher": AgentSpec(name="researcher", description="Finds things.", tools=["search", "fetch"]),
    "planner": AgentSpec(
        name="planner",
        instructions="Plan.",
        model="smart",
        tools=["researcher", "search"],
        handoffs=["billing"],
        model_settings={"temperature": 0.1, "seed": 7},
    ),
    "billing": AgentSpec(
        name="billing", instructions="Bill.", model="openai:b", tools=["charge"], handoffs=["refunds"]
    ),
    "refunds": AgentSpec(name="refunds", instructions="Refund.", tools=[]),
}


def test_the_agent_fills_what_the_turn_leaves_unset() -> None:
    resolved = resolve_agent(TurnRequest(prompt="hi", agent="planner"), AGENTS)
    assert (resolved.instructions, resolved.model, resolved.tools) == (
        "Plan.",
        "smart",
        ["researcher", "search"],
    )
    assert resolved.model_settings == ModelSettings(temperature=0.1, seed=7)


def test_the_turns_own_arguments_win_field_by_field() -> None:
    request = TurnRequest(
        prompt="hi",
        agent="planner",
        instructions="Mine.",
        model="openai:x",
        tools=["fetch"],
        model_settings=ModelSettings(temperature=0.9),
    )
    resolved = resolve_agent(request, AGENTS)
    assert (resolved.instructions, resolved.model, resolved.tools) == ("Mine.", "openai:x", ["fetch"])
    assert resolved.model_settings == ModelSettings(temperature=0.9, seed=7)


def test_an_unknown_agent_is_refused_with_the_closest_name() -> None:
    with pytest.raises(UnknownAgentError, match="did you mean 'planner'"):
        require_agent("planer", AGENTS)


def test_runs_cover_every_agent_a_handoff_reaches_each_with_its_own_tools() -> None:
    request = resolve_agent(TurnRequest(prompt="hi", agent="planner"), AGENTS)
    runs = build_agent_runs(request, AGENTS, CATALOGUE, ["openai:smart"], lambda m: [f"resolved:{m}"])
    assert set(runs) == {"planner", "billing", "refunds"}
    planner = runs["planner"]
    assert planner.models == ["openai:smart"] and planner.sub_agents == ["researcher"]
    assert set(planner.offered) == {"researcher", "search", "transfer_to_billing"}
    assert planner.offered["researcher"].description == "Finds things."
    assert planner.offered["researcher"].parameters["required"] == ["prompt"]
    billing = runs["billing"]
    assert billing.models == ["resolved:openai:b"] and billing.instructions == "Bill."
    assert set(billing.offered) == {"charge", "transfer_to_refunds"}
    assert billing.handoffs == {"transfer_to_refunds": "refunds"}
    assert runs["refunds"].offered == {}


def test_a_childs_prompt_is_its_prompt_or_its_declared_input_as_json() -> None:
    assert build_child_prompt({"prompt": "find it"}) == "find it"
    assert json.loads(build_child_prompt({"city": "Lyon", "days": 3})) == {"city": "Lyon", "days": 3}


def test_a_childs_report_carries_its_answer_or_why_it_failed() -> None:
    usage = Usage(total_tokens=42)
    done = TurnOutcome(turn_id="t.c", status="completed", text="found", usage=usage)
    assert (build_child_report(done).result, build_child_report(done).usage) == ("found", usage)
    typed = done.model_copy(update={"output": {"city": "Lyon"}})
    assert build_child_report(typed).result == {"city": "Lyon"}
    stopped = TurnOutcome(turn_id="t.c", status="stopped", stop_reason="deadline", text="Stopped: deadline.")
    report = build_child_report(stopped)
    assert report.result is None and report.error is not None and "stopped" in report.error


def test_a_declared_agent_is_checked_at_import() -> None:
    registry = AgentRegistry()
    spec = agent("helper", tools=["search"], registry=registry)
    assert registry.specs() == [spec]
    with pytest.raises(ToolDefinitionError, match="agent"):
        agent("9bad", registry=registry)
    with pytest.raises(ToolDefinitionError, match="named twice"):
        agent("dup", tools=["a", "a"], registry=registry)
