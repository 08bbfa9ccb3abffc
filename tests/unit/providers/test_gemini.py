"""Gemini generateContent, streams, errors and function declarations, from the Gemini API reference."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.model import ProviderError, Turn
from orchestrator.providers import gemini
from orchestrator.providers.common import IdSource
from workers.contract import ToolSpec


def response(parts: list[dict[str, Any]], finish: str | None = "STOP", **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-2.5-flash",
        **extra,
    }


def turn_of(body: object, ids: IdSource | None = None) -> Turn:
    result = gemini.from_wire(body, ids=ids)
    assert isinstance(result, Turn), result
    return result


def test_text_answer() -> None:
    turn = turn_of(response([{"text": "Hello "}, {"text": "world"}]))
    assert (turn.type, turn.text, turn.thinking, turn.finish_reason) == (
        "final_answer",
        "Hello world",
        None,
        "stop",
    )
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.total_tokens) == (10, 5, 15)
    assert turn.model == "gemini-2.5-flash"
    assert turn.provider == "gemini"


def test_thought_parts_are_thinking_joined_by_a_blank_line_never_text() -> None:
    turn = turn_of(
        response(
            [{"text": "step one", "thought": True}, {"text": "step two", "thought": True}, {"text": "42"}]
        )
    )
    assert turn.text == "42"
    assert turn.thinking == "step one\n\nstep two"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("IMAGE_SAFETY", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "unknown"),
        ("OTHER", "unknown"),
        ("FINISH_REASON_UNSPECIFIED", "unknown"),
    ],
)
def test_every_finish_reason(raw: str, expected: str) -> None:
    assert turn_of(response([{"text": "x"}], finish=raw)).finish_reason == expected


def test_safety_block_with_no_content() -> None:
    body = {"candidates": [{"finishReason": "SAFETY", "index": 0, "safetyRatings": []}]}
    turn = turn_of(body)
    assert (turn.type, turn.text, turn.finish_reason) == ("final_answer", None, "content_filter")


def test_blocked_prompt_has_no_candidates() -> None:
    body = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 7}}
    turn = turn_of(body)
    assert (turn.type, turn.text, turn.finish_reason) == ("final_answer", None, "content_filter")
    assert turn.provider_data["block_reason"] == "SAFETY"
    assert (turn.usage.input_tokens, turn.usage.total_tokens) == (7, 7)


def test_function_calls_get_unique_synthetic_ids_and_keep_their_signature() -> None:
    ids = IdSource()
    parts = [
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
    ]
    first = turn_of(response(parts), ids)
    second = turn_of(response(parts), ids)
    all_ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert all(all_ids) and len(set(all_ids)) == 4
    assert first.type == "tool_calls" and first.finish_reason == "stop"
    assert first.provider_data["thought_signatures"] == {first.tool_calls[0].id: "c2ln"}
    assert first.provider_data["parts"][0]["thoughtSignature"] == "c2ln"


def test_function_call_id_given_by_vertex_is_kept() -> None:
    turn = turn_of(response([{"functionCall": {"id": "fc-1", "name": "f", "args": {}}}]))
    assert turn.tool_calls[0].id == "fc-1"


@pytest.mark.parametrize("args", [None, {}])
def test_absent_or_empty_args_are_an_empty_dict(args: object) -> None:
    call: dict[str, Any] = {"name": "ping"}
    if args is not None:
        call["args"] = args
    turn = turn_of(response([{"functionCall": call}]))
    assert turn.tool_calls[0].arguments == {}
    assert turn.tool_calls[0].arguments_error is None


def test_leaked_special_token_in_name_is_cut() -> None:
    turn = turn_of(response([{"functionCall": {"name": "search<|channel|>commentary", "args": {"q": "x"}}}]))
    assert turn.tool_calls[0].name == "search"


def test_usage_keeps_thoughts_and_cache_counts() -> None:
    body = response([{"text": "hi"}])
    body["usageMetadata"].update(
        {"thoughtsTokenCount": 30, "cachedContentTokenCount": 4, "totalTokenCount": 45}
    )
    usage = turn_of(body).usage
    assert (usage.output_tokens, usage.reasoning_tokens, usage.cache_read_tokens, usage.total_tokens) == (
        5,
        30,
        4,
        45,
    )


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        "text",
        {"candidates": "nope"},
        {"candidates": [{"content": {"parts": [{"text": 5}]}}]},
        {"candidates": [{"content": {"parts": ["just a string"]}}]},
        {"candidates": [{"content": {"parts": [{"functionCall": "f"}]}}]},
        {"candidates": [{"content": {"parts": [{"text": "x", "thought": "yes"}]}}]},
        {"candidates": [{"finishReason": 3}]},
    ],
)
def test_malformed_bodies_are_invalid_response(body: object) -> None:
    result = gemini.from_wire(body)
    assert isinstance(result, ProviderError)
    assert (result.type, result.retryable, result.provider) == ("invalid_response", False, "gemini")


def test_error_body_maps_status_type_and_retry_delay() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"}],
        }
    }
    error = gemini.from_wire(body)
    assert isinstance(error, ProviderError)
    assert (error.status, error.type, error.retryable, error.retry_after_s) == (
        429,
        "RESOURCE_EXHAUSTED",
        True,
        26.0,
    )
    bad = gemini.error_from_wire(
        400, {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}
    )
    assert (bad.status, bad.type, bad.retryable) == (400, "INVALID_ARGUMENT", False)


def sse(chunks: list[dict[str, Any]], newline: str = "\n") -> str:
    return "".join(f"data: {json.dumps(c)}{newline}{newline}" for c in chunks)


STREAM = [
    response([{"text": "Let me ", "thought": True}], finish=None),
    response([{"text": "think.", "thought": True}], finish=None),
    response([{"text": "The answer"}], finish=None),
    response([{"text": " is 4."}], finish="STOP"),
]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_stream_fragments_merge_into_one_text_and_one_thought(newline: str) -> None:
    turn = gemini.from_stream(sse(STREAM, newline))
    assert isinstance(turn, Turn), turn
    assert (turn.text, turn.thinking, turn.finish_reason) == ("The answer is 4.", "Let me think.", "stop")


def test_stream_as_json_array() -> None:
    turn = gemini.from_chunks(list(STREAM))
    assert isinstance(turn, Turn) and turn.text == "The answer is 4."


def test_stream_cut_before_its_last_chunk_is_a_retryable_error() -> None:
    result = gemini.from_stream(sse(STREAM[:2]))
    assert isinstance(result, ProviderError) and result.retryable


def test_stream_with_an_error_event() -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    result = gemini.from_stream(sse([STREAM[0], error]))
    assert isinstance(result, ProviderError)
    assert (result.status, result.type, result.retryable) == (503, "UNAVAILABLE", True)


class Address(BaseModel):
    street: str
    zip_code: str | None = None


class Order(BaseModel):
    address: Address
    kind: str = "standard"
    count: int
    when: str


def test_tool_param_is_cleaned_of_what_gemini_rejects() -> None:
    schema = Order.model_json_schema()
    schema["additionalProperties"] = False
    schema["properties"]["kind"]["const"] = "standard"
    schema["properties"]["when"]["format"] = "uri"
    declaration = gemini.build_tool_param(
        ToolSpec(name="order", description="Place an order.", parameters=schema)
    )
    text = json.dumps(declaration)
    for rejected in ("$ref", "$defs", "additionalProperties", "const", "title", '"uri"'):
        assert rejected not in text, rejected
    params = declaration["parameters"]
    assert declaration["name"] == "order" and declaration["description"] == "Place an order."
    assert params["properties"]["address"]["properties"]["street"] == {"type": "string"}
    assert params["properties"]["address"]["properties"]["zip_code"]["nullable"] is True
    assert params["properties"]["kind"]["enum"] == ["standard"]
    assert "format: uri" in params["properties"]["when"]["description"].lower()
    assert params["required"] == ["address", "count", "when"]


def test_tool_param_without_arguments_has_no_parameters() -> None:
    declaration = gemini.build_tool_param(ToolSpec(name="now", description="Current time."))
    assert declaration == {"name": "now", "description": "Current time."}


def test_recursive_ref_becomes_an_untyped_object() -> None:
    schema = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
    }
    params = gemini.build_tool_param(ToolSpec(name="tree", parameters=schema))["parameters"]
    assert params["properties"]["root"]["properties"]["child"]["type"] == "object"
    assert "$ref" not in json.dumps(params)


def test_number_enum_keeps_its_type() -> None:
    schema = {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}}}
    level = gemini.build_tool_param(ToolSpec(name="set", parameters=schema))["parameters"]["properties"][
        "level"
    ]
    assert level["type"] == "integer" and "enum" not in level and "1, 2, 3" in level["description"]


def test_a_json_array_body_is_a_stream_read_whole() -> None:
    turn = gemini.from_wire(list(STREAM))
    assert isinstance(turn, Turn) and (turn.text, turn.thinking) == ("The answer is 4.", "Let me think.")
