"""Bedrock Converse responses, errors and decoded ConverseStream events, from the Bedrock API reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.model import AssistantMessage, ProviderError, Turn, UserMessage
from orchestrator.providers import bedrock
from orchestrator.providers.base import ModelRequest


def converse(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": {"inputTokens": 20, "outputTokens": 6, "totalTokens": 26, "cacheReadInputTokens": 3},
        "metrics": {"latencyMs": 100},
    }


def test_text_answer() -> None:
    turn = bedrock.from_wire(converse([{"text": "Hello"}]))
    assert isinstance(turn, Turn)
    assert (turn.type, turn.text, turn.model, turn.finish_reason) == ("final_answer", "Hello", None, "stop")
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.total_tokens) == (20, 6, 26)
    assert turn.usage.cache_read_tokens == 3


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("end_turn", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("model_context_window_exceeded", "length"),
    ],
)
def test_every_stop_reason(stop: str, expected: str) -> None:
    turn = bedrock.from_wire(converse([{"text": "x"}], stop))
    assert isinstance(turn, Turn) and turn.finish_reason == expected


def test_redacted_reasoning_is_kept_for_resending_but_is_not_thinking() -> None:
    content = [
        {"reasoningContent": {"redactedContent": "ZW5jcnlwdGVk"}},
        {"reasoningContent": {"reasoningText": {"text": "think", "signature": "sig"}}},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "f", "input": {"a": 1}}},
    ]
    turn = bedrock.from_wire(converse(content, "tool_use"))
    assert isinstance(turn, Turn)
    assert turn.thinking == "think" and turn.text is None
    assert turn.provider_data["reasoning"][0] == {"redactedContent": "ZW5jcnlwdGVk"}
    assert turn.provider_data["reasoning"][1]["reasoningText"]["signature"] == "sig"
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("tooluse_1", "f", {"a": 1})]


def test_errors_from_header_or_type_field() -> None:
    throttled = bedrock.error_from_wire(
        429, {"message": "Too many requests"}, {"x-amzn-ErrorType": "ThrottlingException:http://internal"}
    )
    assert (throttled.type, throttled.retryable, throttled.message) == (
        "ThrottlingException",
        True,
        "Too many requests",
    )
    invalid = bedrock.from_wire({"__type": "ValidationException", "message": "bad input"})
    assert isinstance(invalid, ProviderError)
    assert (invalid.type, invalid.retryable) == ("ValidationException", False)
    unavailable = bedrock.from_wire({"__type": "ServiceUnavailableException", "message": "later"})
    assert isinstance(unavailable, ProviderError) and unavailable.retryable


EVENTS: list[dict[str, Any]] = [
    {"messageStart": {"role": "assistant"}},
    {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "plan"}}}},
    {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "s"}}}},
    {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"text": "Let me "}}},
    {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"text": "check."}}},
    {"contentBlockStart": {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "t1", "name": "w"}}}},
    {"contentBlockDelta": {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"city": '}}}},
    {"contentBlockDelta": {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '"Oslo"}'}}}},
    {"contentBlockStop": {"contentBlockIndex": 2}},
    {"messageStop": {"stopReason": "tool_use"}},
    {
        "metadata": {
            "usage": {"inputTokens": 5, "outputTokens": 9, "totalTokens": 14},
            "metrics": {"latencyMs": 1},
        }
    },
]


@pytest.mark.parametrize("as_array", [False, True])
def test_decoded_stream_events_accumulate(as_array: bool) -> None:
    text = json.dumps(EVENTS) if as_array else "\n".join(json.dumps(e) for e in EVENTS)
    turn = bedrock.from_stream(text)
    assert isinstance(turn, Turn), turn
    assert (turn.text, turn.thinking, turn.finish_reason) == ("Let me check.", "plan", "tool_calls")
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [("t1", {"city": "Oslo"})]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (5, 9)


def test_stream_without_message_stop_is_retryable() -> None:
    result = bedrock.from_stream("\n".join(json.dumps(e) for e in EVENTS[:5]))
    assert isinstance(result, ProviderError) and result.retryable


def test_stream_exception_event() -> None:
    text = "\n".join(json.dumps(e) for e in [EVENTS[0], {"throttlingException": {"message": "slow down"}}])
    result = bedrock.from_stream(text)
    assert isinstance(result, ProviderError) and result.message == "slow down"


@pytest.mark.parametrize(
    "body",
    [
        {"output": []},
        {"output": {"message": {"content": "text"}}},
        {"output": {"message": {"content": [{"toolUse": "x"}]}}},
        {"output": {"message": {"content": [{"text": None, "reasoningContent": 5}]}}},
        {"stopReason": 1},
    ],
)
def test_malformed_bodies(body: object) -> None:
    result = bedrock.from_wire(body)
    assert isinstance(result, ProviderError) and result.type == "invalid_response"


@pytest.mark.parametrize(
    ("status", "error_type", "message", "retryable", "code"),
    [
        (429, "ThrottlingException", "Too many requests, please wait before trying again.", True, None),
        (503, "ServiceUnavailableException", "Service unavailable", True, None),
        (429, "ModelNotReadyException", "Model is not ready", True, None),
        (408, "ModelTimeoutException", "timed out", True, None),
        (500, "InternalServerException", "internal", True, None),
        (400, "ValidationException", "Malformed input request", False, None),
        (403, "AccessDeniedException", "no access", False, None),
        (424, "ModelErrorException", "model failed", False, None),
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            False,
            "context_length_exceeded",
        ),
        (
            400,
            "ValidationException",
            "The model returned the following errors: prompt is too long: 215000 tokens > 200000 maximum",
            False,
            "context_length_exceeded",
        ),
    ],
)
def test_http_errors(status: int, error_type: str, message: str, retryable: bool, code: str | None) -> None:
    headers = {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    for body, hdrs in (({"message": message}, headers), ({"__type": error_type, "message": message}, {})):
        error = bedrock.error_from_wire(status, body, hdrs)
        assert (error.status, error.type, error.message, error.retryable, error.code) == (
            status,
            error_type,
            message,
            retryable,
            code,
        )


def test_overflow_states_the_sizes() -> None:
    error = bedrock.error_from_wire(
        400,
        {
            "message": "The model returned the following errors: "
            "prompt is too long: 215000 tokens > 200000 maximum"
        },
        {"x-amzn-ErrorType": "ValidationException"},
    )
    assert error.details == {"context_window_tokens": 200000, "prompt_tokens": 215000}


def test_retry_after_and_request_id_are_read() -> None:
    error = bedrock.error_from_wire(
        429,
        {"message": "slow"},
        {"x-amzn-ErrorType": "ThrottlingException", "retry-after": "3", "x-amzn-RequestId": "req-1"},
    )
    assert (error.retry_after_s, error.request_id) == (3.0, "req-1")


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/", "ThrottlingException"),
        ("com.amazon.coral.validate#ValidationException", "ValidationException"),
        ("modelStreamErrorException", "ModelStreamErrorException"),
    ],
)
def test_exception_names(raw: str, name: str) -> None:
    assert bedrock.build_exception_name(raw) == name
    assert bedrock.from_wire({"__type": raw, "message": "m"}) == bedrock.error_from_wire(
        None, {"__type": raw, "message": "m"}
    )


@pytest.mark.parametrize(
    ("status", "headers", "refused", "retry_after_s"),
    [
        (200, {}, False, None),
        (429, {"x-amzn-ErrorType": "ThrottlingException:http://internal"}, True, None),
        (429, {"x-amzn-ErrorType": "ModelNotReadyException"}, False, None),
        (429, {"retry-after": "2"}, True, 2.0),
    ],
)
def test_rate_limits(
    status: int, headers: dict[str, str], refused: bool, retry_after_s: float | None
) -> None:
    signal = bedrock.parse_rate_limits(status, headers, 0.0)
    assert (signal.refused, signal.retry_after_s, signal.requests_remaining) == (refused, retry_after_s, None)


@pytest.mark.parametrize(
    "name",
    [
        "bedrock_converse__reasoning_text_and_tool_use.json",
        "bedrock_converse__kimi_reasoning_tool_use_odd_id.json",
    ],
)
def test_recorded_bodies_round_trip(responses_dir: Path, name: str) -> None:
    turn = bedrock.from_wire(json.loads((responses_dir / name).read_text("utf-8")))
    assert isinstance(turn, Turn)
    # The answer goes back as Bedrock wants it: signed reasoning re-sent, unsigned dropped, the call as given.
    message = AssistantMessage(
        content=turn.text,
        tool_calls=turn.tool_calls,
        provider=turn.provider,
        provider_data=turn.provider_data,
    )
    body = bedrock.to_wire(
        ModelRequest(model="anthropic.claude", messages=[UserMessage(content="q"), message])
    )
    blocks = body["messages"][1]["content"]
    reasoning = [b["reasoningContent"] for b in blocks if "reasoningContent" in b]
    signed = [r for r in turn.provider_data["reasoning"] if r.get("reasoningText", {}).get("signature")]
    assert reasoning == signed
    assert [b["toolUse"]["toolUseId"] for b in blocks if "toolUse" in b] == [c.id for c in turn.tool_calls]
