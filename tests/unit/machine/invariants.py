"""Invariants of a turn, checked after every step of every machine test (docs/design/turns.md)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.machine.events import Command, Finish
from orchestrator.machine.state import TurnState
from orchestrator.model import LIMIT_STOP_REASONS, AssistantMessage, Message, ToolMessage


def check_history(history: Sequence[Message]) -> None:
    """Every assistant tool call is followed by exactly one tool message, in call order, before anything else;
    no tool message stands anywhere else; each call id is answered exactly once."""
    answered: set[str] = set()
    position = 0
    while position < len(history):
        message = history[position]
        assert not isinstance(message, ToolMessage), f"tool message at {position} answers no pending call"
        position += 1
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        for call in message.tool_calls:
            assert position < len(history), f"call {call.id} unanswered at the end of the history"
            answer = history[position]
            assert isinstance(answer, ToolMessage), f"call {call.id} not answered before message {position}"
            assert answer.tool_call_id == call.id, f"tool messages out of call order at {position}"
            assert call.id not in answered, f"call id {call.id} answered twice"
            answered.add(call.id)
            position += 1


def last_assistant(history: Sequence[Message]) -> AssistantMessage | None:
    for message in reversed(history):
        if isinstance(message, AssistantMessage):
            return message
    return None


def check_state(state: TurnState, commands: Sequence[Command]) -> None:
    """The invariants of one step's result."""
    check_history(state.history)
    limits = state.limits
    assert state.tool_executions <= limits.max_tool_executions, "max_tool_executions overshot"
    assert state.llm_calls <= limits.max_llm_calls, "max_llm_calls overshot"
    finishes = [c for c in commands if isinstance(c, Finish)]
    assert len(finishes) <= 1
    if finishes:
        assert commands[-1] is finishes[0], "Finish is the last command of its step"
    if state.current is not None:
        for index, call in enumerate(state.current.calls):
            assert call.index == index
            assert call.outcome is None or call.outcome.call_id == call.call_id
    if state.outcome is not None:
        outcome = state.outcome
        assert state.current is None, "a finished turn has no open round"
        assert not state.timers, "a finished turn leaves no timer armed"
        assert outcome.messages == state.history
        assert state.status.value == outcome.status
        assert outcome.limit_reached == (
            outcome.status == "stopped" and outcome.stop_reason in LIMIT_STOP_REASONS
        )
        if outcome.output is not None:
            assert outcome.status == "completed", "only a completed turn has an output"
        if outcome.status != "completed":
            final = last_assistant(state.history)
            assert final is None or not final.tool_calls, (
                "a stopped turn's last assistant message asks for tools"
            )
            assert outcome.stop_reason is not None
        else:
            assert outcome.stop_reason is None
            assert isinstance(state.history[-1], AssistantMessage)
