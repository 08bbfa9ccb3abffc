"""Cohere v2 Chat requests (`cohere.to_wire`, `build_url`), errors and rate-limit headers. Every built body is
checked against the request's JSON Schema, written from Cohere's API reference
(tests/fixtures/cohere_chat_request_schema.json)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from orchestrator.model import (
    AssistantMessage,
    Message,
    ModelSettings,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    UserMessage,
)
from orchestrator.providers import cohere
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.controls import refuse_controls
from orchestrator.providers.rate_limits import RateLimitSignal
from orchestrator.providers.structured import ANSWER_TOOL
from tests.unit.providers.conftest import RESPONSES_DIR
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(60)

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "fixtures" / "cohere_chat_request_schema.json"
MODEL = "command-a-03-2025"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
CLOCK = ToolSpec(name="current_time")
ANSWER_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}


@cache
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text("utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def body_of(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The body `to_wire` builds, after checking it against the reference's schema."""
    body = cohere.to_wire(request, stream=stream)
    validator().validate(body)
    return body


def request(messages: list[Message] | None = None, **fields: Any) -> ModelRequest:
    return ModelRequest(model=MODEL, messages=messages or [UserMessage(content="Hi")], **fields)


def test_the_schema_refuses_what_cohere_refuses() -> None:
    good = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    validator().validate(good)
    bad = [
        {**good, "tool_choice": "AUTO"},
        {**good, "temperature": 1.5},
        {**good, "top_p": 0.5},
        {**good, "messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late"}]},
        {**good, "response_format": {"type": "json_object"}, "tools": [cohere_tool("t")]},
        {**good, "tool_choice": "REQUIRED"},
        {**good, "tools": [cohere_tool("bad-name")]},
        {**good, "stop_sequences": ["a", "b", "c", "d", "e", "f"]},
    ]
    for body in bad:
        assert not validator().is_valid(body), body


def cohere_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_url_is_the_chat_endpoint_streamed_or_not() -> None:
    base = "https://api.cohere.com"
    assert cohere.build_url(base, MODEL, stream=False) == f"{base}/v2/chat"
    assert cohere.build_url(base, "a/b model", stream=True) == f"{base}/v2/chat"


def test_plain_and_streamed_bodies() -> None:
    plain = body_of(request())
    assert plain == {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert body_of(request(), stream=True) == {**plain, "stream": True}


def test_instructions_and_system_messages_make_one_first_system_message() -> None:
    messages: list[Message] = [
        SystemMessage(content="Be brief."),
        UserMessage(content="Hi"),
        SystemMessage(content="Answer in French."),
        UserMessage(content=""),
    ]
    body = body_of(request(messages, instructions="You are toolloop."))
    assert body["messages"] == [
        {"role": "system", "content": "You are toolloop.\n\nBe brief.\n\nAnswer in French."},
        {"role": "user", "content": "Hi"},
    ]


def recorded_turn() -> Turn:
    turn = cohere.from_wire(
        json.loads((RESPONSES_DIR / "cohere_v2__tool_plan_and_null_arguments.json").read_text())
    )
    assert isinstance(turn, Turn)
    return turn


def as_message(turn: Turn) -> AssistantMessage:
    return AssistantMessage(
        content=turn.text,
        thinking=turn.thinking,
        tool_calls=turn.tool_calls,
        provider=turn.provider,
        provider_data=turn.provider_data,
    )


def test_recorded_answer_goes_back_with_its_tool_plan_and_one_tool_message_per_result() -> None:
    turn = recorded_turn()
    messages: list[Message] = [
        UserMessage(content="What time is it?"),
        as_message(turn),
        ToolMessage(tool_call_id="currentTime_tf4dywn8wgnk", name="currentTime", content='{"time": "12:00"}'),
    ]
    body = body_of(request(messages, tools=[CLOCK]))
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "tool_plan": "I will use the currentTime tool to find the current time.",
            "tool_calls": [
                {
                    "id": "currentTime_tf4dywn8wgnk",
                    "type": "function",
                    "function": {"name": "currentTime", "arguments": "{}"},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "currentTime_tf4dywn8wgnk",
            "content": [{"type": "text", "text": '{"time": "12:00"}'}],
        },
    ]


def test_parallel_calls_are_one_assistant_message_and_a_tool_message_each() -> None:
    calls = [ToolCall(id="a", name="search", arguments={"q": "x"}), ToolCall(id="b", name="search")]
    messages: list[Message] = [
        UserMessage(content="Go"),
        AssistantMessage(tool_calls=calls, provider="cohere"),
        ToolMessage(tool_call_id="a", name="search", content="one"),
        ToolMessage(tool_call_id="b", name="search", content="two", is_error=True),
    ]
    wire = body_of(request(messages, tools=[SEARCH]))["messages"]
    assert [c["function"]["arguments"] for c in wire[1]["tool_calls"]] == ['{"q": "x"}', "{}"]
    assert [(m["tool_call_id"], m["content"][0]["text"]) for m in wire[2:]] == [("a", "one"), ("b", "two")]


def test_tool_plan_then_text_go_back_apart() -> None:
    message = AssistantMessage(
        content="I will look.\n\nHere it is.",
        provider="cohere",
        provider_data={"tool_plan": "I will look."},
    )
    wire = body_of(request([UserMessage(content="Go"), message]))["messages"][1]
    assert wire == {"role": "assistant", "tool_plan": "I will look.", "content": "Here it is."}


def test_a_plan_the_text_no_longer_starts_with_is_not_sent() -> None:
    message = AssistantMessage(
        content="Edited.", provider="cohere", provider_data={"tool_plan": "I will look."}
    )
    wire = body_of(request([UserMessage(content="Go"), message]))["messages"][1]
    assert wire == {"role": "assistant", "content": "Edited."}


def test_cohere_thinking_goes_back_as_a_thinking_block() -> None:
    answered = AssistantMessage(content="Three.", thinking="Count them.", provider="cohere")
    calling = AssistantMessage(
        thinking="Need the weather.",
        tool_calls=[ToolCall(id="w1", name="search", arguments={"q": "Toronto"})],
        provider="cohere",
    )
    messages: list[Message] = [
        UserMessage(content="How many?"),
        answered,
        UserMessage(content="Weather?"),
        calling,
        ToolMessage(tool_call_id="w1", name="search", content="20C"),
    ]
    wire = body_of(request(messages, tools=[SEARCH]))["messages"]
    assert wire[1]["content"] == [
        {"type": "thinking", "thinking": "Count them."},
        {"type": "text", "text": "Three."},
    ]
    assert wire[3]["content"] == [{"type": "thinking", "thinking": "Need the weather."}]
    assert wire[3]["tool_calls"][0]["id"] == "w1"


def test_another_providers_thinking_and_plan_are_never_sent() -> None:
    message = AssistantMessage(
        content="Let me search.",
        thinking="secret reasoning",
        tool_calls=[ToolCall(id="c1", name="search", arguments={"q": "x"})],
        provider="anthropic",
        provider_data={"tool_plan": "Let me search."},
    )
    wire = body_of(request([UserMessage(content="Go"), message], tools=[SEARCH]))["messages"][1]
    assert wire["content"] == "Let me search."
    assert "tool_plan" not in wire and "secret" not in json.dumps(wire)


def test_an_empty_assistant_turn_is_left_out() -> None:
    messages: list[Message] = [
        UserMessage(content="Hi"),
        AssistantMessage(provider="cohere"),
        UserMessage(content="?"),
    ]
    assert [m["role"] for m in body_of(request(messages))["messages"]] == ["user", "user"]


def test_broken_arguments_go_back_verbatim() -> None:
    call = ToolCall(id="x", name="search", raw_arguments='{"q": ', arguments_error="not valid JSON")
    messages: list[Message] = [
        UserMessage(content="Go"),
        AssistantMessage(tool_calls=[call], provider="cohere"),
    ]
    wire = body_of(request(messages, tools=[SEARCH]))["messages"][1]
    assert wire["tool_calls"][0]["function"]["arguments"] == '{"q": '


def test_tools_are_functions_with_an_object_schema() -> None:
    body = body_of(request(tools=[SEARCH, ToolSpec(name="bare", parameters={})]))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": dict(SEARCH.parameters),
                "description": "Search the web.",
            },
        },
        {"type": "function", "function": {"name": "bare", "parameters": {"type": "object"}}},
    ]
    assert "tool_choice" not in body


@pytest.mark.parametrize(
    ("choice", "expected"), [(None, None), ("auto", None), ("required", "REQUIRED"), ("none", "NONE")]
)
def test_tool_choice(choice: str | None, expected: str | None) -> None:
    body = body_of(request(tools=[SEARCH, CLOCK], tool_choice=choice))
    assert body.get("tool_choice") == expected
    assert [t["function"]["name"] for t in body["tools"]] == ["search", "current_time"]


def test_a_named_tool_is_forced_by_offering_it_alone() -> None:
    body = body_of(request(tools=[SEARCH, CLOCK], tool_choice="current_time"))
    assert ([t["function"]["name"] for t in body["tools"]], body["tool_choice"]) == (
        ["current_time"],
        "REQUIRED",
    )
    unknown = body_of(request(tools=[SEARCH, CLOCK], tool_choice="missing"))
    assert (len(unknown["tools"]), unknown["tool_choice"]) == (2, "REQUIRED")


def test_a_choice_without_tools_sends_neither() -> None:
    body = body_of(request(tool_choice="required"))
    assert "tools" not in body and "tool_choice" not in body


def test_output_schema_without_tools_is_the_json_response_format() -> None:
    body = body_of(request(output_schema=ANSWER_SCHEMA))
    assert body["response_format"] == {"type": "json_object", "json_schema": ANSWER_SCHEMA}
    assert "tools" not in body


def test_output_schema_beside_tools_is_the_answer_tool() -> None:
    body = body_of(request(tools=[SEARCH], output_schema=ANSWER_SCHEMA, tool_choice="required"))
    assert "response_format" not in body
    answer = body["tools"][-1]["function"]
    assert (answer["name"], answer["parameters"]) == (ANSWER_TOOL, ANSWER_SCHEMA)
    assert body["tool_choice"] == "REQUIRED"


def test_output_schema_with_tool_choice_none_drops_the_tools() -> None:
    body = body_of(request(tools=[SEARCH], output_schema=ANSWER_SCHEMA, tool_choice="none"))
    assert "tools" not in body and "tool_choice" not in body
    assert body["response_format"]["json_schema"] == ANSWER_SCHEMA


def test_settings_map_to_cohere_fields() -> None:
    settings = ModelSettings(temperature=0.2, top_p=0.9, max_output_tokens=512, stop=["END"], seed=7)
    body = body_of(request(settings=settings, max_output_tokens=100))
    assert {k: body[k] for k in ("temperature", "p", "max_tokens", "stop_sequences", "seed")} == {
        "temperature": 0.2,
        "p": 0.9,
        "max_tokens": 512,
        "stop_sequences": ["END"],
        "seed": 7,
    }
    assert body_of(request(max_output_tokens=100))["max_tokens"] == 100
    assert "thinking" not in body


@pytest.mark.parametrize(
    ("effort", "max_tokens", "budget"),
    [
        ("minimal", None, 1024),
        ("low", None, 2048),
        ("high", None, 16384),
        ("high", 4096, 3072),
        ("low", 600, 300),
    ],
)
def test_reasoning_effort_is_a_thinking_budget(effort: Any, max_tokens: int | None, budget: int) -> None:
    settings = ModelSettings(reasoning_effort=effort, max_output_tokens=max_tokens)
    body = body_of(request(settings=settings))
    assert body["thinking"] == {"type": "enabled", "token_budget": budget}


def test_extra_is_merged_last() -> None:
    settings = ModelSettings(temperature=0.5, extra={"temperature": 0.1, "safety_mode": "STRICT", "k": 40})
    body = body_of(request(settings=settings))
    assert (body["temperature"], body["safety_mode"], body["k"]) == (0.1, "STRICT", 40)


def test_what_the_profile_refuses() -> None:
    assert refuse_controls("cohere", ModelSettings(temperature=1.0, top_p=0.99, seed=0)) == []
    refused = refuse_controls("cohere", ModelSettings(temperature=1.5, top_p=1.0, seed=-1))
    assert [m.split()[0] for m in refused] == ["temperature", "top_p", "seed"]
    assert all("cohere" in m for m in refused)
    assert refuse_controls("cohere", ModelSettings(parallel_tool_calls=False, extra={"messages": []})) == [
        "parallel_tool_calls is not supported by cohere",
        "extra.messages is not allowed: toolloop builds 'messages' itself",
    ]


# --- errors and rate limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (404, False), (422, False), (429, True), (499, True)],
)
def test_error_statuses(status: int, retryable: bool) -> None:
    error = cohere.error_from_wire(status, {"id": "e1", "message": "nope"})
    assert (error.status, error.retryable, error.message, error.provider) == (
        status,
        retryable,
        "nope",
        "cohere",
    )


@pytest.mark.parametrize("status", [500, 501, 503, 504])
def test_server_errors_are_retryable(status: int) -> None:
    assert cohere.error_from_wire(status, {"message": "down"}).retryable


def test_a_429_keeps_its_retry_after() -> None:
    body = {
        "id": "e2",
        "message": "You are past the per minute request limit, please wait and try again later.",
    }
    error = cohere.error_from_wire(429, body, {"Retry-After": "7"})
    assert (error.retryable, error.retry_after_s, error.request_id) == (True, 7.0, "e2")


@pytest.mark.parametrize(
    ("message", "window", "prompt"),
    [
        (
            "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 4292. "
            "Try using a shorter prompt, or enabling prompt truncating.",
            4081,
            4292,
        ),
        (
            "too many tokens: size limit exceeded by 11326 tokens. Try using shorter or fewer inputs.",
            None,
            None,
        ),
        ("too many tokens: multi-hop prompt is too long even after truncation", None, None),
    ],
)
def test_an_over_long_prompt_is_a_context_overflow(
    message: str, window: int | None, prompt: int | None
) -> None:
    error = cohere.error_from_wire(400, {"id": "e3", "message": message})
    assert (error.code, error.retryable) == ("context_length_exceeded", False)
    details = error.details or {}
    assert (details.get("context_window_tokens"), details.get("prompt_tokens")) == (window, prompt)


def test_too_large_max_tokens_is_no_overflow() -> None:
    message = (
        "too many tokens: max tokens must be less than or equal to 4096, the maximum output for this model"
    )
    error = cohere.error_from_wire(400, {"message": message + " - received 8192."})
    assert error.code is None and not error.retryable


def test_an_error_body_as_a_response_is_the_error() -> None:
    result = cohere.from_wire({"type": "error", "message": "overloaded"})
    assert isinstance(result, ProviderError)


def test_rate_limit_headers() -> None:
    trial = cohere.parse_rate_limits(
        200,
        {
            "x-trial-endpoint-call-limit": "20",
            "x-trial-endpoint-call-remaining": "0",
            "x-endpoint-monthly-call-limit": "1000",
        },
        0.0,
    )
    assert (trial.refused, trial.requests_remaining, trial.requests_reset_s) == (False, 0, 60.0)
    refused = cohere.parse_rate_limits(429, {"retry-after": "3"}, 0.0)
    assert (refused.refused, refused.retry_after_s, refused.requests_remaining) == (True, 3.0, None)
    assert cohere.parse_rate_limits(200, {}, 0.0) == RateLimitSignal()
