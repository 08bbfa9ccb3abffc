"""Cohere v2 chat responses and streams, from the Cohere API reference."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn
from orchestrator.providers import cohere


def chat(message: dict[str, Any], finish: str = "COMPLETE") -> dict[str, Any]:
    return {
        "id": "r-1",
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
        "usage": {
            "billed_units": {"input_tokens": 3, "output_tokens": 2},
            "tokens": {"input_tokens": 30, "output_tokens": 20},
        },
    }


def test_text_and_thinking_blocks() -> None:
    body = chat({"content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hi"}]})
    turn = cohere.from_wire(body)
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking, turn.finish_reason) == ("Hi", "hmm", "stop")
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (30, 20)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("COMPLETE", "stop"),
        ("STOP_SEQUENCE", "stop"),
        ("MAX_TOKENS", "length"),
        ("TOOL_CALL", "tool_calls"),
        ("ERROR", "unknown"),
        ("TIMEOUT", "unknown"),
    ],
)
def test_every_finish_reason(raw: str, expected: str) -> None:
    turn = cohere.from_wire(chat({"content": [{"type": "text", "text": "x"}]}, raw))
    assert isinstance(turn, Turn) and turn.finish_reason == expected


@pytest.mark.parametrize(("raw", "expected"), [("null", {}), ("", {}), ('{"q": "x"}', {"q": "x"})])
def test_null_and_empty_arguments(raw: str, expected: dict[str, Any]) -> None:
    body = chat(
        {
            "tool_plan": "I will search.",
            "tool_calls": [
                {"id": "s_1", "type": "function", "function": {"name": "search", "arguments": raw}}
            ],
        },
        "TOOL_CALL",
    )
    turn = cohere.from_wire(body)
    assert isinstance(turn, Turn)
    assert turn.tool_calls[0].arguments == expected and turn.tool_calls[0].arguments_error is None
    assert turn.text == "I will search." and turn.provider_data["tool_plan"] == "I will search."


def test_broken_arguments_keep_the_call_with_its_error() -> None:
    body = chat(
        {
            "tool_calls": [
                {"id": "a", "function": {"name": "f", "arguments": "[1, 2]"}},
                {"id": "b", "function": {"name": "g", "arguments": "{"}},
            ]
        },
        "TOOL_CALL",
    )
    turn = cohere.from_wire(body)
    assert isinstance(turn, Turn) and turn.type == "tool_calls"
    assert [c.raw_arguments for c in turn.tool_calls] == ["[1, 2]", "{"]
    assert all(c.arguments_error for c in turn.tool_calls)


def test_error_body() -> None:
    error = cohere.error_from_wire(429, {"id": "x", "message": "You are using a Trial key"})
    assert (error.message, error.retryable, error.status) == ("You are using a Trial key", True, 429)


def sse(events: list[dict[str, Any]]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


STREAM: list[dict[str, Any]] = [
    {"type": "message-start", "id": "m1", "delta": {"message": {"role": "assistant"}}},
    {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "I will "}}},
    {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "look it up."}}},
    {
        "type": "tool-call-start",
        "index": 0,
        "delta": {
            "message": {
                "tool_calls": {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": ""},
                }
            }
        },
    },
    {
        "type": "tool-call-delta",
        "index": 0,
        "delta": {"message": {"tool_calls": {"function": {"arguments": '{"q": '}}}},
    },
    {
        "type": "tool-call-delta",
        "index": 0,
        "delta": {"message": {"tool_calls": {"function": {"arguments": '"cats"}'}}}},
    },
    {"type": "tool-call-end", "index": 0},
    {
        "type": "message-end",
        "delta": {"finish_reason": "TOOL_CALL", "usage": {"tokens": {"input_tokens": 9, "output_tokens": 4}}},
    },
]


def test_stream_accumulates() -> None:
    turn = cohere.from_stream(sse(STREAM))
    assert isinstance(turn, Turn), turn
    assert (turn.text, turn.finish_reason) == ("I will look it up.", "tool_calls")
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("c1", "search", {"q": "cats"})]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (9, 4)


def test_stream_without_message_end_is_retryable() -> None:
    result = cohere.from_stream(sse(STREAM[:-1]))
    assert isinstance(result, ProviderError) and result.retryable


@pytest.mark.parametrize(
    "body",
    [
        {"message": []},
        {"message": {"tool_plan": 1}},
        {"message": {"content": [3]}},
        {"message": {}, "finish_reason": []},
    ],
)
def test_malformed_bodies(body: object) -> None:
    result = cohere.from_wire(body)
    assert isinstance(result, ProviderError) and result.type == "invalid_response"
