"""Approvals grow up: approve with edited arguments, validated against the tool's schema, which
are what runs and what the history shows; deny with a message the model reads."""

from __future__ import annotations

import pytest

from orchestrator.machine import resume
from orchestrator.machine.events import ApprovalGiven, CallModel, DispatchTools
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.model import AssistantMessage, Limits, ToolCall, ToolMessage
from tests.unit.machine.harness import CATALOGUE, Driver, calls, of_type, ok
from workers.contract import FailureKind, ToolSpec

pytestmark = pytest.mark.timeout(30)

GUARDED = ToolSpec(
    name="transfer",
    parameters={
        "type": "object",
        "properties": {"to": {"type": "string"}, "amount": {"type": "integer", "maximum": 100}},
        "required": ["to", "amount"],
        "additionalProperties": False,
    },
    requires_confirmation=True,
)
TOOLS = {**CATALOGUE, "transfer": GUARDED}


def parked(**limits: object) -> Driver:
    driver = Driver(catalogue=TOOLS, tools=["transfer", "add"], limits=Limits(**limits))  # type: ignore[arg-type]
    driver.respond(calls(("transfer", {"to": "bob", "amount": 90})))
    assert driver.state.current is not None and driver.state.current.calls[0].waiting_approval
    return driver


def approve(driver: Driver, arguments: dict[str, object] | None) -> None:
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1002.0, arguments=arguments))


def test_edited_arguments_are_what_runs_and_what_the_history_shows() -> None:
    driver = parked()
    approve(driver, {"to": "alice", "amount": 10})
    [dispatch] = driver.dispatched()
    assert dispatch.arguments == {"to": "alice", "amount": 10}
    [event] = driver.emitted("approval_given")
    assert (event["approved"], event["edited"]) == (True, True)
    [dispatched] = driver.emitted("tool_dispatched")
    assert dispatched["arguments"] == {"to": "alice", "amount": 10}
    driver.finish(ok("call_0", "transfer", "sent 10 to alice"))
    call = driver.call_model()
    asked = next(m for m in call.messages if isinstance(m, AssistantMessage) and m.tool_calls)
    assert asked.tool_calls == [
        ToolCall(id="call_0", name="transfer", arguments={"to": "alice", "amount": 10})
    ]
    assert driver.state.history[-2] == asked


def test_edited_arguments_that_break_the_schema_answer_the_call_without_running_it() -> None:
    driver = parked(stop_on_repeated_failure=False)
    approve(driver, {"to": "alice", "amount": 5_000, "memo": "x"})
    assert not of_type(driver.last, DispatchTools)
    [refused] = driver.writes()
    assert refused.failure_kind is FailureKind.VALIDATION and not refused.synthetic
    assert "the arguments a person gave when approving were refused" in refused.content
    assert "memo" in refused.content and "5000 is greater than the maximum of 100" in refused.content
    driver.echo_writes()
    assert driver.state.tool_executions == 0
    call = driver.call_model()
    [answer] = [m for m in call.messages if isinstance(m, ToolMessage)]
    assert answer.is_error and "5000 is greater than the maximum of 100" in answer.content
    # The history keeps the model's own call: nothing else was run.
    asked = driver.state.history[-2]
    assert isinstance(asked, AssistantMessage) and asked.tool_calls[0].arguments == {
        "to": "bob",
        "amount": 90,
    }


def test_an_approval_without_arguments_runs_the_models() -> None:
    driver = parked()
    approve(driver, None)
    assert driver.dispatched()[0].arguments == {"to": "bob", "amount": 90}
    assert driver.emitted("approval_given")[0]["edited"] is False


def test_a_denials_reason_reaches_the_model() -> None:
    driver = parked(stop_on_confirmation_denied=False)
    driver.feed(ApprovalGiven(call_id="call_0", approved=False, at=1002.0, reason="bob's account is frozen"))
    driver.echo_writes()
    call = driver.call_model()
    [answer] = [m for m in call.messages if isinstance(m, ToolMessage)]
    assert answer.failure_kind is FailureKind.CONFIRMATION_DENIED
    assert "denied by a person: bob's account is frozen" in answer.content


def test_edited_arguments_survive_a_restart_before_the_outcome() -> None:
    driver = parked()
    approve(driver, {"to": "alice", "amount": 10})
    state = driver.state
    copy = load_state(dump_state(state), dump_entries(state.history), dump_log(state))
    _, commands = resume(copy, at=1002.5)
    [again] = [d for c in of_type(commands, DispatchTools) for d in c.calls]
    assert again.arguments == {"to": "alice", "amount": 10}
    assert copy.current is not None
    assert copy.current.assistant.tool_calls[0].arguments == {"to": "alice", "amount": 10}
    assert not of_type(commands, CallModel)
