"""Model controls on the OpenAI wires: instructions, every setting, an output schema and the
structured answer, for Chat Completions and the Responses API; each body checked against OpenAI's schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import ModelSettings, SystemMessage, Turn, UserMessage
from orchestrator.providers import openai_chat, openai_responses
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.structured import build_json_schema_format, is_strict_schema
from tests.openapi_schemas import assert_valid
from workers.contract import ToolSpec

TOOL = ToolSpec(
    name="add", description="Add.", parameters={"type": "object", "properties": {"a": {"type": "number"}}}
)
LOOSE_SCHEMA: dict[str, Any] = {
    "title": "City",
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name"],
}
STRICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"label": {"type": "string"}},
                "required": ["label"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}
EVERY_CHAT_SETTING = ModelSettings(
    temperature=0.2,
    top_p=0.9,
    max_output_tokens=300,
    stop=["END", "STOP"],
    seed=7,
    reasoning_effort="low",
    parallel_tool_calls=False,
)


def request(**fields: Any) -> ModelRequest:
    base: dict[str, Any] = {"model": "gpt-4.1-mini", "messages": [UserMessage(content="hi")]}
    return ModelRequest(**{**base, **fields})


# --- Chat Completions ------------------------------------------------------------------------------------


def test_chat_sends_instructions_first_as_a_system_message_before_the_historys_own() -> None:
    body = openai_chat.to_wire(
        request(instructions="Be terse.", messages=[SystemMessage(content="old"), UserMessage(content="hi")])
    )
    assert body["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "system", "content": "old"},
        {"role": "user", "content": "hi"},
    ]
    assert_valid(body, "CreateChatCompletionRequest")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_maps_every_setting_and_the_body_is_valid(stream: bool) -> None:
    body = openai_chat.to_wire(request(settings=EVERY_CHAT_SETTING, tools=[TOOL]), stream=stream)
    assert {k: body[k] for k in EXPECTED_CHAT} == EXPECTED_CHAT
    assert "max_tokens" not in body
    assert_valid(body, "CreateChatCompletionRequest")


EXPECTED_CHAT = {
    "temperature": 0.2,
    "top_p": 0.9,
    "max_completion_tokens": 300,
    "stop": ["END", "STOP"],
    "seed": 7,
    "reasoning_effort": "low",
    "parallel_tool_calls": False,
}


def test_chat_sends_no_setting_that_was_not_set_and_parallel_tool_calls_only_with_tools() -> None:
    plain = openai_chat.to_wire(request())
    assert set(plain) == {"model", "messages"}
    no_tools = openai_chat.to_wire(request(settings=ModelSettings(parallel_tool_calls=True, temperature=0)))
    assert "parallel_tool_calls" not in no_tools and no_tools["temperature"] == 0
    assert_valid(no_tools, "CreateChatCompletionRequest")


def test_the_settings_max_output_tokens_wins_over_the_requests_own() -> None:
    assert openai_chat.to_wire(request(max_output_tokens=50))["max_completion_tokens"] == 50
    both = request(max_output_tokens=50, settings=ModelSettings(max_output_tokens=500))
    assert openai_chat.to_wire(both)["max_completion_tokens"] == 500
    assert openai_responses.to_wire(both)["max_output_tokens"] == 500


def test_extra_is_merged_last_and_replaces_what_toolloop_built() -> None:
    settings = ModelSettings(
        temperature=0.5, extra={"top_k": 40, "temperature": 0.1, "repetition_penalty": 1.1}
    )
    body = openai_chat.to_wire(request(settings=settings))
    assert (body["top_k"], body["temperature"], body["repetition_penalty"]) == (40, 0.1, 1.1)
    responses = openai_responses.to_wire(request(settings=ModelSettings(extra={"truncation": "auto"})))
    assert responses["truncation"] == "auto"
    assert_valid(responses, "CreateResponse")


def test_chat_output_schema_is_a_response_format_strict_only_when_already_strict_and_read_as_json() -> None:
    loose = openai_chat.to_wire(request(output_schema=LOOSE_SCHEMA, tools=[TOOL]))
    assert loose["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "City", "schema": LOOSE_SCHEMA, "strict": False},
    }
    assert loose["tools"][0]["function"]["name"] == "add"
    strict = openai_chat.to_wire(request(output_schema=STRICT_SCHEMA))
    assert strict["response_format"]["json_schema"] == {
        "name": "output",
        "schema": STRICT_SCHEMA,
        "strict": True,
    }
    for body in (loose, strict):
        assert_valid(body, "CreateChatCompletionRequest")
    answer = {"name": "Lyon", "population": 500000}
    response: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": json.dumps(answer), "refusal": None},
            }
        ],
    }
    turn = openai_chat.from_wire(response)
    assert isinstance(turn, Turn) and turn.type == "final_answer"
    assert json.loads(turn.text or "") == answer
    response["choices"][0]["message"] = {"role": "assistant", "content": None, "refusal": "I can't."}
    refused = openai_chat.from_wire(response)
    assert isinstance(refused, Turn) and refused.text == "I can't."


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        (STRICT_SCHEMA, True),
        (LOOSE_SCHEMA, False),
        ({**STRICT_SCHEMA, "additionalProperties": True}, False),
        ({"type": "array", "items": {"type": "string"}}, False),
        ({**STRICT_SCHEMA, "allOf": [{"type": "object"}]}, False),
        (
            {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}},
                "required": ["p"],
                "additionalProperties": False,
                "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            },
            False,
        ),
    ],
)
def test_strict_mode_is_asked_only_of_a_schema_that_already_meets_it(
    schema: dict[str, Any], strict: bool
) -> None:
    assert is_strict_schema(schema) is strict
    assert build_json_schema_format(schema)["strict"] is strict


def test_chat_usage_reads_cached_and_cache_written_prompt_tokens() -> None:
    body = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "total_tokens": 105,
            "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 30},
        },
    }
    turn = openai_chat.from_wire(body)
    assert isinstance(turn, Turn)
    assert (turn.usage.cache_read_tokens, turn.usage.cache_write_tokens) == (60, 30)


# --- Responses API ---------------------------------------------------------------------------------------


def test_responses_sends_instructions_in_their_own_field_and_keeps_history_system_messages() -> None:
    body = openai_responses.to_wire(
        request(instructions="Be terse.", messages=[SystemMessage(content="old"), UserMessage(content="hi")])
    )
    assert body["instructions"] == "Be terse."
    assert body["input"][0] == {"type": "message", "role": "system", "content": "old"}
    assert "Be terse." not in json.dumps(body["input"])
    assert_valid(body, "CreateResponse")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_maps_every_setting_it_has_and_the_body_is_valid(stream: bool) -> None:
    settings = ModelSettings(
        temperature=0.2, top_p=0.9, max_output_tokens=300, reasoning_effort="high", parallel_tool_calls=True
    )
    body = openai_responses.to_wire(request(settings=settings, tools=[TOOL]), stream=stream)
    assert {k: body[k] for k in ("temperature", "top_p", "max_output_tokens", "parallel_tool_calls")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 300,
        "parallel_tool_calls": True,
    }
    assert body["reasoning"] == {"effort": "high"}
    assert "stop" not in body and "seed" not in body
    assert_valid(body, "CreateResponse")
    no_tools = openai_responses.to_wire(request(settings=settings))
    assert "parallel_tool_calls" not in no_tools


def test_responses_output_schema_is_a_text_format_and_the_answer_carries_its_json() -> None:
    body = openai_responses.to_wire(request(output_schema=STRICT_SCHEMA, tools=[TOOL]))
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "output", "schema": STRICT_SCHEMA, "strict": True}
    }
    assert_valid(body, "CreateResponse")
    answer = {"name": "Lyon", "tags": [{"label": "city"}]}
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-5",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": json.dumps(answer), "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 40,
            "output_tokens": 9,
            "total_tokens": 49,
            "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        },
    }
    turn = openai_responses.from_wire(response)
    assert isinstance(turn, Turn) and turn.type == "final_answer"
    assert json.loads(turn.text or "") == answer
    assert (turn.usage.cache_read_tokens, turn.usage.cache_write_tokens) == (32, 0)
