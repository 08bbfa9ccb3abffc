"""ConverseStream read as the HTTP path reads it: binary frames through `bedrock.stream_decoder()`, events
through `bedrock.stream_reader()`; deltas as they come, the Turn `from_wire` gives for the same answer,
exception frames as the HTTP errors they stand for, a cut stream retryable. Frames are encoded by the
event-stream tests' encoder (the one botocore's parser agrees with)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers import bedrock
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.common import IdSource
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.providers.event_stream import EventStreamError
from orchestrator.providers.structured import ANSWER_TOOL, read_answer_tool
from tests.unit.providers.test_event_stream import event, exception, frame

pytestmark = pytest.mark.timeout(60)

EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("messageStart", {"role": "assistant", "p": "abc"}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "\nplan"}}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": " it\n"}}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "c2ln"}}}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Let me "}}),
    ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "check é."}}),
    ("contentBlockStop", {"contentBlockIndex": 1}),
    (
        "contentBlockStart",
        {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "weather"}}},
    ),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"city": '}}}),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '"Oslo"}'}}}),
    ("contentBlockStop", {"contentBlockIndex": 2}),
    (
        "contentBlockStart",
        {"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "tooluse_2", "name": "clock"}}},
    ),
    ("contentBlockStop", {"contentBlockIndex": 3}),
    ("messageStop", {"stopReason": "tool_use"}),
    (
        "metadata",
        {"usage": {"inputTokens": 5, "outputTokens": 9, "totalTokens": 14}, "metrics": {"latencyMs": 1}},
    ),
]
BODY = b"".join(event(name, payload) for name, payload in EVENTS)
# The same answer as one Converse response.
RESPONSE = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "\nplan it\n", "signature": "c2ln"}}},
                {"text": "Let me check é."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Oslo"}}},
                {"toolUse": {"toolUseId": "tooluse_2", "name": "clock", "input": {}}},
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {"inputTokens": 5, "outputTokens": 9, "totalTokens": 14},
}


def read(
    chunks: list[bytes], request: ModelRequest | None = None
) -> tuple[list[Delta], Turn | ProviderError]:
    """What the streaming HTTP path does with a ConverseStream body arriving as `chunks`."""
    decoder = bedrock.stream_decoder()
    reader = bedrock.stream_reader(request)
    deltas: list[Delta] = []
    try:
        for chunk in chunks:
            for each in decoder.feed(chunk):
                deltas += reader.add(each)
        for each in decoder.close():
            deltas += reader.add(each)
    except EventStreamError as exc:
        return deltas, ProviderError(
            provider="bedrock", type="invalid_response", message=str(exc), retryable=exc.cut
        )
    return deltas, reader.finish(IdSource("t"))


def same_calls(turn: Turn, other: Turn) -> None:
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        (c.id, c.name, c.arguments) for c in other.tool_calls
    ]


def test_stream_gives_the_turn_of_the_same_response() -> None:
    deltas, turn = read([BODY])
    assert isinstance(turn, Turn), turn
    expected = bedrock.from_wire(RESPONSE, ids=IdSource("t"))
    assert isinstance(expected, Turn)
    for field in ("type", "text", "thinking", "usage", "finish_reason", "provider_data", "provider"):
        assert getattr(turn, field) == getattr(expected, field), field
    same_calls(turn, expected)
    assert turn.provider_data == {
        "reasoning": [{"reasoningText": {"text": "\nplan it\n", "signature": "c2ln"}}]
    }
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == turn.text
    assert "".join(d.text for d in deltas if isinstance(d, ThinkingDelta)) == turn.thinking
    assert [d for d in deltas if isinstance(d, ToolCallDelta)] == [
        ToolCallDelta(0, "weather", "tooluse_1"),
        ToolCallDelta(1, "clock", "tooluse_2"),
    ]


def test_every_split_gives_the_same_deltas_and_turn() -> None:
    whole = read([BODY])
    for offset in range(1, len(BODY), 7):
        assert read([BODY[:offset], BODY[offset:]]) == whole, offset


def test_decoded_events_read_the_same() -> None:
    text = "\n".join(json.dumps({name: payload}) for name, payload in EVENTS)
    turn = bedrock.from_stream(text, ids=IdSource("t"))
    assert turn == read([BODY])[1]


def test_redacted_reasoning_streams_as_redacted_content() -> None:
    body = b"".join(
        [
            event(
                "contentBlockDelta",
                {"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": "ZW5j"}}},
            ),
            event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "ok"}}),
            event("messageStop", {"stopReason": "end_turn"}),
        ]
    )
    deltas, turn = read([body])
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking) == ("ok", None)
    assert turn.provider_data == {"reasoning": [{"redactedContent": "ZW5j"}]}
    assert deltas == [TextDelta("ok")]


def test_the_answer_tool_streams_as_text() -> None:
    request = ModelRequest(
        model="anthropic.claude", messages=[UserMessage(content="x")], output_schema={"type": "object"}
    )
    body = b"".join(
        [
            event(
                "contentBlockStart",
                {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t", "name": ANSWER_TOOL}}},
            ),
            event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": '{"a": '}}}),
            event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": "1}"}}}),
            event("messageStop", {"stopReason": "tool_use"}),
        ]
    )
    deltas, turn = read([body], request)
    assert isinstance(turn, Turn)
    answer = read_answer_tool(turn)
    assert (answer.type, answer.text) == ("final_answer", '{"a": 1}')
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == answer.text
    assert not any(isinstance(d, ToolCallDelta) for d in deltas)


@pytest.mark.parametrize(
    ("name", "message", "error_type", "retryable", "code"),
    [
        ("throttlingException", "Too many requests, please wait", "ThrottlingException", True, None),
        ("serviceUnavailableException", "busy", "ServiceUnavailableException", True, None),
        ("internalServerException", "oops", "InternalServerException", True, None),
        ("modelStreamErrorException", "retry your request", "ModelStreamErrorException", True, None),
        ("validationException", "bad input", "ValidationException", False, None),
        (
            "validationException",
            "Input is too long for requested model.",
            "ValidationException",
            False,
            "context_length_exceeded",
        ),
    ],
)
def test_exception_frames_are_the_errors_http_gives(
    name: str, message: str, error_type: str, retryable: bool, code: str | None
) -> None:
    body = event("messageStart", {"role": "assistant"}) + exception(name, message)
    _, error = read([body])
    assert isinstance(error, ProviderError)
    assert (error.type, error.message, error.retryable, error.code) == (error_type, message, retryable, code)
    # The same failure kind as the HTTP error of that exception.
    status = {"ThrottlingException": 429, "ServiceUnavailableException": 503, "InternalServerException": 500}
    if error_type in status:
        http = bedrock.error_from_wire(
            status[error_type], {"message": message}, {"x-amzn-ErrorType": f"{error_type}:http://internal"}
        )
        assert (http.type, http.retryable, http.code) == (error.type, error.retryable, error.code)


def test_an_error_frame_fails_the_stream() -> None:
    body = frame(
        [(":message-type", 7, "error"), (":error-code", 7, "InternalFailure"), (":error-message", 7, "x")],
        b"",
    )
    _, error = read([event("messageStart", {}), body])
    assert isinstance(error, ProviderError)
    assert (error.type, error.message) == ("InternalFailure", "x")


def test_a_stream_without_message_stop_is_cut() -> None:
    cut = b"".join(event(name, payload) for name, payload in EVENTS[:8])
    _, error = read([cut])
    assert isinstance(error, ProviderError)
    assert (error.type, error.retryable) == ("invalid_response", True)
    assert "messageStop" in error.message


def test_a_stream_cut_inside_a_frame_is_retryable() -> None:
    _, error = read([BODY[:-5]])
    assert isinstance(error, ProviderError) and error.retryable


def test_a_corrupt_frame_is_not_retried_as_a_cut() -> None:
    broken = BODY[:30] + bytes([BODY[30] ^ 1]) + BODY[31:]
    _, error = read([broken])
    assert isinstance(error, ProviderError) and not error.retryable


def test_unknown_events_are_ignored_and_a_malformed_one_fails() -> None:
    body = event("somethingNew", {"x": 1}) + b"".join(event(n, p) for n, p in EVENTS)
    assert read([body])[1] == read([BODY])[1]
    _, error = read([event("contentBlockDelta", {"contentBlockIndex": "zero", "delta": {"text": "x"}})])
    assert isinstance(error, ProviderError) and error.type == "invalid_response"
