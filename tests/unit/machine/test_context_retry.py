"""The machine and the context budget: views fitted and reported, an over-long-context error
answered by a smaller view called again once, a second one failing the turn, and compaction."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.context.budget import ContextBudget
from orchestrator.context.tokens import count_request_tokens
from orchestrator.machine import start, step
from orchestrator.machine.events import CallModel, Command, Emit, Finish, ModelFailed, ModelResponded
from orchestrator.machine.state import TurnState
from orchestrator.model import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    Turn,
    TurnRequest,
    UserMessage,
)
from orchestrator.providers import openai_chat

pytestmark = pytest.mark.timeout(30)

MODEL = "openai:unknown-model"


def prior(turns: int, result_chars: int = 12_000) -> list[Message]:
    history: list[Message] = []
    for n in range(turns):
        history += [
            UserMessage(content=f"fetch page {n}"),
            AssistantMessage(tool_calls=[ToolCall(id=f"call_{n}", name="fetch", arguments={"n": n})]),
            ToolMessage(tool_call_id=f"call_{n}", name="fetch", content="x" * result_chars),
            AssistantMessage(content=f"page {n} read"),
        ]
    return history


def begin(turns: int) -> tuple[TurnState, list[Command]]:
    request = TurnRequest(prompt="and now?")
    return start("t1", request, model=MODEL, catalogue={}, at=1000.0, prior_history=prior(turns))


def model_calls(commands: list[Command]) -> list[CallModel]:
    return [c for c in commands if isinstance(c, CallModel)]


def events(commands: list[Command], name: str) -> list[dict[str, Any]]:
    return [c.data for c in commands if isinstance(c, Emit) and c.event_name == name]


def overflow(window: int | None, tokens: int = 40_000) -> ModelFailed:
    if window is None:
        body: dict[str, Any] = {
            "error": {"message": "Request too large for model.", "code": "context_length_exceeded"}
        }
    else:
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{tokens} tokens. Please reduce the length of the messages."
        )
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    return ModelFailed(error=openai_chat.error_from_wire(400, body), at=1001.0)


def answer(text: str) -> ModelResponded:
    return ModelResponded(turn=Turn(type="final_answer", text=text, provider="openai_chat"), at=1002.0)


def tokens(call: CallModel) -> int:
    return count_request_tokens(call.messages, call.tools)


def test_a_view_over_the_budget_is_trimmed_and_says_so() -> None:
    state, commands = begin(turns=12)  # about 50k estimated tokens against the default 32k window
    (call,) = model_calls(commands)
    (trimmed,) = events(commands, "context_trimmed")
    assert trimmed["estimated_tokens_before"] > trimmed["budget_tokens"] >= trimmed["estimated_tokens_after"]
    assert trimmed["elided_tool_results"] > 0
    assert tokens(call) <= trimmed["budget_tokens"]
    assert call.messages[-1] == UserMessage(content="and now?")
    (record,) = state.view_diagnostics
    assert record.llm_call_index == 0
    assert {d.kind for d in record.diagnostics} == {"elided_tool_result"}
    assert len(state.history) == 12 * 4 + 1  # the stored history keeps everything


def test_an_over_long_context_error_shrinks_the_view_and_calls_again_once() -> None:
    state, _ = begin(turns=6)  # about 25k estimated tokens: fits the default window, not the real one
    state, commands = step(state, overflow(window=15_000))
    (again,) = model_calls(commands)
    assert again.llm_call_index == 1
    assert state.context_budget.window_tokens == 15_000  # remembered for the rest of the turn
    assert tokens(again) <= 15_000 - 1_875
    (exceeded,) = events(commands, "context_exceeded")
    assert (exceeded["window_tokens"], exceeded["prompt_tokens"], exceeded["retrying"]) == (
        15_000,
        40_000,
        True,
    )
    assert events(commands, "model_failed")[0]["code"] == "context_length_exceeded"
    assert state.outcome is None and state.stop is None
    assert state.llm_call_records[-1].error is not None

    state, commands = step(state, answer("done"))
    assert state.outcome is not None and state.outcome.status == "completed"


def test_a_second_over_long_context_error_fails_the_turn() -> None:
    state, _ = begin(turns=6)
    state, _ = step(state, overflow(window=15_000))
    state, commands = step(state, overflow(window=15_000))
    assert model_calls(commands) == []
    finish = [c for c in commands if isinstance(c, Finish)]
    assert finish and finish[0].outcome.status == "failed"
    assert finish[0].outcome.stop_reason == "provider_error"
    assert finish[0].outcome.error is not None
    assert finish[0].outcome.error.code == "context_length_exceeded"


def test_without_a_stated_window_the_view_shrinks_to_a_share_of_its_estimate() -> None:
    state, first = begin(turns=6)
    (call,) = model_calls(first)
    state, commands = step(state, overflow(window=None))
    (again,) = model_calls(commands)
    assert state.context_budget.cap_tokens is not None
    assert tokens(again) <= state.context_budget.cap_tokens <= 0.7 * tokens(call) + 1


def test_an_answer_gives_the_next_call_its_own_retry() -> None:
    state, _ = begin(turns=6)
    state, _ = step(state, overflow(window=20_000))
    assert state.context_budget.retries == 1
    state, _ = step(
        state,
        ModelResponded(
            turn=Turn(
                type="tool_calls",
                tool_calls=[ToolCall(id="c9", name="nope", arguments={})],
                provider="openai_chat",
            ),
            at=1002.0,
        ),
    )
    assert state.context_budget.retries == 0


def test_compaction_summarises_what_would_be_dropped_and_counts_as_a_model_call() -> None:
    state, _ = begin(turns=6)
    state = state.model_copy(update={"context_budget": ContextBudget(compaction=True)})
    state, commands = step(state, overflow(window=600))  # so small that exchanges must go
    (compaction,) = model_calls(commands)
    assert compaction.tools == []
    assert "Transcript:" in str(compaction.messages[-1])
    assert state.context_budget.compacting is not None

    summary_turn = Turn(type="final_answer", text="Earlier pages were read.", provider="openai_chat")
    state, commands = step(state, ModelResponded(turn=summary_turn, at=1002.0))
    assert (
        state.context_budget.summary is not None
        and state.context_budget.summary.text == "Earlier pages were read."
    )
    assert state.context_budget.compacting is None
    (call,) = model_calls(commands)
    assert "Earlier pages were read." in str(call.messages)
    assert events(commands, "context_compacted")
    assert state.llm_calls == 3 and len(state.llm_call_records) == 2  # the failure and the summary
    assert len(state.history) == 6 * 4 + 1

    state, _ = step(state, answer("done"))
    assert state.outcome is not None and state.outcome.status == "completed"
    assert state.outcome.llm_calls == 3
