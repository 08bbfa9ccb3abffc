"""Ollama native /api/chat (whole and NDJSON stream), from the Ollama API reference."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn
from orchestrator.providers import ollama
from orchestrator.providers.common import IdSource


def chat(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "qwen3",
        "created_at": "2025-01-01T00:00:00Z",
        "message": {"role": "assistant", **message},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 12,
        "eval_count": 8,
        **extra,
    }


def test_text_answer_and_usage() -> None:
    turn = ollama.from_wire(chat({"content": "Paris."}))
    assert isinstance(turn, Turn)
    assert (turn.type, turn.text, turn.model, turn.finish_reason) == (
        "final_answer",
        "Paris.",
        "qwen3",
        "stop",
    )
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.total_tokens) == (12, 8, 20)


def test_thinking_field_is_thinking_not_text() -> None:
    turn = ollama.from_wire(chat({"content": "4", "thinking": "2+2 is 4"}))
    assert isinstance(turn, Turn) and (turn.text, turn.thinking) == ("4", "2+2 is 4")


def test_tool_calls_without_ids_and_done_reason_stop() -> None:
    ids = IdSource()
    body = chat(
        {
            "content": "",
            "tool_calls": [
                {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                {"function": {"index": 1, "name": "add", "arguments": {"a": 3, "b": 4}}},
            ],
        }
    )
    turn = ollama.from_wire(body, ids=ids)
    again = ollama.from_wire(body, ids=ids)
    assert isinstance(turn, Turn) and isinstance(again, Turn)
    assert turn.type == "tool_calls" and turn.finish_reason == "stop" and turn.text is None
    assert [c.arguments for c in turn.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    all_ids = [c.id for c in turn.tool_calls + again.tool_calls]
    assert all(all_ids) and len(set(all_ids)) == 4


def test_arguments_as_a_string_are_parsed_the_same() -> None:
    turn = ollama.from_wire(chat({"tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}))
    assert isinstance(turn, Turn) and turn.tool_calls[0].arguments == {"x": 1}


@pytest.mark.parametrize(
    ("reason", "expected"), [("stop", "stop"), ("length", "length"), ("load", "unknown")]
)
def test_done_reasons(reason: str, expected: str) -> None:
    turn = ollama.from_wire(chat({"content": "x"}, done_reason=reason))
    assert isinstance(turn, Turn) and turn.finish_reason == expected


def ndjson(lines: list[dict[str, Any]], newline: str = "\n") -> str:
    return newline.join(json.dumps(line) for line in lines) + newline


STREAM = [
    {"model": "qwen3", "message": {"role": "assistant", "content": "", "thinking": "Hmm, "}, "done": False},
    {
        "model": "qwen3",
        "message": {"role": "assistant", "content": "", "thinking": "weather."},
        "done": False,
    },
    {
        "model": "qwen3",
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "w", "arguments": {}}}],
        },
        "done": False,
    },
    {"model": "qwen3", "message": {"role": "assistant", "content": "Checking"}, "done": False},
    chat({"content": "."}),
]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_ndjson_stream_accumulates(newline: str) -> None:
    turn = ollama.from_stream(ndjson(STREAM, newline))
    assert isinstance(turn, Turn), turn
    assert (turn.text, turn.thinking, turn.type) == ("Checking.", "Hmm, weather.", "tool_calls")
    assert turn.tool_calls[0].name == "w"
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (12, 8)


def test_stream_without_its_done_line_is_retryable() -> None:
    result = ollama.from_stream(ndjson(STREAM[:-1]))
    assert isinstance(result, ProviderError) and result.retryable and result.type == "invalid_response"


def test_error_bodies() -> None:
    error = ollama.error_from_wire(404, {"error": "model 'nope' not found"})
    assert (error.status, error.message, error.retryable) == (404, "model 'nope' not found", False)
    in_stream = ollama.from_stream(ndjson([STREAM[0], {"error": "unexpected EOF"}]))
    assert isinstance(in_stream, ProviderError) and in_stream.message == "unexpected EOF"


@pytest.mark.parametrize(
    "body",
    [None, [], {"message": "hi"}, {"message": {"content": 3}}, {"message": {"tool_calls": {"a": 1}}}],
)
def test_malformed_bodies(body: object) -> None:
    result = ollama.from_wire(body)
    assert isinstance(result, ProviderError) and result.type == "invalid_response"
