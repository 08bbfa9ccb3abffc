"""The context budget of the request-time view, as tables: histories × budgets → views.

A history is written as words: `S` instructions, `U` a user message, `C` an assistant message calling one
tool (`C2` two), `T` a tool result (3,000 characters), `A` an answer. An expected view writes each stored
message as it is sent: the same word when whole, `t` when its result is elided, `-` when it is dropped. The
budget of each case is exactly the expected view's estimate, so trimming must stop there and nowhere else.
"""

from __future__ import annotations

from typing import get_type_hints

import pytest

from orchestrator.context.budget import BudgetChanges, ContextBudget, ContextSummary
from orchestrator.context.tokens import REQUEST_OVERHEAD_TOKENS, count_message_tokens, count_request_tokens
from orchestrator.context.trim import build_elision_marker
from orchestrator.context.windows import (
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    UNBOUNDED_WINDOW_TOKENS,
    build_context_window,
    build_output_reserve,
)
from orchestrator.machine.view import build_budget_tokens, build_view, fit_view
from orchestrator.model import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(30)

MODEL = "openai:unknown-model"
RESULT_CHARS = 3_000


def build_history(words: str) -> list[Message]:
    history: list[Message] = []
    calls = 0
    for number, word in enumerate(words.split()):
        if word == "S":
            history.append(SystemMessage(content="You are terse."))
        elif word == "U":
            history.append(UserMessage(content=f"question {number}"))
        elif word == "A":
            history.append(AssistantMessage(content=f"answer {number}", provider="openai"))
        elif word.startswith("C"):
            n = int(word[1:] or 1)
            ids = [f"call_{calls + i}" for i in range(n)]
            history.append(
                AssistantMessage(
                    tool_calls=[ToolCall(id=i, name="fetch", arguments={"n": number}) for i in ids],
                    provider="openai",
                )
            )
            calls += n
        elif word == "T":
            answered = sum(1 for m in history if isinstance(m, ToolMessage))
            content = f"{number}:" + "x" * (RESULT_CHARS - len(f"{number}:"))
            history.append(ToolMessage(tool_call_id=f"call_{answered}", name="fetch", content=content))
    return history


def expected_view(history: list[Message], shape: str) -> list[Message]:
    view: list[Message] = []
    for message, word in zip(history, shape.split(), strict=True):
        if word == "-":
            continue
        if word == "t":
            assert isinstance(message, ToolMessage)
            marker = build_elision_marker(len(message.content))
            view.append(message.model_copy(update={"content": marker}))
        else:
            view.append(message)
    return view


def fit(history: list[Message], budget_tokens: int) -> tuple[list[Message], list[tuple[str, int]]]:
    view = fit_view(build_view(history, MODEL), history, model=MODEL, tools=[], budget_tokens=budget_tokens)
    return view.messages, [(d.kind, d.message_index) for d in view.diagnostics]


THREE_TURNS = "S U C T A U C T A U C T"
CASES = [
    # name, history, expected view (its size is the budget), expected diagnostics
    ("fits", THREE_TURNS, "S U C T A U C T A U C T", []),
    ("oldest result elided first", THREE_TURNS, "S U C t A U C T A U C T", [("elided_tool_result", 3)]),
    (
        "every earlier result elided before any exchange is dropped",
        THREE_TURNS,
        "S U C t A U C t A U C T",
        [("elided_tool_result", 3), ("elided_tool_result", 7)],
    ),
    (
        "then the oldest exchange dropped whole, the instructions kept",
        THREE_TURNS,
        "S - - - - U C t A U C T",
        [("elided_tool_result", 3), ("elided_tool_result", 7), ("dropped_exchange", 1)],
    ),
    (
        "every earlier exchange dropped: the current turn stays whole",
        THREE_TURNS,
        "S - - - - - - - - U C T",
        [
            ("elided_tool_result", 3),
            ("elided_tool_result", 7),
            ("dropped_exchange", 1),
            ("dropped_exchange", 5),
        ],
    ),
    (
        "parallel calls leave with their results",
        "U C2 T T A U C T A U C T",
        "- - - - - U C t A U C T",
        [
            ("elided_tool_result", 2),
            ("elided_tool_result", 3),
            ("elided_tool_result", 7),
            ("dropped_exchange", 0),
        ],
    ),
    (
        "a leading run without a user message is the oldest exchange",
        "A U C T A U C T",
        "- U C t A U C T",
        [("elided_tool_result", 3), ("dropped_exchange", 0)],
    ),
    (
        "last, the current turn's older results, never its last round's",
        "S U C T A U C T C T C T",
        "S - - - - U C t C t C T",
        [
            ("elided_tool_result", 3),
            ("dropped_exchange", 1),
            ("elided_tool_result", 7),
            ("elided_tool_result", 9),
        ],
    ),
]


@pytest.mark.parametrize(
    ("history_words", "shape", "diagnostics"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_trimming_stops_at_the_first_view_that_fits(
    history_words: str, shape: str, diagnostics: list[tuple[str, int]]
) -> None:
    history = build_history(history_words)
    expected = expected_view(history, shape)
    budget = count_request_tokens(expected, [])
    messages, found = fit(history, budget)
    assert messages == expected
    assert found == diagnostics
    # One token less and it would have had to go further, or say that it could not.
    tighter, tighter_found = fit(history, budget - 1)
    assert tighter != expected or tighter_found[-1][0] == "over_budget"


def test_what_cannot_fit_is_sent_as_trimmed_as_it_may_be_and_says_so() -> None:
    history = build_history("S U C T A U C T C T C T")
    messages, found = fit(history, 10)
    assert messages == expected_view(history, "S - - - - U C t C t C T")
    assert found[-1] == ("over_budget", len(history) - 1)


def test_markers_say_how_large_the_result_was() -> None:
    history = build_history("U C T A U C T")
    budget = count_request_tokens(expected_view(history, "U C t A U C T"), [])
    view = fit_view(build_view(history, MODEL), history, model=MODEL, tools=[], budget_tokens=budget)
    elided = view.messages[2]
    assert isinstance(elided, ToolMessage)
    assert elided.content == "[tool result elided to fit the context window: 3,000 characters]"
    assert elided.tool_call_id == "call_0"  # still answers its call
    assert view.diagnostics[0].detail == elided.content


def test_the_stored_history_is_never_changed() -> None:
    history = build_history(THREE_TURNS)
    before = [m.model_copy(deep=True) for m in history]
    fit(history, 50)
    assert history == before


def test_tool_schemas_and_the_request_framing_count_against_the_budget() -> None:
    history = build_history("U C T A U C T")
    tool = ToolSpec(name="fetch", description="d" * 3_000)
    whole = REQUEST_OVERHEAD_TOKENS + sum(count_message_tokens(m) for m in history)
    without = fit_view(build_view(history, MODEL), history, model=MODEL, tools=[], budget_tokens=whole)
    assert without.messages == history
    with_tools = fit_view(build_view(history, MODEL), history, model=MODEL, tools=[tool], budget_tokens=whole)
    assert with_tools.messages != history
    assert with_tools.tokens <= whole


def test_a_summary_stands_for_the_history_it_summarises() -> None:
    history = build_history("S U C T A U C T A U C T")
    summary = ContextSummary(through=5, text="The user asked twice; pages fetched.", llm_call_index=3)
    view = fit_view(
        build_view(history, MODEL), history, model=MODEL, tools=[], budget_tokens=100_000, summary=summary
    )
    assert view.messages[0] == history[0]
    assert isinstance(view.messages[1], SystemMessage)
    assert "pages fetched" in view.messages[1].content
    assert view.messages[2:] == history[5:]
    assert [d.kind for d in view.diagnostics] == ["compacted"]


WINDOWS = [
    # The maintained list's figure (genai-prices), not the vendor's 1,047,576: windows come from the list.
    ("openai:gpt-4.1-mini", None, 1_000_000),
    ("openai:gpt-4o-2024-08-06", None, 128_000),
    ("openai:gpt-4", None, 8_192),
    ("openai:gpt-5-mini", None, 272_000),
    ("openai:o3-mini", None, 200_000),
    ("anthropic:claude-sonnet-4-5", None, 200_000),
    ("gemini:gemini-2.5-pro", None, 1_048_576),
    ("openai:meta-llama/Llama-3.1-8B-Instruct", None, 131_072),
    ("openai:qwen3:8b", None, 32_768),
    ("bedrock:us.anthropic.claude-3-5-sonnet-20240620-v1:0", None, 200_000),
    ("openai:my-finetune", None, DEFAULT_CONTEXT_WINDOW_TOKENS),
    ("openai:my-finetune", {"my-finetune": 4_096}, 4_096),
    ("openai:my-finetune-v2", {"openai:my-finetune": 4_096, "openai:my-finetune-v2": 8_192}, 8_192),
    ("openai:gpt-4o", {"anthropic:gpt-4o": 1_000}, 128_000),
    ("scripted:plan", None, UNBOUNDED_WINDOW_TOKENS),
    ("scripted:plan", {"scripted:plan": 2_000}, 2_000),
]


@pytest.mark.parametrize(("model", "overrides", "window"), WINDOWS)
def test_known_and_named_windows(model: str, overrides: dict[str, int] | None, window: int) -> None:
    assert build_context_window(model, overrides) == window


def test_the_budget_is_the_window_less_the_answer_and_a_cap() -> None:
    assert build_output_reserve(15_000) == 1_875
    assert build_output_reserve(1_000_000) == 32_000
    assert build_output_reserve(1_000) == 256
    assert build_output_reserve(15_000, max_output_tokens=500) == 500
    assert build_budget_tokens(MODEL, ContextBudget(window_tokens=15_000)) == 13_125
    assert (
        build_budget_tokens(
            MODEL, ContextBudget(window_tokens=15_000, output_reserve_tokens=0, cap_tokens=9_000)
        )
        == 9_000
    )
    assert build_budget_tokens(MODEL, ContextBudget()) == DEFAULT_CONTEXT_WINDOW_TOKENS - 4_096


def test_budget_changes_mirror_the_budget_fields() -> None:
    declared = get_type_hints(BudgetChanges, include_extras=True)
    assert declared == {name: f.annotation for name, f in ContextBudget.model_fields.items()}
    assert BudgetChanges.__required_keys__ == frozenset()
