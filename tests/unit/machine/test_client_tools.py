"""Client-side tools: offered beside the catalogue's, a call of one waits (parked) for its caller's result,
with a limit of its own; the answer, an error, or the limit passing becomes the call's outcome."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.machine import parkable
from orchestrator.machine.events import (
    ApprovalGiven,
    AskAttention,
    AwaitApproval,
    ClientResultGiven,
    TimerFired,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import DEADLINE_TIMER, dump_state, wait_timer_id
from orchestrator.model import DEFAULT_CLIENT_TOOL_TIMEOUT_S, ClientTool, Limits
from tests.unit.machine.harness import Driver, answer, calls, of_type
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)

LOCATE = ClientTool(
    name="locate",
    description="Where the user is.",
    parameters={
        "type": "object",
        "properties": {"precise": {"type": "boolean"}},
        "required": ["precise"],
        "additionalProperties": False,
    },
)


def waiting(limits: Limits | None = None) -> Driver:
    driver = Driver(limits=limits, client_tools=[LOCATE])
    driver.respond(calls(("locate", {"precise": True})), at=1001.0)
    return driver


def test_a_client_tool_is_offered_beside_the_catalogue() -> None:
    driver = Driver(client_tools=[LOCATE])
    state = driver.state
    assert state.client_tools == ["locate"]
    assert state.offered["locate"].parameters == LOCATE.parameters
    assert "add" in state.offered
    tools = [t.name for t in driver.call_model().tools]
    assert "locate" in tools and "add" in tools


def test_an_ordinary_turn_writes_no_client_field() -> None:
    driver = Driver()
    assert "client_tools" not in dump_state(driver.state)
    assert all("client_tools" not in entry for entry in dump_log(driver.state))


def test_a_call_waits_for_its_caller_parked_and_tells_no_one_else() -> None:
    driver = waiting()
    state = driver.state
    assert driver.dispatched() == []
    assert state.paused_at == 1001.0 and DEADLINE_TIMER not in state.timers
    assert state.timers[wait_timer_id("call_0")] == 1001.0 + DEFAULT_CLIENT_TOOL_TIMEOUT_S
    assert parkable(state) == 1001.0 + DEFAULT_CLIENT_TOOL_TIMEOUT_S
    (shown,) = driver.emitted("call_waiting")
    assert (shown["waiting_for"], shown["call_id"], shown["arguments"]) == (
        "client_result",
        "call_0",
        {"precise": True},
    )
    assert not of_type(driver.log, AskAttention) and not of_type(driver.log, AwaitApproval)
    assert driver.emitted("approval_requested") == []


@pytest.mark.parametrize(
    ("result", "content"),
    [
        ({"city": "Lyon"}, '{"city": "Lyon"}'),
        ("Lyon", "Lyon"),
        (None, "null"),
    ],
)
def test_the_result_is_the_tools_output_for_the_model(result: Any, content: str) -> None:
    driver = waiting()
    driver.feed(ClientResultGiven(call_id="call_0", result=result, at=1004.0))
    (outcome,) = driver.writes()
    assert (outcome.ok, outcome.result, outcome.content) == (True, result, content)
    assert driver.emitted("client_result_given")[0]["waited_s"] == pytest.approx(3.0)
    driver.echo_writes(at=1004.0)
    history = driver.call_model().messages
    assert history[-1].content == content
    driver.respond(answer("you are in Lyon"), at=1005.0)
    assert driver.outcome.status == "completed"


def test_an_error_reaches_the_model_as_the_tools_failure() -> None:
    driver = waiting()
    driver.feed(ClientResultGiven(call_id="call_0", error="permission refused", at=1002.0))
    (outcome,) = driver.writes()
    assert (outcome.ok, outcome.failure_kind) == (False, FailureKind.EXECUTION_ERROR)
    assert not outcome.synthetic
    assert outcome.content == "Error: permission refused"
    driver.echo_writes(at=1002.0)
    assert driver.call_model()


def test_no_result_in_time_is_a_timeout() -> None:
    driver = waiting(Limits(client_tool_timeout_s=2))
    assert parkable(driver.state) == 1003.0
    driver.feed(TimerFired(timer_id=wait_timer_id("call_0"), at=1003.0))
    (outcome,) = driver.writes()
    assert (outcome.failure_kind, outcome.synthetic) == (FailureKind.TIMEOUT, True)
    assert outcome.content == "Error: the caller sent no result for 'locate' within 2 s"
    driver.echo_writes(at=1003.0)
    driver.respond(answer("I could not tell"), at=1004.0)
    assert driver.outcome.status == "completed"


@pytest.mark.parametrize(
    "event",
    [
        ClientResultGiven(call_id="call_0", result=1, at=1003.0),  # a second answer
        ClientResultGiven(call_id="nope", result=1, at=1003.0),  # no such call
        ApprovalGiven(call_id="call_0", approved=True, at=1003.0),  # an approval is no result
    ],
)
def test_what_answers_no_waiting_call_changes_nothing(event: ClientResultGiven | ApprovalGiven) -> None:
    driver = waiting()
    if event.kind == "client_result_given" and event.call_id == "call_0":
        driver.feed(ClientResultGiven(call_id="call_0", result=0, at=1002.0))
    before = driver.state
    assert driver.feed(event) == []
    assert driver.state == before


def test_a_result_over_the_limit_is_refused_to_the_model() -> None:
    driver = waiting()
    driver.feed(ClientResultGiven(call_id="call_0", result="x" * (64 * 1024 + 1), at=1002.0))
    (outcome,) = driver.writes()
    assert outcome.failure_kind is FailureKind.INVALID_RESULT
    assert json.dumps(outcome.content).count("over 65536 bytes") == 1
