"""Gemini requests: the body `to_wire` sends (checked against the documented request shape), the URLs, and
what a conversation's own parts and signatures look like when they go back."""

from __future__ import annotations

import json
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
from orchestrator.providers import gemini
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.controls import refuse_controls
from orchestrator.providers.gemini_request import CONTINUE_TEXT, SKIP_SIGNATURE
from orchestrator.providers.structured import ANSWER_TOOL
from tests.unit.providers.conftest import RESPONSES_DIR
from workers.contract import ToolSpec

SCHEMA = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "gemini_request_schema.json").read_text("utf-8")
)
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
NOW = ToolSpec(name="now", description="The time.")
ANSWER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def wire(messages: list[Message], **kwargs: Any) -> dict[str, Any]:
    """The body for a request of `messages`, checked against the documented request shape."""
    kwargs.setdefault("model", "gemini-2.5-flash")
    body = gemini.to_wire(ModelRequest(messages=messages, **kwargs))
    jsonschema.validate(body, SCHEMA)
    return body


def recorded_turn(name: str) -> Turn:
    turn = gemini.from_wire(json.loads((RESPONSES_DIR / name).read_text("utf-8")))
    assert isinstance(turn, Turn), turn
    return turn


def assistant_of(turn: Turn) -> AssistantMessage:
    """The assistant message the machine writes for a turn."""
    return AssistantMessage(
        content=turn.text,
        thinking=turn.thinking,
        tool_calls=turn.tool_calls,
        provider=turn.provider,
        model=turn.model,
        provider_data=turn.provider_data,
    )


def results_of(turn: Turn) -> list[Message]:
    return [
        ToolMessage(tool_call_id=c.id, name=c.name, content=f"result {i}")
        for i, c in enumerate(turn.tool_calls)
    ]


def test_a_plain_question() -> None:
    body = wire([UserMessage(content="Hi")], instructions="Be brief.")
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
    }


def test_the_body_is_the_same_streamed_or_not() -> None:
    request = ModelRequest(model="gemini-2.5-flash", messages=[UserMessage(content="Hi")])
    assert gemini.to_wire(request, stream=True) == gemini.to_wire(request)


def test_instructions_then_system_messages_make_the_system_instruction() -> None:
    body = wire(
        [
            SystemMessage(content="Use metric units."),
            UserMessage(content="Hi"),
            SystemMessage(content="Be kind."),
        ],
        instructions="You are a weather bot.",
    )
    text = body["systemInstruction"]["parts"][0]["text"]
    assert text == "You are a weather bot.\n\nUse metric units.\n\nBe kind."
    assert [c["role"] for c in body["contents"]] == ["user"]


@pytest.mark.parametrize(
    "name",
    [
        "gemini__parallel_function_calls_thought_signature.json",
        "gemini__thought_part_and_function_call_int_arg.json",
    ],
)
def test_own_parts_go_back_verbatim_with_their_signatures(name: str) -> None:
    raw = json.loads((RESPONSES_DIR / name).read_text("utf-8"))
    turn = recorded_turn(name)
    body = wire(
        [UserMessage(content="Go"), assistant_of(turn), *results_of(turn)], model="gemini-3-pro-preview"
    )
    user, model, results = body["contents"]
    assert user["role"] == "user" and model["role"] == "model" and results["role"] == "user"
    assert model["parts"] == raw["candidates"][0]["content"]["parts"]


def test_parallel_results_are_one_user_content_in_call_order() -> None:
    turn = recorded_turn("gemini__parallel_function_calls_thought_signature.json")
    body = wire(
        [UserMessage(content="Go"), assistant_of(turn), *results_of(turn), UserMessage(content="And?")]
    )
    results = body["contents"][2]
    assert results["parts"] == [
        {"functionResponse": {"name": "secret_retrieval_tool", "response": {"output": "result 0"}}},
        {"functionResponse": {"name": "secret_retrieval_tool", "response": {"output": "result 1"}}},
        {"text": "And?"},
    ]
    assert len(body["contents"]) == 3


def test_streamed_parts_go_back_with_the_signature_on_the_call() -> None:
    turn = gemini.from_stream(
        (RESPONSES_DIR / "gemini__stream_function_call_then_empty_text.sse").read_text()
    )
    assert isinstance(turn, Turn), turn
    body = wire(
        [UserMessage(content="Go"), assistant_of(turn), *results_of(turn)], model="gemini-3-pro-preview"
    )
    parts = body["contents"][1]["parts"]
    # The empty text fragment that closed the stream carries nothing: it is not sent.
    assert parts == [
        {
            "functionCall": {"name": "get_country", "args": {}},
            "thoughtSignature": turn.provider_data["parts"][0]["thoughtSignature"],
        }
    ]


def test_a_changed_message_is_rebuilt_keeping_each_calls_signature() -> None:
    turn = recorded_turn("gemini__thought_part_and_function_call_int_arg.json")
    message = assistant_of(turn).model_copy(update={"content": "Let me compute."})
    body = wire([UserMessage(content="Go"), message, *results_of(turn)])
    signature = turn.provider_data["thought_signatures"][turn.tool_calls[0].id]
    assert body["contents"][1]["parts"] == [
        {"text": "Let me compute."},
        {"functionCall": {"name": "compute_fib", "args": {"n": 100}}, "thoughtSignature": signature},
    ]


def test_edited_arguments_are_sent_as_the_message_says() -> None:
    turn = recorded_turn("gemini__thought_part_and_function_call_int_arg.json")
    edited = [turn.tool_calls[0].model_copy(update={"arguments": {"n": 7}})]
    body = wire([UserMessage(content="Go"), assistant_of(turn).model_copy(update={"tool_calls": edited})])
    call = next(p for p in body["contents"][1]["parts"] if "functionCall" in p)
    assert call["functionCall"]["args"] == {"n": 7} and call["thoughtSignature"]


def history_without_signatures(provider: str | None) -> list[Message]:
    calls = [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"}),
        ToolCall(id="call_2", name="now"),
    ]
    return [
        UserMessage(content="Go"),
        AssistantMessage(content=None, tool_calls=calls, provider=provider),
        ToolMessage(tool_call_id="call_1", name="get_weather", content="sunny"),
        ToolMessage(tool_call_id="call_2", name="now", content="noon"),
    ]


@pytest.mark.parametrize(("model", "signed"), [("gemini-3-pro-preview", True), ("gemini-2.5-flash", False)])
def test_calls_written_elsewhere_get_the_documented_signature_where_the_model_checks(
    model: str, signed: bool
) -> None:
    body = wire(history_without_signatures(None), model=model)
    first, second = body["contents"][1]["parts"]
    assert first.get("thoughtSignature") == (SKIP_SIGNATURE if signed else None)
    assert "thoughtSignature" not in second
    assert first["functionCall"] == {"name": "get_weather", "args": {"city": "Paris"}}


def test_ids_gemini_gave_come_back_on_the_call_and_its_result() -> None:
    body_in = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"id": "fc-1", "name": "now", "args": {}}}],
                },
                "finishReason": "STOP",
            }
        ]
    }
    turn = gemini.from_wire(body_in)
    assert isinstance(turn, Turn)
    body = wire([UserMessage(content="Go"), assistant_of(turn), *results_of(turn)], model="gemini-2.5-pro")
    assert body["contents"][1]["parts"] == [{"functionCall": {"id": "fc-1", "name": "now", "args": {}}}]
    assert body["contents"][2]["parts"][0]["functionResponse"]["id"] == "fc-1"


def test_synthetic_ids_never_reach_gemini() -> None:
    body = wire(history_without_signatures("gemini"))
    assert "call_1" not in json.dumps(body) and "call_2" not in json.dumps(body)


def test_a_failed_call_is_an_error_response() -> None:
    history = history_without_signatures(None)
    history[2] = ToolMessage(tool_call_id="call_1", name="get_weather", content="timed out", is_error=True)
    parts = wire(history)["contents"][2]["parts"]
    assert parts[0]["functionResponse"]["response"] == {"error": "timed out"}
    assert parts[1]["functionResponse"]["response"] == {"output": "noon"}


def test_a_conversation_ending_with_the_model_asks_it_to_go_on() -> None:
    body = wire(
        [UserMessage(content="Go"), AssistantMessage(content="Called a tool; it said 4.", provider="openai")]
    )
    assert body["contents"][-1] == {"role": "user", "parts": [{"text": CONTINUE_TEXT}]}


def test_empty_messages_send_no_empty_content() -> None:
    body = wire([UserMessage(content="Go"), AssistantMessage(content=""), UserMessage(content="Again")])
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Go"}, {"text": "Again"}]}]


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        (None, None),
        ("auto", {"mode": "AUTO"}),
        ("required", {"mode": "ANY"}),
        ("none", {"mode": "NONE"}),
        ("get_weather", {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}),
    ],
)
def test_tool_choice(choice: str | None, config: dict[str, Any] | None) -> None:
    body = wire([UserMessage(content="Go")], tools=[WEATHER, NOW], tool_choice=choice)
    assert [d["name"] for d in body["tools"][0]["functionDeclarations"]] == ["get_weather", "now"]
    assert body.get("toolConfig") == ({"functionCallingConfig": config} if config else None)


def test_settings_are_the_generation_config() -> None:
    settings = ModelSettings(temperature=0.2, top_p=0.9, max_output_tokens=300, stop=["END"], seed=7)
    body = wire([UserMessage(content="Go")], settings=settings, max_output_tokens=50)
    assert body["generationConfig"] == {
        "temperature": 0.2,
        "topP": 0.9,
        "maxOutputTokens": 300,
        "stopSequences": ["END"],
        "seed": 7,
    }
    assert wire([UserMessage(content="Go")], max_output_tokens=50)["generationConfig"] == {
        "maxOutputTokens": 50
    }


@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("gemini-2.5-flash", {"includeThoughts": True, "thinkingBudget": 2048}),
        ("models/gemini-2.5-pro", {"includeThoughts": True, "thinkingBudget": 2048}),
        ("gemini-3-pro-preview", {"includeThoughts": True, "thinkingLevel": "LOW"}),
        ("gemini-flash-latest", {"includeThoughts": True, "thinkingLevel": "LOW"}),
    ],
)
def test_reasoning_effort_is_a_budget_before_gemini_3_and_a_level_after(
    model: str, thinking: dict[str, Any]
) -> None:
    body = wire([UserMessage(content="Go")], model=model, settings=ModelSettings(reasoning_effort="low"))
    assert body["generationConfig"]["thinkingConfig"] == thinking


def test_an_output_schema_alone_is_native_json_output() -> None:
    schema = {**ANSWER, "additionalProperties": False, "title": "Answer"}
    body = wire([UserMessage(content="Where?")], output_schema=schema)
    assert body["generationConfig"]["responseMimeType"] == "application/json"
    assert body["generationConfig"]["responseSchema"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    assert "tools" not in body


@pytest.mark.parametrize(
    ("choice", "config"),
    [(None, None), ("none", {"mode": "ANY", "allowedFunctionNames": [ANSWER_TOOL]})],
)
def test_an_output_schema_beside_tools_is_the_answer_tool(
    choice: str | None, config: dict[str, Any] | None
) -> None:
    body = wire([UserMessage(content="Where?")], tools=[WEATHER], tool_choice=choice, output_schema=ANSWER)
    declarations = body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declarations] == ["get_weather", ANSWER_TOOL]
    assert declarations[1]["parameters"]["required"] == ["city"]
    assert "responseMimeType" not in body.get("generationConfig", {})
    assert body.get("toolConfig") == ({"functionCallingConfig": config} if config else None)


def test_extra_is_merged_last() -> None:
    settings = ModelSettings(temperature=0.5, extra={"generationConfig": {"topK": 3}, "safetySettings": []})
    body = wire([UserMessage(content="Go")], settings=settings)
    assert body["generationConfig"] == {"topK": 3} and body["safetySettings"] == []


def test_no_field_of_the_body_names_the_model_or_streaming() -> None:
    body = wire([UserMessage(content="Go")], tools=[WEATHER])
    assert not set(body) & {"model", "stream"}
    assert refuse_controls("gemini", ModelSettings(parallel_tool_calls=True, extra={"contents": []})) == [
        "extra.contents is not allowed: toolloop builds 'contents' itself"
    ]
    assert refuse_controls("vertex", ModelSettings(parallel_tool_calls=False, stop=list("abcdef"))) == [
        "stop: vertex takes at most 5 sequences (got 6)",
        "parallel_tool_calls false is not supported by vertex: Gemini may always call tools in parallel",
    ]


@pytest.mark.parametrize(
    ("base", "model", "stream", "url"),
    [
        (
            gemini.DEFAULT_BASE_URL,
            "gemini-2.5-flash",
            False,
            f"{gemini.DEFAULT_BASE_URL}/v1beta/models/gemini-2.5-flash:generateContent",
        ),
        (
            gemini.DEFAULT_BASE_URL,
            "models/gemini-2.5-flash",
            True,
            f"{gemini.DEFAULT_BASE_URL}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
        (
            "http://127.0.0.1:8080/gemini/v1beta",
            "g",
            False,
            "http://127.0.0.1:8080/gemini/v1beta/models/g:generateContent",
        ),
        ("http://gw/v1", "a/b c", False, "http://gw/v1/models/a%2Fb%20c:generateContent"),
    ],
)
def test_gemini_api_urls(base: str, model: str, stream: bool, url: str) -> None:
    assert gemini.build_url(base, model, stream=stream) == url


def test_vertex_urls() -> None:
    base = (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/publishers/google"
    )
    assert gemini.build_vertex_url(base, "gemini-2.5-pro", stream=True) == (
        f"{base}/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    )
    assert (
        gemini.build_vertex_url(base, "gemini-2.5-pro", stream=False)
        == f"{base}/models/gemini-2.5-pro:generateContent"
    )


def test_rate_limits_say_a_429_and_a_gateways_wait() -> None:
    signal = gemini.parse_rate_limits(429, {"retry-after": "3"}, 0.0)
    assert (signal.refused, signal.retry_after_s, signal.requests_remaining) == (True, 3.0, None)
    assert not gemini.parse_rate_limits(200, {}, 0.0).refused


def test_errors_map_to_the_shared_failure_kinds() -> None:
    overloaded = gemini.error_from_wire(
        503, {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    )
    assert (overloaded.retryable, overloaded.type) == (True, "UNAVAILABLE")
    vertex = gemini.error_from_wire(
        429, [{"error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}}]
    )
    assert (vertex.retryable, vertex.type, vertex.message) == (True, "RESOURCE_EXHAUSTED", "Quota")
    message = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    too_long = gemini.error_from_wire(
        400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    )
    assert isinstance(too_long, ProviderError)
    assert (too_long.code, too_long.retryable) == ("context_length_exceeded", False)
    assert too_long.details and too_long.details["context_window_tokens"] == 1048576


@pytest.mark.parametrize(
    "body",
    [
        {"contents": []},
        {"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]},
        {"contents": [{"role": "user", "parts": [{"text": "x", "functionCall": {"name": "f"}}]}]},
        {"contents": [{"role": "user", "parts": []}]},
        {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"max_tokens": 5}},
        {
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 5, "thinkingLevel": "LOW"}},
        },
        {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "model": "gemini-2.5-flash"},
    ],
)
def test_the_documented_shape_refuses_what_gemini_refuses(body: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, SCHEMA)
