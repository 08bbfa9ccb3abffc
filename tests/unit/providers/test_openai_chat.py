"""Chat Completions both ways: cases written from the API reference and OpenAI-compatible servers' quirks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import (
    AssistantMessage,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    UserMessage,
)
from orchestrator.providers import openai_chat
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.common import IdSource
from workers.contract import ToolSpec


def completion(message: dict[str, Any], finish_reason: str | None = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        **extra,
    }


def turn_of(body: object, ids: IdSource | None = None) -> Turn:
    result = openai_chat.from_wire(body, ids=ids)
    assert isinstance(result, Turn), result
    return result


def call(call_id: str | None, name: str, arguments: object) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("message", [{"content": None}, {"content": ""}, {}])
def test_content_null_empty_and_absent_are_all_no_text(message: dict[str, Any]) -> None:
    turn = turn_of(completion(message))
    assert turn.text is None
    assert turn.type == "final_answer"
    assert turn.finish_reason == "stop"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [('{"a": 1}', {"a": 1}), ({"a": 1}, {"a": 1}), ("null", {}), ("", {}), (None, {})],
)
def test_arguments_as_string_object_null_and_empty(arguments: object, expected: dict[str, Any]) -> None:
    turn = turn_of(completion({"tool_calls": [call("c1", "f", arguments)]}, "tool_calls"))
    assert turn.tool_calls[0].arguments == expected
    assert turn.tool_calls[0].arguments_error is None


@pytest.mark.parametrize("arguments", ['{"a": ', "[1, 2]", "42"])
def test_broken_arguments_keep_that_call_with_its_raw_text(arguments: str) -> None:
    turn = turn_of(completion({"tool_calls": [call("c1", "f", arguments), call("c2", "g", "{}")]}))
    broken, fine = turn.tool_calls
    assert (broken.raw_arguments, broken.arguments) == (arguments, {})
    assert broken.arguments_error
    assert fine.arguments_error is None
    assert turn.type == "tool_calls"  # finish_reason "stop" next to tool calls does not matter


def test_missing_and_empty_ids_get_unique_synthetic_ids_across_responses() -> None:
    ids = IdSource("turn7")
    first = turn_of(completion({"tool_calls": [call("", "f", "{}"), call(None, "f", "{}")]}), ids)
    second = turn_of(completion({"tool_calls": [call("", "f", "{}")]}), ids)
    all_ids = [c.id for c in [*first.tool_calls, *second.tool_calls]]
    assert all(all_ids) and len(set(all_ids)) == 3


def test_reasoning_fields_and_thinking_parts_are_thinking_never_text() -> None:
    deepseek = turn_of(completion({"content": "answer", "reasoning_content": "because"}))
    assert (deepseek.text, deepseek.thinking) == ("answer", "because")
    groq = turn_of(completion({"reasoning": "hmm", "tool_calls": [call("c", "f", "{}")]}))
    assert (groq.text, groq.thinking) == (None, "hmm")
    mistral = turn_of(
        completion(
            {
                "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "step 1"}]},
                    {"type": "text", "text": "Hello"},
                    {"type": "text", "text": " world"},
                ]
            }
        )
    )
    assert (mistral.text, mistral.thinking) == ("Hello world", "step 1")


def test_refusal_is_the_answer_text_and_content_filter_is_normalised() -> None:
    turn = turn_of(completion({"content": None, "refusal": "I can't."}, "content_filter"))
    assert (turn.text, turn.finish_reason) == ("I can't.", "content_filter")


def test_legacy_function_call_and_leaked_tokens_in_names() -> None:
    turn = turn_of(completion({"function_call": {"name": "search<|channel|>commentary", "arguments": "{}"}}))
    assert turn.tool_calls[0].name == "search"
    assert turn.tool_calls[0].id


def test_usage_details_and_finish_reason_length() -> None:
    body = completion({"content": "x"}, "length")
    body["usage"] |= {
        "completion_tokens_details": {"reasoning_tokens": 3},
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    turn = turn_of(body)
    assert (turn.usage.reasoning_tokens, turn.usage.cache_read_tokens, turn.finish_reason) == (3, 4, "length")
    assert turn.usage.total_tokens == 15
    no_usage = turn_of({"choices": [{"message": {"content": "hi"}}]})
    assert (no_usage.usage.total_tokens, no_usage.finish_reason, no_usage.model) == (0, None, None)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "not json",
        {"choices": []},
        {"choices": "x"},
        {"choices": [{"message": {"tool_calls": "x"}}]},
        {"choices": [{"message": {"tool_calls": [5]}}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"refusal": []}}]},
    ],
)
def test_malformed_bodies_are_provider_errors_not_exceptions(body: object) -> None:
    result = openai_chat.from_wire(body)
    assert isinstance(result, ProviderError)
    assert result.provider == "openai_chat"


def test_error_body_in_place_of_a_response() -> None:
    error = openai_chat.from_wire({"error": {"message": "bad", "type": "invalid_request_error", "code": "x"}})
    assert isinstance(error, ProviderError)
    assert (error.message, error.type, error.code, error.retryable) == (
        "bad",
        "invalid_request_error",
        "x",
        False,
    )
    limited = openai_chat.error_from_wire(429, {"error": {"message": "slow"}}, {"retry-after-ms": "1500"})
    assert (limited.retryable, limited.retry_after_s) == (True, 1.5)


def sse(*chunks: object, crlf: bool = False) -> str:
    newline = "\r\n" if crlf else "\n"
    lines = [f"data: {json.dumps(c)}{newline}{newline}" for c in chunks]
    return "".join(lines) + f"data: [DONE]{newline}{newline}"


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


@pytest.mark.parametrize("crlf", [False, True])
def test_stream_accumulates_text_thinking_and_calls_by_index(crlf: bool) -> None:
    text = sse(
        chunk({"role": "assistant", "reasoning_content": "thin"}),
        chunk({"reasoning_content": "king"}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls"),
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
        crlf=crlf,
    )
    turn = openai_chat.from_stream(text)
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking, turn.finish_reason) == ("Hello", "thinking", "tool_calls")
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("a", "f", {"x": 1}), ("b", "g", {})]
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.total_tokens) == (3, 4, 7)


def test_stream_without_index_and_with_repeated_names() -> None:
    text = sse(
        chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"q":'}}]}),
        chunk({"tool_calls": [{"function": {"name": "f", "arguments": '"x"}'}}]}),
        chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": {"k": 2}}}]}),
        chunk({}, "stop"),
    )
    turn = openai_chat.from_stream(text)
    assert isinstance(turn, Turn)
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("a", "f", {"q": "x"}),
        ("b", "g", {"k": 2}),
    ]
    assert turn.type == "tool_calls"


def test_stream_errors_and_empty_streams_are_provider_errors() -> None:
    failed = openai_chat.from_stream(
        sse(chunk({"content": "x"}), {"error": {"message": "overloaded", "type": "server_error"}})
    )
    assert isinstance(failed, ProviderError) and failed.retryable
    assert isinstance(openai_chat.from_stream(""), ProviderError)
    assert isinstance(openai_chat.from_stream("data: {broken\n\n"), ProviderError)


SPEC = ToolSpec(
    name="add",
    description="Add two numbers.",
    parameters={"type": "object", "properties": {"a": {"type": "number"}}},
)


def test_to_wire_pairs_each_tool_result_with_its_call_and_never_sends_thinking() -> None:
    calls = [
        ToolCall(id="c1", name="add", arguments={"a": 1}),
        ToolCall(id="c2", name="add", raw_arguments="{oops", arguments_error="not JSON"),
    ]
    request = ModelRequest(
        model="gpt-4.1-mini",
        messages=[
            SystemMessage(content="sys"),
            UserMessage(content="hi"),
            AssistantMessage(content=None, thinking="secret reasoning", tool_calls=calls),
            ToolMessage(tool_call_id="c1", name="add", content="1"),
            ToolMessage(tool_call_id="c2", name="add", content="Error: bad arguments", is_error=True),
            AssistantMessage(content=None, thinking="more"),
        ],
        tools=[SPEC],
        tool_choice="add",
        max_output_tokens=100,
    )
    body = openai_chat.to_wire(request)
    assert "secret reasoning" not in json.dumps(body)
    assert body["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{oops"}},
        ],
    }
    assert body["messages"][3:5] == [
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: bad arguments"},
    ]
    assert body["messages"][5] == {"role": "assistant", "content": ""}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["max_completion_tokens"] == 100


def test_round_trip_of_a_response_through_to_wire_keeps_ids_names_and_arguments() -> None:
    turn = turn_of(completion({"tool_calls": [call("c9", "add", '{"a": 2}')]}, "tool_calls"))
    message = AssistantMessage(content=turn.text, tool_calls=turn.tool_calls)
    wire = openai_chat.build_message(message)
    assert wire["tool_calls"][0]["id"] == "c9"
    assert json.loads(wire["tool_calls"][0]["function"]["arguments"]) == {"a": 2}


@pytest.mark.parametrize("tool_choice", [None, "auto", "required", "none", "add"])
def test_every_request_shape_matches_openais_published_schema(tool_choice: str | None) -> None:
    from tests.openapi_schemas import assert_valid

    calls = [
        ToolCall(id="c1", name="add", arguments={"a": 1}),
        ToolCall(id="c2", name="add", raw_arguments="{oops", arguments_error="not JSON"),
    ]
    messages = [
        SystemMessage(content="sys"),
        UserMessage(content="hi"),
        AssistantMessage(content="Let me add.", tool_calls=calls),
        ToolMessage(tool_call_id="c1", name="add", content="1"),
        ToolMessage(tool_call_id="c2", name="add", content="Error: bad", is_error=True),
        AssistantMessage(content=None),
        UserMessage(content="again"),
    ]
    for tools in ([], [SPEC, ToolSpec(name="bare")]):
        request = ModelRequest(
            model="gpt-4.1-mini",
            messages=messages,
            tools=tools,
            tool_choice=tool_choice,
            max_output_tokens=64,
        )
        assert_valid(openai_chat.to_wire(request), "CreateChatCompletionRequest")
