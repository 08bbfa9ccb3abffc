"""The archive record of a finished turn, built from its request, outcome and calls' envelopes (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.archive import (
    ARCHIVE_SCHEMA_VERSION,
    TurnRecord,
    build_archive_send,
    build_record_wire_ids,
    build_turn_record,
    find_turn_input,
)
from orchestrator.model import (
    ApprovalDecision,
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    UserMessage,
)
from orchestrator.runtime.inbox import build_wire_call_id
from workers.contract import REDACTED, FailureKind, ToolOutcome

pytestmark = pytest.mark.timeout(30)

TURN = "turn_abc"


def exchange(prompt: str, call_id: str, tool: str = "add", **arguments: Any) -> list[Message]:
    """A user prompt, one call and its answer, then the final answer."""
    return [
        UserMessage(content=prompt),
        AssistantMessage(tool_calls=[ToolCall(id=call_id, name=tool, arguments=arguments)]),
        ToolMessage(tool_call_id=call_id, name=tool, content="3"),
        AssistantMessage(content="done"),
    ]


def envelope(call_id: str, tool: str = "add", **changes: Any) -> ToolOutcome:
    fields: dict[str, Any] = {
        "call_id": build_wire_call_id(TURN, call_id),
        "tool": tool,
        "turn_id": TURN,
        "ok": True,
        "result": 3,
        "content": "3",
        "attempts": 2,
        "duration_ms": 12.5,
        "worker": "w1@host",
        "finished_at": 1700.0,
        **changes,
    }
    return ToolOutcome(**fields)


def outcome_of(messages: list[Message]) -> TurnOutcome:
    return TurnOutcome(turn_id=TURN, status="completed", text="done", messages=messages, llm_calls=2)


@pytest.mark.parametrize(
    ("prior", "request_", "expected"),
    [
        pytest.param([], TurnRequest(prompt="hi"), (0, 1), id="a first turn"),
        pytest.param(
            exchange("hi", "c1"), TurnRequest(prompt="hi"), (4, 5), id="the same prompt in an earlier turn"
        ),
        pytest.param(
            [SystemMessage(content="be brief")],
            TurnRequest(messages=[UserMessage(content="a")], prompt="b"),
            (1, 3),
            id="request messages then the prompt",
        ),
        pytest.param([], TurnRequest(messages=[]), (0, 0), id="no input at all"),
    ],
)
def test_the_turn_input_is_found_after_the_earlier_turns(
    prior: list[Message], request_: TurnRequest, expected: tuple[int, int]
) -> None:
    own = [*request_.messages, *([UserMessage(content=request_.prompt)] if request_.prompt else [])]
    added = [AssistantMessage(content="answer")]
    assert find_turn_input([*prior, *own, *added], request_) == expected


def test_a_record_holds_the_turn_whole_and_its_calls_as_their_envelopes_say() -> None:
    request = TurnRequest(prompt="go", context={"user": "u1"})
    messages: list[Message] = [
        UserMessage(content="go"),
        AssistantMessage(
            tool_calls=[ToolCall(id="c1", name="add"), ToolCall(id="c2", name="lookup", arguments={"q": 1})]
        ),
        ToolMessage(tool_call_id="c1", name="add", content="3"),
        ToolMessage(
            tool_call_id="c2",
            name="lookup",
            content="Error: timed out",
            is_error=True,
            failure_kind=FailureKind.TIMEOUT,
            synthetic=True,
        ),
        AssistantMessage(content="done"),
    ]
    # c2's envelope is no longer stored: its record comes from its tool message.
    record = build_turn_record(
        TURN, request, outcome_of(messages), {envelope("c1").call_id: envelope("c1")}, 99.0
    )

    assert record.schema_version == ARCHIVE_SCHEMA_VERSION
    assert (record.turn_id, record.finished_at, record.first_message_index) == (TURN, 99.0, 0)
    assert record.request.prompt == "go"
    assert record.outcome.messages == messages
    assert [c.model_dump() for c in record.calls] == [
        {
            "call_id": "c1",
            "tool": "add",
            "ok": True,
            "failure_kind": None,
            "synthetic": False,
            "attempts": 2,
            "duration_ms": 12.5,
            "worker": "w1@host",
            "finished_at": 1700.0,
            "approval": None,
        },
        {
            "call_id": "c2",
            "tool": "lookup",
            "ok": False,
            "failure_kind": FailureKind.TIMEOUT,
            "synthetic": True,
            "attempts": None,
            "duration_ms": None,
            "worker": None,
            "finished_at": None,
            "approval": None,
        },
    ]


def test_calls_of_earlier_turns_and_of_the_input_are_not_this_turns() -> None:
    # The earlier turn's call has the id this turn's call has (ids a model derives from the round).
    earlier = exchange("first", "call_r0_0", tool="add")
    submitted = exchange("replayed", "given_1", tool="lookup")[:3]
    request = TurnRequest(messages=submitted, prompt="second", conversation_id="conv")
    mine = exchange("second", "call_r0_0", tool="multiply")[1:]
    outcome = outcome_of([*earlier, *submitted, UserMessage(content="second"), *mine])
    stored = envelope("call_r0_0", tool="multiply")

    assert build_record_wire_ids(TURN, request, outcome) == [build_wire_call_id(TURN, "call_r0_0")]
    record = build_turn_record(TURN, request, outcome, {stored.call_id: stored}, 1.0)
    assert [(c.call_id, c.tool) for c in record.calls] == [("call_r0_0", "multiply")]
    assert record.first_message_index == len(earlier)
    assert record.conversation_id == "conv"


def test_sensitive_values_are_redacted_as_in_every_view() -> None:
    request = TurnRequest(prompt="log in", context={"api_key": "sk-1", "user": "u1"})
    messages = exchange("log in", "c1", tool="login", password="hunter2", name="bob")
    record = build_turn_record(TURN, request, outcome_of(messages), {}, 1.0)

    assert record.request.context == {"api_key": REDACTED, "user": "u1"}
    call = next(m for m in record.outcome.messages if isinstance(m, AssistantMessage)).tool_calls[0]
    assert call.arguments == {"password": REDACTED, "name": "bob"}
    assert "hunter2" not in json.dumps(build_archive_send(record, task="t", queue="q"))


def test_the_send_is_json_ready_and_shows_flower_no_content() -> None:
    messages = exchange("secret plans", "c1")
    record = build_turn_record(TURN, TurnRequest(prompt="secret plans"), outcome_of(messages), {}, 5.0)
    options = build_archive_send(record, task="myapp.archive_turn", queue="toolloop.archive")

    assert (options["name"], options["queue"]) == ("myapp.archive_turn", "toolloop.archive")
    assert options["task_id"] == f"toolloop.archive:{TURN}"
    sent = json.loads(json.dumps(options["kwargs"]))
    assert TurnRecord.model_validate(sent["record"]) == record
    assert "secret plans" not in options["argsrepr"] + options["kwargsrepr"]
    assert json.loads(options["kwargsrepr"]) == {"turn_id": TURN, "status": "completed"}


def test_a_call_that_waited_for_a_person_says_who_answered_and_why() -> None:
    messages: list[Message] = [
        UserMessage(content="refund"),
        AssistantMessage(tool_calls=[ToolCall(id="c1", name="refund", arguments={"amount": 5})]),
        ToolMessage(tool_call_id="c1", name="refund", content="done"),
        AssistantMessage(content="refunded"),
    ]
    decision = ApprovalDecision(
        call_id="c1", tool="refund", approved=True, decided_by="ana", reason="known customer", at=5.0
    )
    outcome = outcome_of(messages).model_copy(update={"approvals": [decision]})
    record = build_turn_record(TURN, TurnRequest(prompt="refund"), outcome, {}, 99.0)
    (call,) = record.calls
    assert call.approval == decision
    assert record.model_dump(mode="json")["calls"][0]["approval"]["decided_by"] == "ana"
