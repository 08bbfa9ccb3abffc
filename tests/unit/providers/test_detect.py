"""Shape detection and provider aliases of `from_response`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.common import IdSource
from orchestrator.providers.detect import ALIASES, detect_shape, from_response, resolve_provider

GEMINI = {
    "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
    "modelVersion": "g",
}
OLLAMA = {
    "model": "m",
    "message": {"role": "assistant", "content": "hi"},
    "done": True,
    "done_reason": "stop",
}
COHERE = {
    "id": "x",
    "message": {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    "finish_reason": "COMPLETE",
}
BEDROCK = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn",
}
BARE_MESSAGE = {"role": "assistant", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "module"),
    [
        (GEMINI, "gemini"),
        (OLLAMA, "ollama"),
        (COHERE, "cohere"),
        (BEDROCK, "bedrock"),
        (BARE_MESSAGE, "bare"),
        ([GEMINI, GEMINI], "gemini"),
        ([], "bare"),
        (5, None),
        ({"hello": 1}, None),
    ],
)
def test_detect_shape(body: object, module: str | None) -> None:
    assert detect_shape(body) == module


@pytest.mark.parametrize("body", [GEMINI, OLLAMA, COHERE, BEDROCK, BARE_MESSAGE])
def test_every_shape_gives_the_same_text_from_bytes_text_and_object(body: dict[str, Any]) -> None:
    for form in (body, json.dumps(body), json.dumps(body).encode()):
        turn = from_response(form)
        assert isinstance(turn, Turn) and turn.text == "hi"


@pytest.mark.parametrize(
    "alias",
    [
        "openai_chat",
        "openai_responses",
        "anthropic",
        "gemini",
        "gemini_openai_compat",
        "ollama_native",
        "ollama_openai_compat",
        "bedrock_converse",
        "cohere_v2",
        "deepseek",
        "groq",
        "mistral",
        "xai",
        "together_hf",
        "vllm_crusoe",
        "openai",
        "openrouter",
        "lmstudio",
        "llamacpp",
        "llama.cpp",
        "LM-Studio",
    ],
)
def test_every_alias_resolves(alias: str) -> None:
    assert resolve_provider(alias) is not None


def test_aliases_point_at_real_modules() -> None:
    assert set(ALIASES.values()) == {
        "openai_chat",
        "openai_responses",
        "anthropic",
        "gemini",
        "ollama",
        "bedrock",
        "cohere",
        "bare",
    }


def test_unknown_provider_is_an_error_value() -> None:
    result = from_response(GEMINI, provider="nonesuch")
    assert isinstance(result, ProviderError) and result.type == "unknown_provider"


def test_a_clear_shape_beats_a_wrong_name() -> None:
    turn = from_response(GEMINI, provider="groq")
    assert isinstance(turn, Turn) and turn.provider == "gemini"


def test_status_makes_any_body_an_error_with_the_given_provider_name() -> None:
    error = from_response(
        b'{"error": {"message": "nope", "status": "PERMISSION_DENIED", "code": 403}}',
        provider="gemini",
        status=403,
    )
    assert isinstance(error, ProviderError)
    assert (error.provider, error.status, error.type, error.retryable) == (
        "gemini",
        403,
        "PERMISSION_DENIED",
        False,
    )
    html = from_response("<html>502 Bad Gateway</html>", status=502)
    assert isinstance(html, ProviderError) and html.retryable and "502" in html.message


def test_error_families_detected_without_status() -> None:
    ollama = from_response({"error": "model not found"})
    gemini = from_response({"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}})
    aws = from_response({"__type": "ThrottlingException", "message": "slow"})
    assert isinstance(ollama, ProviderError) and ollama.message == "model not found" and not ollama.retryable
    assert isinstance(gemini, ProviderError) and gemini.status == 429 and gemini.retryable
    assert isinstance(aws, ProviderError) and aws.type == "ThrottlingException" and aws.retryable


def test_bare_list_of_tool_calls_in_every_usual_shape() -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "name": "g", "arguments": {"y": 2}},
        {"type": "tool_use", "id": "c", "name": "h", "input": {"z": 3}},
        {"name": "i", "args": {"w": 4}},
        {"toolUseId": "e", "name": "j", "input": {}},
    ]
    turn = from_response(calls)
    assert isinstance(turn, Turn) and turn.type == "tool_calls"
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("f", {"x": 1}),
        ("g", {"y": 2}),
        ("h", {"z": 3}),
        ("i", {"w": 4}),
        ("j", {}),
    ]
    assert [c.id for c in turn.tool_calls][:3] == ["a", "b", "c"] and turn.tool_calls[3].id


@pytest.mark.parametrize("content", [None, "", []])
def test_bare_message_content_null_empty_or_absent(content: object) -> None:
    message: dict[str, Any] = {
        "role": "assistant",
        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "null"}}],
    }
    if content != []:
        message["content"] = content
    turn = from_response(message)
    assert isinstance(turn, Turn) and turn.text is None and turn.tool_calls[0].arguments == {}


def test_bare_message_refusal_and_reasoning() -> None:
    turn = from_response(
        {"role": "assistant", "content": None, "refusal": "I can't help.", "reasoning_content": "policy"}
    )
    assert isinstance(turn, Turn) and (turn.text, turn.thinking, turn.type) == (
        "I can't help.",
        "policy",
        "final_answer",
    )


def test_normalised_turn_round_trips_and_recomputes_type() -> None:
    data = {
        "type": "final_answer",
        "text": "t",
        "tool_calls": [{"id": "", "name": "f", "arguments": {"a": 1}}],
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        "model": "m",
        "finish_reason": "tool_calls",
    }
    turn = from_response(data, ids=IdSource("x"))
    assert isinstance(turn, Turn)
    assert turn.type == "tool_calls" and turn.tool_calls[0].id == "x_1" and turn.usage.total_tokens == 3
    bad = from_response({**data, "finish_reason": "whatever"})
    assert isinstance(bad, ProviderError) and bad.type == "invalid_response"


@pytest.mark.parametrize(
    "body", ["", "   ", "not json at all", b"\xff\xfe\x00", '{"choices": [', "data: {broken\n\n"]
)
def test_unreadable_input_is_an_error_value(body: str | bytes) -> None:
    assert isinstance(from_response(body), ProviderError)


def test_ndjson_ollama_stream_detected() -> None:
    lines = [
        {"model": "m", "message": {"role": "assistant", "content": "a"}, "done": False},
        {**OLLAMA, "message": {"role": "assistant", "content": "b"}},
    ]
    turn = from_response("\n".join(json.dumps(line) for line in lines))
    assert isinstance(turn, Turn) and turn.text == "ab"


def test_gemini_sse_detected_and_crlf() -> None:
    text = "data: " + json.dumps(GEMINI) + "\r\n\r\n"
    turn = from_response(text)
    assert isinstance(turn, Turn) and turn.text == "hi" and turn.provider == "gemini"
