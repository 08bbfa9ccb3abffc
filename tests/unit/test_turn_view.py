"""The reader's view of a turn (`store.turn_view`): calls waiting for approval from the real state, and what
it redacts."""

from __future__ import annotations

import json

import pytest

from orchestrator.machine.events import ApprovalGiven
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state
from orchestrator.model import AssistantMessage, ToolCall, TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store.turn_view import (
    PendingApproval,
    TurnView,
    build_shown_outcome,
    build_shown_raw_arguments,
    build_shown_request,
    build_turn_view,
    parse_pending_approvals,
)
from tests.unit.machine.harness import Driver, calls, ok
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
    state = driver.state
    # A running turn's state as stored: its JSON, its history list and its log list.
    view = build_turn_view(
        "turn1",
        REQUEST_JSON,
        state.status.value,
        dump_state(state),
        None,
        history_raw=dump_entries(state.history),
        log_raw=dump_log(state),
    )
    assert view is not None
    return view


def test_a_waiting_turn_lists_its_calls_in_order_with_arguments_redacted() -> None:
    view = view_of(waiting_driver())
    assert view.status is TurnStatus.WAITING
    # Each with its wait's own deadline (24 hours by default) and what it gets then.
    wait = {"since": 1001.0, "wait_deadline": 1001.0 + 86_400, "on_timeout": "deny"}
    assert view.pending_approvals == [
        PendingApproval(
            call_id="call_0",
            tool="delete",
            arguments={"id": 7, "api_key": REDACTED, "options": {"password": REDACTED, "force": True}},
            **wait,
        ),
        PendingApproval(call_id="call_2", tool="delete", arguments={"id": 8}, **wait),
    ]
    # The `add` call runs meanwhile: the running clock runs too.
    assert (view.paused_at, view.deadline_at) == (None, 1300.0)
    dumped = view.model_dump_json()
    assert "sk-live-1" not in dumped and "hunter2" not in dumped
    # The JSON a page reads from GET /v1/turns/{id}.
    listed = json.loads(view.model_dump_json())["pending_approvals"]
    assert [(p["call_id"], p["tool"]) for p in listed] == [("call_0", "delete"), ("call_2", "delete")]


def test_an_answered_call_leaves_the_list() -> None:
    driver = waiting_driver()
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1002.0))
    assert [p.call_id for p in view_of(driver).pending_approvals] == ["call_2"]
    driver.feed(ApprovalGiven(call_id="call_2", approved=False, at=1002.5, decided_by="ana", reason="no"))
    # The denial is decided (its outcome requested) even before it comes back as written: nothing waits.
    view = view_of(driver)
    assert view.pending_approvals == []
    # Who answered, and why, for the turn page.
    assert [(a.call_id, a.approved, a.decided_by, a.reason) for a in view.approvals] == [
        ("call_0", True, None, None),
        ("call_2", False, "ana", "no"),
    ]


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
    view = build_turn_view("turn1", REQUEST_JSON, "waiting", state_json, None)  # unreadable: no lists
    assert view is not None and view.pending_approvals == [] and view.messages


def test_bytes_from_a_client_that_does_not_decode() -> None:
    state = waiting_driver().state
    history, log = [e.encode() for e in dump_entries(state.history)], [e.encode() for e in dump_log(state)]
    assert [p.call_id for p in parse_pending_approvals(dump_state(state).encode(), history, log)] == [
        "call_0",
        "call_2",
    ]


# --- redaction: what a view shows, and what stays stored -------------------------------------------------

SECRET_CONTEXT = {"user_id": 7, "password": "hunter2", "tenant": {"api_key": "sk-live-1"}}


def secret_call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="delete", arguments=SECRET_ARGS, raw_arguments=json.dumps(SECRET_ARGS))


def test_a_view_redacts_the_context_and_every_tool_calls_arguments() -> None:
    history = [UserMessage(content="do it"), AssistantMessage(tool_calls=[secret_call("c0")])]
    request = TurnRequest(prompt="go on", messages=history, context=SECRET_CONTEXT)
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "token": "tok-1"})))
    driver.finish(ok("call_0", "add", "1"))  # the round is in the history once its calls are answered
    entries = dump_entries(driver.state.history)
    running = build_turn_view(
        "t",
        request.model_dump_json(),
        "running",
        dump_state(driver.state),
        None,
        history_raw=entries,
        log_raw=dump_log(driver.state),
    )
    outcome = TurnOutcome(
        turn_id="t", status="completed", messages=[*history, AssistantMessage(content="ok")]
    )
    ended = build_turn_view("t", request.model_dump_json(), "completed", None, outcome.model_dump_json())
    assert running is not None and ended is not None
    for view in (running, ended):
        assert view.request.context == {"user_id": 7, "password": REDACTED, "tenant": {"api_key": REDACTED}}
        dumped = view.model_dump_json()
        assert "hunter2" not in dumped and "sk-live-1" not in dumped and "tok-1" not in dumped
        assert '"id":7' in dumped  # a value under an ordinary key stays
    (shown,) = ended.request.messages[1].tool_calls  # type: ignore[union-attr]
    assert shown.arguments == {"id": 7, "api_key": REDACTED, "options": {"password": REDACTED, "force": True}}
    assert json.loads(shown.raw_arguments or "") == shown.arguments
    assert ended.outcome is not None and ended.outcome.messages == ended.messages
    (asked,) = [m for m in running.messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert asked.tool_calls[0].arguments == {"a": 1, "token": REDACTED}


def test_showing_leaves_the_stored_values_and_what_is_no_json_alone() -> None:
    outcome = TurnOutcome(
        turn_id="t", status="completed", messages=[AssistantMessage(tool_calls=[secret_call("c")])]
    )
    shown = build_shown_outcome(outcome)
    assert outcome.messages[0].tool_calls[0].arguments == SECRET_ARGS  # type: ignore[union-attr]
    assert shown.messages[0].tool_calls[0].arguments["api_key"] == REDACTED  # type: ignore[union-attr]
    request = TurnRequest(prompt="x", context=SECRET_CONTEXT)
    assert build_shown_request(request).context["password"] == REDACTED
    assert request.context == SECRET_CONTEXT
    assert build_shown_raw_arguments('{"password": "x"') == '{"password": "x"'  # broken: never arguments
    assert build_shown_raw_arguments("null") == "null" and build_shown_raw_arguments(None) is None
