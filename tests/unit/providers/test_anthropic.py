"""Anthropic Messages both ways: cases written from the API reference."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from orchestrator.machine.view import build_view
from orchestrator.model import (
    AssistantMessage,
    Message,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    UserMessage,
)
from orchestrator.providers import anthropic
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.traits import traits_of
from workers.contract import ToolSpec

ANTHROPIC_IDS = traits_of("anthropic").tool_call_id_pattern

THINKING = {"type": "thinking", "thinking": "Let me think.", "signature": "sig-abc"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-data"}


def message(*content: dict[str, Any], stop_reason: str | None = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": list(content),
        "stop_reason": stop_reason,
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 7,
        },
    }


def turn_of(body: object) -> Turn:
    result = anthropic.from_wire(body)
    assert isinstance(result, Turn), result
    return result


def test_blocks_text_thinking_redacted_and_tool_use() -> None:
    turn = turn_of(
        message(
            THINKING,
            REDACTED,
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": {"c": [1, 2]}}},
            {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
            stop_reason="tool_use",
        )
    )
    assert (turn.type, turn.text, turn.thinking, turn.finish_reason) == (
        "tool_calls",
        "Checking.",
        "Let me think.",
        "tool_calls",
    )
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("toolu_1", "add", {"a": 1, "b": {"c": [1, 2]}}),
        ("toolu_2", "now", {}),
    ]
    assert turn.provider_data["thinking_blocks"] == [THINKING, REDACTED]
    assert "sig-abc" not in (turn.thinking or "") and "opaque-data" not in (turn.thinking or "")
    usage = turn.usage
    # input_tokens is Anthropic's (uncached) count; the total adds the cache reads and writes beside it, so
    # that a token budget counts a cached prefix as OpenAI's totals do.
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (10, 5, 122)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (100, 7)


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("stop_sequence", "stop"),
        ("pause_turn", "unknown"),
    ],
)
def test_stop_reasons(stop_reason: str, expected: str) -> None:
    assert turn_of(message({"type": "text", "text": "x"}, stop_reason=stop_reason)).finish_reason == expected


@pytest.mark.parametrize(
    "body",
    [None, "text", {"content": "x"}, {"content": [3]}, {"content": [{"type": "text", "text": 1}]}],
)
def test_malformed_bodies_are_provider_errors(body: object) -> None:
    assert isinstance(anthropic.from_wire(body), ProviderError)


def test_errors_overloaded_and_request_id_header() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    error = anthropic.error_from_wire(529, body, {"request-id": "req_9", "retry-after": "3"})
    assert (error.status, error.type, error.retryable, error.request_id, error.retry_after_s) == (
        529,
        "overloaded_error",
        True,
        "req_9",
        3.0,
    )
    bad = anthropic.error_from_wire(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}
    )
    assert not bad.retryable
    assert isinstance(anthropic.from_wire(body), ProviderError)


def sse(*events: dict[str, Any], crlf: bool = False) -> str:
    newline = "\r\n" if crlf else "\n"
    return "".join(f"event: {e['type']}{newline}data: {json.dumps(e)}{newline}{newline}" for e in events)


def start_events() -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {
                **message(),
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "sig-1"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Sure"}},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_9", "name": "add", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": "3}"},
        },
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_10", "name": "now", "input": {}},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}},
    ]


@pytest.mark.parametrize("crlf", [False, True])
def test_stream_accumulates_thinking_signature_text_and_tool_input(crlf: bool) -> None:
    turn = anthropic.from_stream(sse(*start_events(), {"type": "message_stop"}, crlf=crlf))
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking, turn.finish_reason) == ("Sure", "Hmm", "tool_calls")
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [("toolu_9", {"a": 3}), ("toolu_10", {})]
    assert turn.provider_data["thinking_blocks"] == [
        {"type": "thinking", "thinking": "Hmm", "signature": "sig-1"}
    ]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (9, 42)


def test_stream_errors_and_cut_streams() -> None:
    overloaded = sse(
        *start_events()[:2], {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    error = anthropic.from_stream(overloaded)
    assert isinstance(error, ProviderError) and error.retryable and error.type == "overloaded_error"
    cut = anthropic.from_stream(sse(*start_events()))
    assert isinstance(cut, ProviderError) and cut.retryable
    assert isinstance(anthropic.from_stream(sse({"type": "content_block_delta", "delta": {}})), ProviderError)


SPEC = ToolSpec(name="add", description="Add.", parameters={"properties": {"a": {"type": "number"}}})


def conversation(provider: str, call_ids: tuple[str, str] = ("toolu_1", "toolu_2")) -> list[Any]:
    calls = [ToolCall(id=call_ids[0], name="add", arguments={"a": 1}), ToolCall(id=call_ids[1], name="add")]
    return [
        SystemMessage(content="Be brief."),
        UserMessage(content="add"),
        AssistantMessage(
            content="Adding.",
            thinking="Let me think.",
            tool_calls=calls,
            provider=provider,
            provider_data={"thinking_blocks": [THINKING, REDACTED]},
        ),
        ToolMessage(tool_call_id=call_ids[0], name="add", content="1"),
        ToolMessage(tool_call_id=call_ids[1], name="add", content="Error: boom", is_error=True),
        UserMessage(content="and now?"),
    ]


def assert_pairing_and_ids(body: dict[str, Any]) -> None:
    """Every tool_use is answered by a tool_result in the very next (user) message; ids are valid."""
    messages = body["messages"]
    assert messages[0]["role"] == "user"
    for previous, current in itertools.pairwise(messages):
        assert previous["role"] != current["role"]
    for index, entry in enumerate(messages):
        uses = [b["id"] for b in entry["content"] if b["type"] == "tool_use"]
        for block in entry["content"]:
            for key in ("id", "tool_use_id"):
                if key in block:
                    assert ANTHROPIC_IDS.match(block[key]), block[key]
        if uses:
            answers = [b["tool_use_id"] for b in messages[index + 1]["content"] if b["type"] == "tool_result"]
            assert answers == uses


def test_to_wire_system_pairing_merging_and_signed_thinking_for_the_same_provider() -> None:
    body = anthropic.to_wire(
        ModelRequest(
            model="claude",
            messages=conversation("anthropic"),
            tools=[SPEC],
            tool_choice="required",
            prompt_cache=False,
        )
    )
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS
    assert body["messages"][1]["content"] == [
        THINKING,
        REDACTED,
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
        {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {}},
    ]
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Error: boom", "is_error": True},
            {"type": "text", "text": "and now?"},
        ],
    }
    assert len(body["messages"]) == 3
    assert body["tools"] == [
        {
            "name": "add",
            "description": "Add.",
            "input_schema": {"properties": {"a": {"type": "number"}}, "type": "object"},
        }
    ]
    assert body["tool_choice"] == {"type": "any"}
    assert_pairing_and_ids(body)


def test_to_wire_drops_foreign_thinking_and_cleans_invalid_ids_consistently() -> None:
    ids = ("functions.get_temperature:0", "functions.get_temperature;0")
    body = anthropic.to_wire(ModelRequest(model="claude", messages=conversation("openai_chat", ids)))
    assert "Let me think." not in json.dumps(body)
    assert all(
        b["type"] not in ("thinking", "redacted_thinking") for m in body["messages"] for b in m["content"]
    )
    assert_pairing_and_ids(body)
    uses = [b["id"] for b in body["messages"][1]["content"] if b["type"] == "tool_use"]
    assert len(set(uses)) == 2


@pytest.mark.parametrize("raw_id", ["", "a b", "x" * 200, "toolu_01AbC-_"])
def test_clean_tool_id_is_always_valid_and_stable(raw_id: str) -> None:
    cleaned = anthropic.clean_tool_id(raw_id)
    assert ANTHROPIC_IDS.match(cleaned)
    assert cleaned == anthropic.clean_tool_id(raw_id)
    if ANTHROPIC_IDS.match(raw_id):
        assert cleaned == raw_id


def add_round(provider: str, call_id: str) -> list[Message]:
    """A question, `provider`'s call of `add`, and its result."""
    call = ToolCall(id=call_id, name="add", arguments={"a": 2, "b": 2})
    return [
        UserMessage(content="What is 2 + 2?"),
        AssistantMessage(provider=provider, tool_calls=[call]),
        ToolMessage(tool_call_id=call_id, name="add", content="4"),
    ]


def test_a_conversation_ending_with_the_assistant_gets_a_user_turn_to_go_on_from() -> None:
    # After a fallback from OpenAI, the view flattens OpenAI's tool calls and their results to assistant
    # text: sent as is, Anthropic would take it as a prefill, which extended thinking refuses.
    view = build_view(add_round("openai", "call_a"), "anthropic:claude-sonnet-4-5")
    body = anthropic.to_wire(ModelRequest(model="claude-sonnet-4-5", messages=view.messages))
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert "[Tool result: add] 4" in json.dumps(body["messages"][1])
    assert body["messages"][-1]["content"] == [{"type": "text", "text": anthropic.CONTINUE_TEXT}]


def test_a_conversation_ending_with_the_user_or_a_tool_result_is_sent_as_it_is() -> None:
    native = add_round("anthropic", "toolu_1")
    body = anthropic.to_wire(ModelRequest(model="claude-sonnet-4-5", messages=native))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][-1]["content"][0]["type"] == "tool_result"
    plain = anthropic.to_wire(ModelRequest(model="claude-sonnet-4-5", messages=[UserMessage(content="hi")]))
    assert plain["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
