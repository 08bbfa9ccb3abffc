"""The reader's view of a turn (`store.turn_view`): calls waiting for approval from the real state."""

from __future__ import annotations

import json

import pytest

from orchestrator.machine.events import ApprovalGiven
from orchestrator.machine.state import dump_state
from orchestrator.model import AssistantMessage, TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store.turn_view import PendingApproval, TurnView, build_turn_view, parse_pending_approvals
from tests.unit.machine.harness import Driver, calls
from workers.contract import REDACTED

pytestmark = pytest.mark.timeout(30)

REQUEST_JSON = TurnRequest(prompt="do it").model_dump_json()
SECRET_ARGS = {"id": 7, "api_key": "sk-live-1", "options": {"password": "hunter2", "force": True}}


def waiting_driver() -> Driver:
    """A turn whose model asked for two confirmed calls and one plain call: the two wait for a person."""
    driver = Driver()
    driver.respond(calls(("delete", SECRET_ARGS), ("add", {"a": 1, "b": 2}), ("delete", {"id": 8})))
    assert driver.state.status is TurnStatus.WAITING
    return driver


def view_of(driver: Driver) -> TurnView:
    view = build_turn_view("turn1", REQUEST_JSON, driver.state.status.value, dump_state(driver.state), None)
    assert view is not None
    return view


def test_a_waiting_turn_lists_its_calls_in_order_with_arguments_redacted() -> None:
    view = view_of(waiting_driver())
    assert view.status is TurnStatus.WAITING
    assert view.pending_approvals == [
        PendingApproval(
            call_id="call_0",
            tool="delete",
            arguments={"id": 7, "api_key": REDACTED, "options": {"password": REDACTED, "force": True}},
        ),
        PendingApproval(call_id="call_2", tool="delete", arguments={"id": 8}),
    ]
    dumped = view.model_dump_json()
    assert "sk-live-1" not in dumped and "hunter2" not in dumped
    # The JSON a page reads from GET /v1/turns/{id}.
    listed = json.loads(view.model_dump_json())["pending_approvals"]
    assert [(p["call_id"], p["tool"]) for p in listed] == [("call_0", "delete"), ("call_2", "delete")]


def test_an_answered_call_leaves_the_list() -> None:
    driver = waiting_driver()
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1002.0))
    assert [p.call_id for p in view_of(driver).pending_approvals] == ["call_2"]
    driver.feed(ApprovalGiven(call_id="call_2", approved=False, at=1002.5))
    # The denial is decided (its outcome requested) even before it comes back as written: nothing waits.
    assert view_of(driver).pending_approvals == []


def test_a_running_turn_and_a_finished_one_list_nothing() -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    assert view_of(driver).pending_approvals == []
    outcome = TurnOutcome(
        turn_id="turn1",
        status="completed",
        text="3",
        messages=[UserMessage(content="do it"), AssistantMessage(content="3")],
    )
    state = dump_state(waiting_driver().state)  # even beside a state that still says waiting
    view = build_turn_view("turn1", REQUEST_JSON, "completed", state, outcome.model_dump_json())
    assert view is not None and view.outcome == outcome and view.pending_approvals == []


@pytest.mark.parametrize(
    "state_json",
    [None, "not json", "[]", '{"history": []}', '{"version": 99, "turn_id": "t"}', b'{"version": 2}'],
)
def test_a_state_this_code_cannot_read_lists_nothing(state_json: str | bytes | None) -> None:
    assert parse_pending_approvals(state_json) == []
    view = build_turn_view("turn1", REQUEST_JSON, "waiting", state_json, None)
    assert view is not None and view.pending_approvals == [] and view.messages


def test_bytes_from_a_client_that_does_not_decode() -> None:
    state = dump_state(waiting_driver().state).encode()
    assert [p.call_id for p in parse_pending_approvals(state)] == ["call_0", "call_2"]
