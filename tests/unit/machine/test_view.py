"""The request-time view: projection, model-switch flattening, id remapping, diagnostics, models."""

from __future__ import annotations

import re
from typing import Any

import pytest

from orchestrator.machine.view import build_view
from orchestrator.model import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.base import ModelRequest, resolve_model
from tests.openapi_schemas import assert_valid
from tests.unit.machine.harness import CATALOGUE, Driver, answer, calls, ok

pytestmark = pytest.mark.timeout(30)

ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")

HISTORY: list[Message] = [
    UserMessage(content="add then fetch"),
    AssistantMessage(
        content="Adding.",
        thinking="openai reasoning",
        tool_calls=[ToolCall(id="call.A/1", name="add", arguments={"a": 1, "b": 2})],
        provider="openai_chat",
        provider_data={"response_id": "chatcmpl-1"},
    ),
    ToolMessage(tool_call_id="call.A/1", name="add", content="3"),
    AssistantMessage(
        thinking="claude thinking",
        tool_calls=[ToolCall(id="toolu_01" + "x" * 60, name="fetch", arguments={"url": "u"})],
        provider="anthropic",
        provider_data={"thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "sig"}]},
    ),
    ToolMessage(tool_call_id="toolu_01" + "x" * 60, name="fetch", content="page"),
    # Calls given with the request carry no provider: sent structured to anyone, ids made acceptable.
    AssistantMessage(tool_calls=[ToolCall(id="given:1", name="add", arguments={"a": 0, "b": 0})]),
    ToolMessage(tool_call_id="given:1", name="add", content="0"),
    UserMessage(content="and now?"),
]


def test_switch_to_anthropic_flattens_openai_calls_and_keeps_its_own() -> None:
    view = build_view(HISTORY, "anthropic")
    messages = view.messages
    assert messages[1] == AssistantMessage(content='Adding.\n[Tool call: add] {"a": 1, "b": 2}')
    assert messages[2] == AssistantMessage(content="[Tool result: add] 3")
    own = messages[3]
    assert isinstance(own, AssistantMessage) and own.thinking == "claude thinking" and own.provider_data
    assert len(own.tool_calls[0].id) <= 64 and ANTHROPIC_ID.match(own.tool_calls[0].id)
    tool = messages[4]
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == own.tool_calls[0].id
    given = messages[5]
    assert isinstance(given, AssistantMessage) and ANTHROPIC_ID.match(given.tool_calls[0].id)
    assert isinstance(messages[6], ToolMessage) and messages[6].tool_call_id == given.tool_calls[0].id
    kinds = sorted({d.kind for d in view.diagnostics})
    assert kinds == [
        "dropped_provider_data",
        "dropped_thinking",
        "flattened_tool_calls",
        "flattened_tool_result",
        "remapped_tool_call_id",
    ]
    assert "openai reasoning" not in str([m.model_dump() for m in messages])
    assert HISTORY[1].tool_calls[0].id == "call.A/1"  # the stored history is untouched


def test_switch_back_to_openai_flattens_anthropic_calls() -> None:
    view = build_view(HISTORY, "openai:gpt-4.1-mini")
    messages = view.messages
    own = messages[1]
    assert isinstance(own, AssistantMessage) and own.thinking == "openai reasoning"
    assert own.tool_calls[0].id == "call.A/1" or len(own.tool_calls[0].id) <= 40
    assert messages[3] == AssistantMessage(content='[Tool call: fetch] {"url": "u"}')
    assert messages[4] == AssistantMessage(content="[Tool result: fetch] page")
    assert "claude thinking" not in str([m.model_dump() for m in messages])


def check_openai_body(body: dict[str, Any]) -> None:
    """A Chat Completions body OpenAI accepts: its published schema, and every call answered in order."""
    assert_valid(body, "CreateChatCompletionRequest")
    pending: list[str] = []
    for message in body["messages"]:
        if message["role"] == "tool":
            assert message["tool_call_id"] == pending.pop(0)
            continue
        assert not pending, "a tool call without its result"
        for call in message.get("tool_calls") or []:
            assert len(call["id"]) <= 40 and ANTHROPIC_ID.match(call["id"])
            pending.append(call["id"])
    assert not pending


def check_responses_body(body: dict[str, Any]) -> None:
    """A Responses API body OpenAI accepts: its published schema, every function call answered in order."""
    assert_valid(body, "CreateResponse")
    pending: list[str] = []
    previous = ""
    for item in body["input"]:
        kind = item["type"]
        if kind == "function_call_output":
            assert item["call_id"] == pending.pop(0)
        elif kind == "function_call":
            # The calls of one assistant message come together, before the first of their outputs.
            assert previous == "function_call" or not pending, "a function call without its output"
            assert len(item["call_id"]) <= 64 and ANTHROPIC_ID.match(item["call_id"])
            pending.append(item["call_id"])
        else:
            assert not pending, "a function call without its output"
        previous = kind
    assert not pending


def check_anthropic_body(body: dict[str, Any]) -> None:
    messages = body["messages"]
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        for use_id in uses:
            assert ANTHROPIC_ID.match(use_id) and len(use_id) <= 64
        if uses:
            following = messages[index + 1]
            assert following["role"] == "user"
            results = [b["tool_use_id"] for b in following["content"] if b.get("type") == "tool_result"]
            assert results == uses
    assert messages[0]["role"] == "user"


def openai_bodies(history: list[Message], tools: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Chat and the Responses body of the views of `history` for each, both checked."""
    chat = openai_chat.to_wire(
        ModelRequest(model="gpt-4.1-mini", messages=build_view(history, "openai").messages, tools=tools)
    )
    responses = openai_responses.to_wire(
        ModelRequest(model="gpt-5", messages=build_view(history, "openai_responses").messages, tools=tools)
    )
    check_openai_body(chat)
    check_responses_body(responses)
    return chat, responses


def test_openai_anthropic_openai_switch_gives_bodies_each_provider_accepts() -> None:
    tools = [CATALOGUE["add"], CATALOGUE["fetch"]]
    driver = Driver(model="openai:gpt-4.1-mini")
    driver.respond(calls(ToolCall(id="call_" + "q" * 50, name="add", arguments={"a": 1, "b": 2})))
    driver.finish(ok("call_" + "q" * 50, "add", "3"))
    history = driver.state.history
    anthropic_body = anthropic.to_wire(
        ModelRequest(model="claude", messages=build_view(history, "anthropic").messages, tools=tools)
    )
    check_anthropic_body(anthropic_body)
    openai_bodies(history, tools)
    # The Anthropic model answers with its own call, then OpenAI takes the turn back.
    claude_round: list[Message] = [
        AssistantMessage(
            tool_calls=[ToolCall(id="toolu_01ABC", name="fetch", arguments={"url": "u"})],
            provider="anthropic",
            thinking="t",
            provider_data={"thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
        ),
        ToolMessage(tool_call_id="toolu_01ABC", name="fetch", content="page"),
    ]
    history = [*history, *claude_round]
    openai_body, responses_body = openai_bodies(history, tools)
    assert "[Tool result: fetch] page" in str(openai_body["messages"])
    assert "[Tool result: fetch] page" in str(responses_body["input"])
    check_anthropic_body(
        anthropic.to_wire(ModelRequest(model="claude", messages=build_view(history, "anthropic").messages))
    )
    # A Responses model answers with two calls after its reasoning: structured for itself, text for Chat.
    responses_round: list[Message] = [
        AssistantMessage(
            content="Fetching both.",
            tool_calls=[
                ToolCall(id="call_r1", name="fetch", arguments={"url": "a"}),
                ToolCall(id="call:r2/" + "z" * 70, name="add", arguments={"a": 2, "b": 2}),
            ],
            provider="openai_responses",
            thinking="why",
            provider_data={
                "reasoning_items": [
                    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"}
                ]
            },
        ),
        ToolMessage(tool_call_id="call_r1", name="fetch", content="A"),
        ToolMessage(tool_call_id="call:r2/" + "z" * 70, name="add", content="4"),
        UserMessage(content="thanks"),
    ]
    history = [*history, *responses_round]
    openai_body, responses_body = openai_bodies(history, tools)
    assert "[Tool result: add] 4" in str(openai_body["messages"])
    outputs = [i["call_id"] for i in responses_body["input"] if i["type"] == "function_call_output"]
    assert outputs[0] == "call_r1" and len(outputs) == 2 and outputs[1] != "call:r2/" + "z" * 70
    assert [i["type"] for i in responses_body["input"]].count("reasoning") == 1
    check_anthropic_body(
        anthropic.to_wire(ModelRequest(model="claude", messages=build_view(history, "anthropic").messages))
    )


def test_the_machine_records_view_diagnostics_per_model_call() -> None:
    prior = HISTORY[:5]
    driver = Driver(model="anthropic:claude", prior_history=prior, prompt="go on")
    [record] = driver.state.view_diagnostics
    assert record.llm_call_index == 0 and record.target_provider == "anthropic"
    assert {d.kind for d in record.diagnostics} >= {"flattened_tool_calls", "dropped_thinking"}
    driver.respond(answer("ok"))
    assert driver.outcome.messages[: len(prior)] == prior


TIERS = {"fast": "openai:gpt-4.1-mini", "smart": "anthropic:claude-sonnet-4-5"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, "scripted:demo"),
        ("fast", "openai:gpt-4.1-mini"),
        ("smart", "anthropic:claude-sonnet-4-5"),
        ("default", "scripted:demo"),
        ("openai:gpt-5", "openai:gpt-5"),
    ],
)
def test_resolve_model(name: str | None, expected: str) -> None:
    assert resolve_model(name, default="scripted:demo", tiers=TIERS) == expected


def test_resolve_model_refuses_unknown_tiers() -> None:
    with pytest.raises(ValueError, match=r"unknown model tier 'huge'.*default, fast, smart"):
        resolve_model("huge", default="scripted:demo", tiers=TIERS)
    with pytest.raises(ValueError, match="provider:model"):
        resolve_model("openai:", default="scripted:demo", tiers=TIERS)
