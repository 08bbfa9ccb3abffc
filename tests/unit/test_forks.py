"""Forking a turn, the pure half (`orchestrator.store.forks`): which history a fork at message k starts from,
what it refuses and why, the fork's request, the original as read, the original's forks set as read, and how
long that set lives. The whole thing on real processes: tests/e2e/test_fork_e2e.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import UnknownTurnError
from orchestrator.model import (
    AssistantMessage,
    ForkedFrom,
    Limits,
    Message,
    ToolCall,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    TurnStatus,
    UserMessage,
)
from orchestrator.store.forks import (
    ForkSource,
    build_fork_history,
    build_fork_request,
    build_link_member,
    build_links_ttl_ms,
    parse_fork_links,
    parse_replacement,
    parse_source,
)

pytestmark = pytest.mark.timeout(10)

ADD = ToolCall(id="c1", name="add", arguments={"a": 2, "b": 3})
MULTIPLY = ToolCall(id="c2", name="multiply", arguments={"a": 2, "b": 3})
AGAIN = ToolCall(id="c3", name="add", arguments={"a": 4, "b": 5})
# 0 user, 1 assistant (two calls), 2-3 their results, 4 answer, 5 user, 6 assistant (one call), 7 its
# result, 8 answer
MESSAGES: list[Message] = [
    UserMessage(content="plan"),
    AssistantMessage(tool_calls=[ADD, MULTIPLY]),
    ToolMessage(tool_call_id="c1", name="add", content="5"),
    ToolMessage(tool_call_id="c2", name="multiply", content="6"),
    AssistantMessage(content="5 and 6"),
    UserMessage(content="again"),
    AssistantMessage(tool_calls=[AGAIN]),
    ToolMessage(tool_call_id="c3", name="add", content="9"),
    AssistantMessage(content="9"),
]


def tool(call_id: str, name: str, content: str) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, name=name, content=content)


@pytest.mark.parametrize(
    ("at", "replace", "expected"),
    [
        # An edited first result: the round's other result follows it as the original has it.
        (2, tool("c1", "add", "7"), [*MESSAGES[:2], tool("c1", "add", "7"), MESSAGES[3]]),
        (3, tool("c2", "multiply", "8"), [*MESSAGES[:3], tool("c2", "multiply", "8")]),
        (7, tool("c3", "add", "10"), [*MESSAGES[:7], tool("c3", "add", "10")]),
        # No replacement: message k kept, and everything after it re-run.
        (2, None, MESSAGES[:4]),
        (5, None, MESSAGES[:6]),
        # Another user prompt.
        (5, UserMessage(content="other"), [*MESSAGES[:5], UserMessage(content="other")]),
        (0, UserMessage(content="fresh"), [UserMessage(content="fresh")]),
    ],
)
def test_a_fork_starts_from_the_messages_before_k_then_the_replacement(
    at: int, replace: Message | None, expected: list[Message]
) -> None:
    assert build_fork_history(MESSAGES, at, replace) == expected


@pytest.mark.parametrize(
    ("at", "replace", "says"),
    [
        (9, None, "at: 9 is out of range: the turn has 9 messages (0 to 8)"),
        (-1, None, "at: -1 is out of range"),
        (4, None, "message 4 would be a assistant message (to have the model answer again, fork at 3)"),
        (1, None, "message 1 would be a assistant message"),
        (2, UserMessage(content="x"), "at: message 2 is inside a round of tool results"),
        (5, tool("c3", "add", "1"), "message 5 follows no tool call waiting for a result"),
        (7, tool("c9", "add", "1"), "tool_call_id 'c9' answers no call waiting at message 7 (calls waiting"),
        (3, tool("c1", "add", "1"), "tool_call_id 'c1' answers no call waiting at message 3"),
        (7, tool("c3", "multiply", "1"), "call 'c3' is a call of 'add', not of 'multiply'"),
        # It answers the other call of the round: the call message 2 answered is left without a result.
        (2, tool("c2", "multiply", "1"), "replace: calls left without a result: c1"),
        (8, AssistantMessage(content="better"), "message 8 would be a assistant message"),
    ],
)
def test_a_fork_that_does_not_fit_is_refused_saying_why(at: int, replace: Message | None, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        build_fork_history(MESSAGES, at, replace)
    assert says in str(raised.value)


def test_a_turn_without_messages_has_nothing_to_fork_at() -> None:
    with pytest.raises(ValueError, match=r"the turn has 0 messages \(none yet\)"):
        build_fork_history([], 0, None)


def test_a_replacement_is_a_message_model_or_a_dict_with_its_role() -> None:
    edited = {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "7"}
    assert parse_replacement(edited) == tool("c1", "add", "7")
    assert parse_replacement(UserMessage(content="hi")) == UserMessage(content="hi")
    assert parse_replacement(None) is None
    with pytest.raises(ValueError, match="replace: not a message"):
        parse_replacement({"role": "robot", "content": "x"})
    with pytest.raises(ValueError, match="replace: not a message"):
        parse_replacement({"role": "tool", "content": "no call id"})
    with pytest.raises(ValueError, match="replace: not a message but int"):
        parse_replacement(42)  # type: ignore[arg-type]  # what a caller may send all the same


ORIGINAL = TurnRequest(
    prompt="plan",
    tools=["add", "multiply"],
    model="scripted:plan",
    instructions="be brief",
    limits=Limits(max_llm_calls=4),
    context={"user": "ana"},
    conversation_id="conv-1",
    tenant="acme",
    priority="batch",
    output_schema={"type": "object"},
    trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
)
SOURCE = ForkSource("turn_original", ORIGINAL, TurnStatus.COMPLETED, MESSAGES)


def test_the_fork_runs_with_the_originals_request_but_its_history_and_its_overrides() -> None:
    edited = tool("c1", "add", "7")
    request = build_fork_request(
        SOURCE, 2, edited, model=["scripted:plan-b", "scripted:plan"], instructions="x"
    )
    assert request.forked_from == ForkedFrom(turn_id="turn_original", at=2)
    assert request.messages == [*MESSAGES[:2], edited, MESSAGES[3]]
    assert request.prompt is None
    assert (request.model, request.instructions) == (["scripted:plan-b", "scripted:plan"], "x")
    kept = ("tools", "limits", "context", "tenant", "priority", "output_schema", "model_settings", "stream")
    assert {f: getattr(request, f) for f in kept} == {f: getattr(ORIGINAL, f) for f in kept}
    # A branch, not the conversation's next turn; the caller's trace, not the original's.
    assert request.conversation_id is None and request.trace_context is None


def test_without_overrides_the_fork_keeps_the_originals_model_and_instructions() -> None:
    request = build_fork_request(SOURCE, 5, UserMessage(content="other"))
    assert (request.model, request.instructions) == ("scripted:plan", "be brief")


def _raw(
    outcome: TurnOutcome | None = None, state: str | None = None, status: str = "completed"
) -> list[Any]:
    return [
        ORIGINAL.model_dump_json(),
        status,
        state,
        outcome.model_dump_json() if outcome else None,
        [],
        [],
    ]


def test_the_original_is_read_from_its_outcome_once_it_has_ended() -> None:
    outcome = TurnOutcome(turn_id="turn_original", status="completed", messages=MESSAGES)
    source = parse_source("turn_original", _raw(outcome))
    assert (source.status, source.messages, source.request.tools) == (
        TurnStatus.COMPLETED,
        MESSAGES,
        ORIGINAL.tools,
    )


def test_a_queued_original_forks_from_the_messages_it_was_submitted_with() -> None:
    source = parse_source("turn_original", _raw(status="queued"))
    assert source.messages == [UserMessage(content="plan")]


def test_an_unknown_original_is_an_unknown_turn() -> None:
    with pytest.raises(UnknownTurnError):
        parse_source("turn_gone", [None, None, None, None, [], []])


def test_the_forks_set_reads_as_links_oldest_first_in_either_reply_shape() -> None:
    one, two = build_link_member("turn_a", 2), build_link_member("turn_b", 5)
    assert build_link_member("turn_a", 2) == one  # a retried link adds the same member: once
    flat = [one, "100.5", two, "200.25", "not json", "300"]
    paired = [[one, 100.5], [two, 200.25], ["{}", 300.0]]
    for reply in (flat, paired):
        links = parse_fork_links(reply)
        assert [(link.turn_id, link.at, link.forked_at) for link in links] == [
            ("turn_a", 2, 100.5),
            ("turn_b", 5, 200.25),
        ]
    assert parse_fork_links([]) == []


@pytest.mark.parametrize(
    ("request_ttl_ms", "links_ttl_ms", "expected"),
    [
        (5_000_000, -2, 5_000_000),  # ended: as long as the original's keys
        (5_000_000, 9_000_000, 9_000_000),  # never shorter than the set had
        (-1, -2, (3600 + 300) * 1000),  # running: the turn's retention past its deadline
        (-1, 10_000_000, 10_000_000),
    ],
)
def test_the_forks_set_lives_as_long_as_the_original(
    request_ttl_ms: int, links_ttl_ms: int, expected: int
) -> None:
    assert build_links_ttl_ms(request_ttl_ms, links_ttl_ms, turn_ttl_s=3600, deadline_s=300.0) == expected
