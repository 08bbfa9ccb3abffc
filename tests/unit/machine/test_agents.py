"""Agents on the turn machine: a sub-agent's call starts a child turn and waits for it (without pausing the
clock), the child's report becomes the call's outcome and its usage the parent's; the depth limit answers a
call that would go too deep; stopping the parent cancels its children; a handoff switches the agent the next
model call runs as."""

from __future__ import annotations

import pytest

from orchestrator.machine import parkable
from orchestrator.machine.events import (
    CancelChildTurns,
    CancelRequested,
    ChildTurnFinished,
    StartChildTurn,
    TimerFired,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import DEADLINE_TIMER, AgentRun, build_child_turn_id, dump_state
from orchestrator.model import Limits, ModelSettings, ParentLink, ToolMessage, Usage
from tests.unit.machine.harness import CATALOGUE, Driver, answer, calls, of_type
from workers.contract import FailureKind, ToolSpec

pytestmark = pytest.mark.timeout(30)

RESEARCHER = ToolSpec(
    name="researcher",
    description="Researches.",
    parameters={"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
)
TRANSFER = ToolSpec(name="transfer_to_billing", parameters={"type": "object", "properties": {}})
PLANNER = AgentRun(
    name="planner",
    instructions="You plan.",
    models=["openai:m"],
    offered={"add": CATALOGUE["add"], "researcher": RESEARCHER, "transfer_to_billing": TRANSFER},
    sub_agents=["researcher"],
    handoffs={"transfer_to_billing": "billing"},
)
BILLING = AgentRun(
    name="billing",
    instructions="You are billing.",
    models=["anthropic:c"],
    model_settings=ModelSettings(temperature=0.2),
    offered={"add": CATALOGUE["add"]},
)
AGENTS = {"planner": PLANNER, "billing": BILLING}


def planner(limits: Limits | None = None, **fields: object) -> Driver:
    return Driver(agent="planner", agents=AGENTS, limits=limits, **fields)  # type: ignore[arg-type]


def asking_researcher(limits: Limits | None = None, **fields: object) -> Driver:
    driver = planner(limits, **fields)
    driver.respond(calls(("researcher", {"prompt": "find it"})), at=1001.0)
    return driver


def test_the_agent_offers_its_tools_sub_agents_and_handoffs() -> None:
    driver = planner()
    state = driver.state
    assert (state.agent, state.sub_agents, state.handoffs) == (
        "planner",
        ["researcher"],
        {"transfer_to_billing": "billing"},
    )
    assert {t.name for t in driver.call_model().tools} == {"add", "researcher", "transfer_to_billing"}


def test_an_ordinary_turn_writes_no_agent_field() -> None:
    driver = Driver()
    for field in ("agent", "agents", "sub_agents", "handoffs", "parent", "max_agent_depth", "children"):
        assert field not in dump_state(driver.state)
        assert all(f'"{field}"' not in entry for entry in dump_log(driver.state))


def test_a_sub_agent_call_starts_a_child_and_waits_without_pausing_the_clock() -> None:
    driver = asking_researcher(Limits(max_total_tokens=10_000, deadline_s=60))
    (start,) = of_type(driver.last, StartChildTurn)
    assert start.turn_id == build_child_turn_id("turn1", "call_0") == "turn1.call_0"
    assert (start.agent, start.arguments, start.depth) == ("researcher", {"prompt": "find it"}, 1)
    assert start.deadline_at == driver.state.deadline_at == 1060.0
    assert start.max_total_tokens is not None and start.max_total_tokens <= 10_000
    assert start.max_cost_usd is None
    assert driver.dispatched() == []
    state = driver.state
    assert state.paused_at is None and DEADLINE_TIMER in state.timers  # the child runs on the parent's time
    assert parkable(state) == 1060.0
    (child,) = state.children
    assert (child.call_id, child.agent, child.turn_id, child.status) == (
        "call_0",
        "researcher",
        "turn1.call_0",
        None,
    )
    (shown,) = driver.emitted("child_turn_started")
    assert shown["child_turn_id"] == "turn1.call_0"
    assert driver.emitted("call_waiting")[0]["waiting_for"] == "child_turn"


def test_the_childs_answer_is_the_calls_result_and_its_usage_the_parents() -> None:
    driver = asking_researcher()
    before = driver.state.usage
    used = Usage(input_tokens=100, output_tokens=20, total_tokens=120, cost_usd=0.5)
    driver.feed(
        ChildTurnFinished(
            call_id="call_0",
            at=1010.0,
            turn_id="turn1.call_0",
            status="completed",
            result="found",
            usage=used,
        )
    )
    (outcome,) = driver.writes()
    assert outcome.ok and outcome.result == "found" and outcome.content == "found"
    assert driver.state.usage.total_tokens == before.total_tokens + 120
    (child,) = driver.state.children
    assert (child.status, child.usage) == ("completed", used)
    driver.echo_writes()
    driver.respond(answer("done"))
    result = driver.outcome
    assert result.children == driver.state.children and result.agent == "planner"
    (message,) = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert message.content == "found"


def test_a_failed_child_is_an_execution_error_and_a_second_report_changes_nothing() -> None:
    driver = asking_researcher()
    failed = ChildTurnFinished(
        call_id="call_0", at=1010.0, turn_id="turn1.call_0", status="failed", error="the sub-agent failed"
    )
    driver.feed(failed)
    (outcome,) = driver.writes()
    assert outcome.failure_kind == FailureKind.EXECUTION_ERROR and outcome.error == "the sub-agent failed"
    usage = driver.state.usage
    driver.feed(failed)
    assert driver.writes() == [] and driver.state.usage == usage


def test_a_call_deeper_than_the_limit_starts_nothing_and_says_why() -> None:
    parent = ParentLink(turn_id="turn0", call_id="call_9", depth=2)
    driver = asking_researcher(max_agent_depth=2, parent=parent)
    assert of_type(driver.last, StartChildTurn) == []
    (outcome,) = driver.writes()
    assert outcome.failure_kind == FailureKind.NOT_ALLOWED
    assert "agent depth limit was reached" in (outcome.error or "")
    assert driver.emitted("agent_depth_reached")[0]["max_agent_depth"] == 2


def test_the_turns_own_limit_overrides_the_orchestrators() -> None:
    driver = asking_researcher(Limits(max_agent_depth=0))
    assert of_type(driver.last, StartChildTurn) == []
    assert driver.writes()[0].failure_kind == FailureKind.NOT_ALLOWED


def test_cancelling_the_parent_cancels_the_running_child() -> None:
    driver = asking_researcher()
    driver.feed(CancelRequested(at=1005.0))
    (cancel,) = of_type(driver.last, CancelChildTurns)
    assert cancel.turn_ids == ["turn1.call_0"] and "cancelled" in cancel.reason


def test_the_parents_deadline_ends_the_wait_and_the_child() -> None:
    driver = asking_researcher(Limits(deadline_s=30))
    driver.feed(TimerFired(timer_id=DEADLINE_TIMER, at=1030.0))
    assert of_type(driver.log, CancelChildTurns)
    assert driver.writes()[0].failure_kind in (FailureKind.DEADLINE_EXCEEDED, FailureKind.TIMEOUT)


def test_a_handoff_switches_the_agent_of_the_next_model_call() -> None:
    driver = planner()
    driver.respond(calls(("transfer_to_billing", {})), at=1001.0)
    (outcome,) = driver.writes()
    assert outcome.ok and "billing" in outcome.content
    (handoff,) = driver.emitted("agent_handoff")
    assert (handoff["from_agent"], handoff["to_agent"]) == ("planner", "billing")
    driver.echo_writes()
    request = driver.call_model()
    assert request.model == "anthropic:c" and request.instructions == "You are billing."
    assert request.settings.temperature == 0.2
    assert [t.name for t in request.tools] == ["add"]
    driver.respond(answer("billing here"))
    assert driver.outcome.agent == "billing"


def test_only_the_calls_own_child_reports_for_it() -> None:
    driver = asking_researcher()
    forged = ChildTurnFinished(
        call_id="call_0", at=1010.0, turn_id="turn_someone_else", status="completed", result="forged"
    )
    driver.feed(forged)
    assert driver.writes() == [] and driver.state.children[0].status is None
