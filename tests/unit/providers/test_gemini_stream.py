"""Gemini streams read chunk by chunk: the deltas on the way, the Turn at the end (the one a whole body
gives), errors and cut streams; then the same streams and bodies through the real HTTP path."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers import gemini
from orchestrator.providers.base import HttpModelClient, ModelRequest, RetryPolicy
from orchestrator.providers.common import IdSource
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.providers.stream_reader import SSEByteDecoder, StreamReader
from orchestrator.providers.structured import ANSWER_TOOL, read_answer_tool
from tests.unit.providers.conftest import RESPONSES_DIR, load_expected
from workers.contract import ToolSpec

RECORDED_SSE = "gemini__stream_function_call_then_empty_text.sse"


def chunk(parts: list[dict[str, Any]], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "modelVersion": "gemini-2.5-flash", **extra}


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode()


def read(
    body: bytes, reader: StreamReader | None = None, *, seed: int = 0
) -> tuple[list[Delta], Turn | ProviderError]:
    """The deltas and the result of a stream body fed in pieces cut at random places, as HTTP delivers it."""
    reader = reader or gemini.stream_reader()
    decoder = SSEByteDecoder()
    rng = random.Random(seed)
    deltas: list[Delta] = []
    at = 0
    while at < len(body):
        step = rng.randint(1, 40)
        for event in decoder.feed(body[at : at + step]):
            deltas += reader.add(event)
        at += step
    for event in decoder.close():
        deltas += reader.add(event)
    return deltas, reader.finish(IdSource("t"))


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def thinking_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, ThinkingDelta))


THINK_CALL_THINK_ANSWER = [
    chunk([{"text": "\nLet me ", "thought": True}]),
    chunk([{"text": "look.\n", "thought": True}]),
    chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2ln"}]),
    chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}]),
    chunk([{"text": "Now compare.", "thought": True}]),
    chunk([{"text": "Both "}]),
    chunk([{"text": "sunny."}, {"text": "", "thoughtSignature": "ZW5k"}]),
    chunk(
        [],
        finish="STOP",
        usageMetadata={"promptTokenCount": 9, "candidatesTokenCount": 4, "thoughtsTokenCount": 20},
    ),
]


@pytest.mark.parametrize("seed", range(5))
def test_deltas_add_up_to_the_turn_a_whole_body_gives(seed: int) -> None:
    deltas, turn = read(sse(THINK_CALL_THINK_ANSWER), seed=seed)
    whole = gemini.from_chunks(list(THINK_CALL_THINK_ANSWER), ids=IdSource("t"))
    assert isinstance(turn, Turn) and isinstance(whole, Turn), (turn, whole)
    assert turn == whole
    assert text_of(deltas) == turn.text == "Both sunny."
    assert thinking_of(deltas) == turn.thinking == "Let me look.\n\nNow compare."
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls == [ToolCallDelta(0, "get_weather", None), ToolCallDelta(1, "get_weather", None)]
    assert [c.arguments for c in turn.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert turn.provider_data["thought_signatures"] == {turn.tool_calls[0].id: "c2ln"}
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.reasoning_tokens) == (9, 4, 20)


def test_the_recorded_stream_gives_its_expected_turn_and_one_call_delta() -> None:
    body = (RESPONSES_DIR / RECORDED_SSE).read_bytes()
    deltas, turn = read(body)
    expected = load_expected()[RECORDED_SSE]
    assert isinstance(turn, Turn), turn
    assert deltas == [ToolCallDelta(0, "get_country", None)]
    assert (turn.type, turn.text, turn.model) == (expected["type"], expected["text"], expected["model"])
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c["name"], c["args"]) for c in expected["tool_calls"]
    ]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (29, 10)
    assert turn.provider_data["parts"][0]["thoughtSignature"].startswith("EpwI")
    crlf = body.decode().replace("\n", "\r\n")
    assert gemini.from_stream(body.decode(), ids=IdSource("t")) == gemini.from_stream(crlf, ids=IdSource("t"))


def test_a_call_id_vertex_gives_is_announced() -> None:
    deltas, _ = read(sse([chunk([{"functionCall": {"id": "fc-9", "name": "now"}}], finish="STOP")]))
    assert deltas == [ToolCallDelta(0, "now", "fc-9")]


def test_the_answer_tool_streams_as_the_answer_text() -> None:
    tools = [ToolSpec(name="now", description="The time.")]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    request = ModelRequest(
        model="gemini-2.5-flash", messages=[UserMessage(content="Where?")], tools=tools, output_schema=schema
    )
    args = {"city": "Zürich"}
    body = sse([chunk([{"functionCall": {"name": ANSWER_TOOL, "args": args}}], finish="STOP")])
    deltas, turn = read(body, gemini.stream_reader(request))
    assert isinstance(turn, Turn)
    answer = read_answer_tool(turn)
    assert deltas == [TextDelta(answer.text or "")]
    assert json.loads(text_of(deltas)) == args and answer.type == "final_answer"


def test_a_stream_cut_before_its_finish_is_a_retryable_error() -> None:
    deltas, result = read(sse(THINK_CALL_THINK_ANSWER[:-1]))
    assert isinstance(result, ProviderError)
    assert (result.type, result.retryable) == ("invalid_response", True)
    assert text_of(deltas) == "Both sunny."
    _, empty = read(b"")
    assert isinstance(empty, ProviderError) and empty.retryable


def test_an_error_event_is_the_streams_error() -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    deltas, result = read(sse([THINK_CALL_THINK_ANSWER[5], error, THINK_CALL_THINK_ANSWER[6]]))
    assert isinstance(result, ProviderError)
    assert (result.status, result.type, result.retryable) == (503, "UNAVAILABLE", True)
    assert deltas == [TextDelta("Both ")]


def test_a_blocked_prompt_ends_the_stream() -> None:
    _, turn = read(
        sse([{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}])
    )
    assert isinstance(turn, Turn) and turn.finish_reason == "content_filter"


def test_a_malformed_chunk_is_an_invalid_response() -> None:
    _, result = read(b'data: {"candidates": [{"content": {"parts": [{"text": 5}]}}]}\n\n')
    assert isinstance(result, ProviderError) and result.type == "invalid_response" and not result.retryable


# --- the real HTTP path ----------------------------------------------------------------------------------


def server(answers: list[httpx.Response], seen: list[httpx.Request]) -> httpx.AsyncClient:
    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def client(http: httpx.AsyncClient, url: str) -> HttpModelClient:
    return HttpModelClient(
        "gemini", gemini, http, url, {"x-goog-api-key": "k"}, retry=RetryPolicy(max_retries=0)
    )


REQUEST = ModelRequest(model="gemini-2.5-flash", messages=[UserMessage(content="Weather?")])
BASE = "http://127.0.0.1:9/v1beta/models/gemini-2.5-flash"


async def test_a_streamed_call_through_http() -> None:
    seen: list[httpx.Request] = []
    answer = httpx.Response(
        200, content=sse(THINK_CALL_THINK_ANSWER), headers={"content-type": "text/event-stream"}
    )
    deltas: list[Delta] = []

    async def sink(delta: Delta) -> None:
        deltas.append(delta)

    async with server([answer], seen) as http:
        turn = await client(http, f"{BASE}:streamGenerateContent?alt=sse").complete(REQUEST, sink)
    assert isinstance(turn, Turn), turn
    assert (turn.text, len(turn.tool_calls), turn.provider) == ("Both sunny.", 2, "gemini")
    assert text_of(deltas) == "Both sunny."
    assert json.loads(seen[0].content) == gemini.to_wire(REQUEST)
    assert seen[0].headers["x-goog-api-key"] == "k"


@pytest.mark.parametrize("name", sorted(p.name for p in RESPONSES_DIR.glob("gemini__*.json")))
async def test_every_recorded_body_through_http(name: str) -> None:
    seen: list[httpx.Request] = []
    answer = httpx.Response(
        200, content=(RESPONSES_DIR / name).read_bytes(), headers={"content-type": "application/json"}
    )
    async with server([answer], seen) as http:
        turn = await client(http, f"{BASE}:generateContent").complete(REQUEST)
    expected = load_expected()[name]
    assert isinstance(turn, Turn), turn
    thinking = expected["thinking"].strip() if expected["thinking"] else None
    assert (turn.type, turn.text, turn.thinking, turn.model) == (
        expected["type"],
        expected["text"],
        thinking,
        expected["model"],
    )


async def test_a_json_array_stream_without_sse_is_read_whole() -> None:
    seen: list[httpx.Request] = []
    answer = httpx.Response(200, json=THINK_CALL_THINK_ANSWER)

    async def sink(delta: Delta) -> None:
        del delta

    async with server([answer], seen) as http:
        turn = await client(http, f"{BASE}:streamGenerateContent").complete(REQUEST, sink)
    assert isinstance(turn, Turn) and turn.text == "Both sunny."


async def test_an_http_error_keeps_googles_retry_hint() -> None:
    seen: list[httpx.Request] = []
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"}],
        }
    }
    async with server([httpx.Response(429, json=body)], seen) as http:
        error = await client(http, f"{BASE}:generateContent").complete(REQUEST)
    assert isinstance(error, ProviderError)
    assert (error.status, error.retryable, error.retry_after_s) == (429, True, 26.0)
