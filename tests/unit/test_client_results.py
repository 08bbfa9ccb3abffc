"""A client-side tool's answer on its way in: checked before anything is recorded (on every client), recorded
once through the control stream, and read back as the machine's event."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.client.http_client import build_tool_result_call
from orchestrator.client.submission import build_submission
from orchestrator.commands.approvals import build_pending_line
from orchestrator.errors import CallNotWaitingError
from orchestrator.machine.events import ClientResultGiven
from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.runtime.inbox import build_control_event
from orchestrator.store import codec, flows
from orchestrator.store.scripts import ControlResult
from orchestrator.store.turn_view import PendingApproval, TurnView
from tests.support.flows import drive
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(30)

LOCATE = {"name": "locate", "description": "Where the user is.", "parameters": {"type": "object"}}


def view(waiting_for: str = "client_result") -> TurnView:
    pending = PendingApproval(call_id="c1", tool="locate", waiting_for=waiting_for)
    return TurnView(
        id="t", status=TurnStatus.WAITING, request=TurnRequest(prompt="p"), pending_approvals=[pending]
    )


def test_a_result_is_recorded_as_json_and_an_error_as_the_reason() -> None:
    recorded_reply = [view(), ControlResult.RECORDED]
    steps, recorded = drive(flows.send_client_result("t", "c1", 1.0, result={"a": 1}), list(recorded_reply))
    assert recorded and steps[-1].args[2:4] == ("client_result", "c1")
    assert steps[-1].args[9:12] == ("", "", '{"a":1}')
    steps, _ = drive(flows.send_client_result("t", "c1", 1.0, error="denied"), list(recorded_reply))
    assert steps[-1].args[9:12] == ("denied", "", "")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"result": 1, "error": "x"}, "not both"),
        ({"error": "  "}, "blank"),
        ({"result": float("nan")}, "not a JSON number"),
        ({"result": "x" * (codec.CLIENT_RESULT_MAX_BYTES + 1)}, "over the tool's limit"),
    ],
)
def test_a_bad_answer_is_refused_before_anything_is_sent(answer: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        drive(flows.send_client_result("t", "c1", 1.0, **answer), [])
    with pytest.raises(ValueError, match=problem):
        build_tool_result_call("t", "c1", answer.get("result"), answer.get("error"))


@pytest.mark.parametrize(
    ("pending", "control"),
    [
        (view("approval"), None),  # waits for a person, not for a result
        (view(), ControlResult.DECIDED),  # answered already
    ],
)
def test_only_a_call_waiting_for_its_result_takes_one(pending: TurnView, control: Any) -> None:
    replies: list[Any] = [pending] if control is None else [pending, control]
    with pytest.raises(CallNotWaitingError):
        drive(flows.send_client_result("t", "c1", 1.0, result=1), replies)


def test_the_http_body_is_the_result_or_the_error() -> None:
    assert build_tool_result_call("t", "c 1", None, "no").body == {"error": "no"}
    call = build_tool_result_call("t", "c 1", [1], None)
    assert (call.path, call.body) == ("/v1/turns/t/calls/c%201/result", {"result": [1]})


def test_the_control_entry_reads_back_as_the_machines_event() -> None:
    fields = {"kind": "client_result", "call": "c1", "at": "2.0", "result": '{"a":1}'}
    request = codec.parse_control("1-0", fields)
    assert build_control_event(request) == ClientResultGiven(call_id="c1", at=2.0, result={"a": 1})
    failed = codec.parse_control("1-1", {"kind": "client_result", "call": "c1", "at": "2", "reason": "no"})
    assert build_control_event(failed) == ClientResultGiven(call_id="c1", at=2.0, error="no")
    broken = codec.parse_control("1-2", {"kind": "client_result", "call": "c1", "at": "2", "result": "{"})
    assert broken.kind == "unreadable"


def test_client_tools_are_submitted_by_every_client_and_named_once() -> None:
    request = build_submission("p", client_tools=[LOCATE]).request
    assert [t.name for t in request.client_tools] == ["locate"]
    with pytest.raises(ValidationError, match="named twice"):
        build_submission("p", client_tools=[LOCATE, LOCATE])
    with pytest.raises(ValueError, match="catalogue tools: locate"):
        flows.check_client_tools(request, {"locate": ToolSpec(name="locate")})


def test_pending_names_the_command_that_answers_each_kind_of_wait() -> None:
    # `toolloop pending` once told a client-side tool's call to be approved, which the turn refuses.
    result = PendingApproval(
        call_id="c1", tool="locate", waiting_for="client_result", since=100.0, wait_deadline=400.0
    )
    assert build_pending_line("t", result, now=160.0) == (
        "60 s ago  locate({}) (a timeout in 4 min without an answer)\n"
        "    toolloop result t c1 (--result JSON | --error MSG)"
    )
    approval = PendingApproval(
        call_id="c2", tool="refund", arguments={"a": 1}, since=100.0, wait_deadline=400.0, on_timeout="deny"
    )
    assert build_pending_line("t", approval, now=160.0) == (
        '60 s ago  refund({"a":1}) (denied in 4 min without an answer)\n    toolloop approve t c2 [--deny]'
    )


def test_pending_leaves_out_calls_that_wait_on_a_sub_agent() -> None:
    # Such a call waits for its child turn, which no approve or result answers: listed, it offered
    # `toolloop approve` for a call that refuses it.
    waits = [
        PendingApproval(call_id="c1", tool="analyst", waiting_for="child_turn", since=1.0),
        PendingApproval(call_id="c2", tool="refund", waiting_for="approval", since=2.0),
    ]
    parent = TurnView(
        id="t", status=TurnStatus.WAITING, request=TurnRequest(prompt="p"), pending_approvals=waits
    )
    _steps, found = drive(flows.list_pending(), [[("t", TurnStatus.WAITING)], parent])
    assert [(turn_id, p.call_id) for turn_id, p in found] == [("t", "c2")]
