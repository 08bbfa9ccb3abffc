"""The Responses API both ways: cases written from the API reference."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import AssistantMessage, ProviderError, ToolCall, ToolMessage, Turn, UserMessage
from orchestrator.providers import openai_responses
from orchestrator.providers.base import ModelRequest
from workers.contract import ToolSpec

REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "first"}, {"type": "summary_text", "text": "second"}],
    "encrypted_content": "gAAAA-opaque",
}


def response(*output: dict[str, Any], status: str = "completed", **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "model": "gpt-5",
        "output": list(output),
        "usage": {
            "input_tokens": 10,
            "output_tokens": 20,
            "total_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 12},
            "input_tokens_details": {"cached_tokens": 2},
        },
        **extra,
    }


def message(*parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": list(parts),
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def turn_of(body: object) -> Turn:
    result = openai_responses.from_wire(body)
    assert isinstance(result, Turn), result
    return result


def test_items_text_refusal_reasoning_and_calls() -> None:
    turn = turn_of(
        response(
            REASONING,
            message({"type": "output_text", "text": "Let me check.", "annotations": []}),
            function_call("call_a", "add", '{"a": 1}'),
            function_call("call_b", "add", "null"),
        )
    )
    assert (turn.type, turn.text, turn.thinking) == ("tool_calls", "Let me check.", "first\n\nsecond")
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [("call_a", {"a": 1}), ("call_b", {})]
    assert "gAAAA-opaque" not in (turn.thinking or "")
    assert turn.provider_data == {"response_id": "resp_1", "reasoning_items": [REASONING]}
    assert (turn.usage.reasoning_tokens, turn.usage.cache_read_tokens, turn.usage.total_tokens) == (12, 2, 30)
    assert turn.finish_reason == "stop"


def test_refusal_part_is_the_text() -> None:
    turn = turn_of(response(message({"type": "refusal", "refusal": "No."})))
    assert (turn.type, turn.text) == ("final_answer", "No.")


@pytest.mark.parametrize(
    ("reason", "expected"), [("max_output_tokens", "length"), ("content_filter", "content_filter")]
)
def test_incomplete_details_give_the_finish_reason(reason: str, expected: str) -> None:
    turn = turn_of(response(message(), status="incomplete", incomplete_details={"reason": reason}))
    assert turn.finish_reason == expected


def test_failed_response_is_a_provider_error() -> None:
    failed = openai_responses.from_wire(
        response(status="failed", error={"code": "server_error", "message": "The model crashed."})
    )
    assert isinstance(failed, ProviderError)
    assert (failed.code, failed.message, failed.retryable) == ("server_error", "The model crashed.", True)


@pytest.mark.parametrize(
    "body",
    [
        None,
        3,
        {"output": "x"},
        {"output": [1]},
        {"output": [{"type": "message", "content": [{"type": "output_text", "text": 5}]}]},
    ],
)
def test_malformed_bodies_are_provider_errors(body: object) -> None:
    assert isinstance(openai_responses.from_wire(body), ProviderError)


def sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


def test_stream_accumulates_items_when_the_terminal_event_omits_output() -> None:
    text = sse(
        {
            "type": "response.created",
            "response": {"id": "resp_9", "model": "gpt-5", "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "reasoning", "id": "rs_9", "summary": []},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "output_index": 0,
            "summary_index": 0,
            "delta": "thin",
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "output_index": 0,
            "summary_index": 0,
            "delta": "king",
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "message", "role": "assistant", "content": []},
        },
        {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "Hel"},
        {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "lo"},
        {"type": "response.output_item.added", "output_index": 2, "item": function_call("call_z", "add", "")},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '{"a"'},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": ": 2}"},
        {
            "type": "response.completed",
            "response": {
                "id": "resp_9",
                "model": "gpt-5",
                "status": "completed",
                "output": [],
                "usage": {"input_tokens": 1, "output_tokens": 2},
            },
        },
    )
    turn = openai_responses.from_stream(text)
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking, turn.model) == ("Hello", "thinking", "gpt-5")
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("call_z", "add", {"a": 2})]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (1, 2)


def test_stream_cut_before_its_terminal_event_and_error_events() -> None:
    cut = openai_responses.from_stream(
        sse({"type": "response.created", "response": {"id": "r", "output": []}})
    )
    assert isinstance(cut, ProviderError) and cut.retryable
    error = openai_responses.from_stream(
        sse({"type": "error", "code": "rate_limit_exceeded", "message": "slow down"})
    )
    assert isinstance(error, ProviderError)
    assert (error.code, error.message, error.retryable) == ("rate_limit_exceeded", "slow down", True)
    failed = openai_responses.from_stream(
        sse(
            {
                "type": "response.failed",
                "response": {"status": "failed", "error": {"code": "server_error", "message": "x"}},
            }
        )
    )
    assert isinstance(failed, ProviderError)


SPEC = ToolSpec(
    name="add", description="Add.", parameters={"type": "object", "properties": {"a": {"type": "number"}}}
)


def history(provider: str) -> list[Any]:
    call = ToolCall(id="call_a", name="add", arguments={"a": 1})
    return [
        UserMessage(content="add one"),
        AssistantMessage(
            content="On it.",
            thinking="first",
            tool_calls=[call],
            provider=provider,
            provider_data={"response_id": "resp_1", "reasoning_items": [REASONING]},
        ),
        ToolMessage(tool_call_id="call_a", name="add", content="1"),
    ]


def test_to_wire_pairs_function_calls_with_outputs_and_resends_reasoning_to_the_same_provider() -> None:
    body = openai_responses.to_wire(
        ModelRequest(model="gpt-5", messages=history("openai_responses"), tools=[SPEC])
    )
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "add one"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": REASONING["summary"],
            "encrypted_content": "gAAAA-opaque",
        },
        {"type": "message", "role": "assistant", "content": "On it."},
        {"type": "function_call", "call_id": "call_a", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "1"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "add",
            "description": "Add.",
            "parameters": SPEC.parameters,
            "strict": False,
        }
    ]
    assert "previous_response_id" not in body


def test_to_wire_never_sends_another_providers_reasoning_or_thinking() -> None:
    body = openai_responses.to_wire(
        ModelRequest(model="gpt-5", messages=history("anthropic"), tool_choice="add")
    )
    assert all(item["type"] != "reasoning" for item in body["input"])
    assert "first" not in json.dumps(body["input"])
    assert "tools" not in body and "tool_choice" not in body  # no tools offered: no choice either


def test_to_wire_tool_choice_and_max_output_tokens() -> None:
    request = ModelRequest(
        model="m", messages=[UserMessage(content="x")], tools=[SPEC], tool_choice="add", max_output_tokens=50
    )
    body = openai_responses.to_wire(request)
    assert body["tool_choice"] == {"type": "function", "name": "add"}
    assert body["max_output_tokens"] == 50


@pytest.mark.parametrize("tool_choice", [None, "auto", "required", "none", "add"])
def test_every_request_shape_matches_openais_published_schema(tool_choice: str | None) -> None:
    from orchestrator.model import SystemMessage
    from tests.openapi_schemas import assert_valid

    broken = ToolCall(id="call_b", name="add", raw_arguments="{oops", arguments_error="not JSON")
    messages = [
        SystemMessage(content="sys"),
        *history("openai_responses"),
        AssistantMessage(
            tool_calls=[broken],
            provider="openai_responses",
            provider_data={"reasoning_items": [{"type": "reasoning", "id": "rs_2", "summary": []}]},
        ),
        ToolMessage(tool_call_id="call_b", name="add", content="Error: bad", is_error=True),
        AssistantMessage(content="done"),
        UserMessage(content="again"),
    ]
    for tools in ([], [SPEC, ToolSpec(name="bare")]):
        request = ModelRequest(
            model="gpt-5", messages=messages, tools=tools, tool_choice=tool_choice, max_output_tokens=64
        )
        assert_valid(openai_responses.to_wire(request), "CreateResponse")


@pytest.mark.parametrize("index", [10**9, -1, "x"])
def test_stream_part_indexes_out_of_range_or_odd_are_errors_not_crashes(index: object) -> None:
    text = sse(
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "message", "content": "oops"},
        },
        {"type": "response.output_text.delta", "output_index": 1, "content_index": index, "delta": "x"},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "x"},
        {"type": "response.completed", "response": {"status": "completed", "output": []}},
    )
    assert isinstance(openai_responses.from_stream(text), ProviderError)
