"""The streaming HTTP path against a real local HTTP server replaying recorded streams chunk by chunk.

Per recorded stream: the sink gets deltas while the server has not sent its last chunk yet (the server holds
that chunk back until the sink has seen two deltas, and notes when it sends it, so the check is an ordering,
not a time), and the Turn is the plain normaliser's. Also: a server that ignores `stream: true`, a stream
without its content type, error statuses (retried only while nothing was streamed), a stream cut, dropped or
stalled mid-way (retryable, never retried after a delta), `stream=False`, a failing sink, and the scripted
model streaming a word at a time with its delay taken from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.base import HttpModelClient, ModelRequest, parse_model_ref
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.providers.registry import ModelClients, build_model_client
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.settings import Settings
from tests.openapi_schemas import assert_valid
from tests.support.api_server import serving_in_loop
from tests.support.fake_time import SleepRecorder
from tests.support.waiting import DEFAULT_TIMEOUT_S
from tests.unit.providers.conftest import load_expected
from tests.unit.providers.test_expected import check_turn

pytestmark = pytest.mark.timeout(60)

MODELS = {"openai_chat": "openai", "openai_responses": "openai_responses", "anthropic": "anthropic"}
MODULES = {"openai_chat": openai_chat, "openai_responses": openai_responses, "anthropic": anthropic}
STREAMS = [e for e in load_expected().values() if e["file"].endswith(".sse") and e["provider"] in MODELS]
PLAIN_REPLIES = {
    "openai_chat": "openai_chat__refusal.json",
    "openai_responses": "openai_responses__refusal.json",
    "anthropic": "anthropic__final_answer_unicode.json",
}
SCHEMAS = {"openai_chat": "CreateChatCompletionRequest", "openai_responses": "CreateResponse"}


@dataclass
class Answer:
    """One canned answer: a recorded body or raw bytes, sent in chunks (SSE) or at once (anything else)."""

    file: str | None = None
    body: bytes = b""
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)
    gate: bool = False  # hold the last chunk back until the client's sink has seen two deltas
    cut_after: int | None = None  # end the body cleanly after this many chunks
    drop_after: int | None = None  # break the connection after this many chunks
    stall_after: int | None = None  # stop sending after this many chunks until the test ends


def split_chunks(content: bytes) -> list[bytes]:
    """Each SSE event in two pieces, cut in the middle of a line."""
    events = [e + b"\n\n" for e in content.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    return [piece for e in events for piece in (e[: len(e) // 2], e[len(e) // 2 :])]


class StreamServer:
    """A real HTTP server on 127.0.0.1 answering each POST with the next canned answer, recording bodies."""

    def __init__(self, shared_dir: Path) -> None:
        self.responses_dir = shared_dir / "provider_responses"
        self.answers: list[Answer] = []
        self.received: list[dict[str, Any]] = []
        self.last_chunk_sent = asyncio.Event()
        self.client_saw_deltas = asyncio.Event()
        self.release = asyncio.Event()
        app = Starlette(routes=[Route("/{path:path}", self._answer, methods=["POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        )
        self.url = ""

    def content_of(self, answer: Answer) -> bytes:
        return (self.responses_dir / answer.file).read_bytes() if answer.file else answer.body

    async def _answer(self, request: Request) -> Response:
        self.received.append(json.loads(await request.body()))
        answer = self.answers.pop(0)
        content = self.content_of(answer)
        if answer.status >= 400 or "json" in answer.content_type:
            return Response(content, answer.status, answer.headers, media_type=answer.content_type)
        return StreamingResponse(
            self._chunks(answer, split_chunks(content)), answer.status, media_type=answer.content_type
        )

    async def _chunks(self, answer: Answer, chunks: list[bytes]) -> AsyncIterator[bytes]:
        for number, chunk in enumerate(chunks):
            if number == answer.cut_after:
                return
            if number == answer.drop_after:
                raise ConnectionAbortedError("connection dropped on purpose")
            if number == answer.stall_after:
                await self.release.wait()
            if number == len(chunks) - 1:
                if answer.gate:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.client_saw_deltas.wait(), DEFAULT_TIMEOUT_S / 2)
                self.last_chunk_sent.set()
            yield chunk
            await asyncio.sleep(0.005)  # paced as a network would: the chunks arrive apart


@pytest.fixture
async def server(shared_dir: Path) -> AsyncIterator[StreamServer]:
    replay = StreamServer(shared_dir)
    async with serving_in_loop(replay.server, "the stream server") as url:
        replay.url = url
        try:
            yield replay
        finally:
            replay.release.set()


class Recorder:
    """A delta sink noting, for each delta, whether the server had sent its last chunk when it came."""

    def __init__(self, server: StreamServer | None = None) -> None:
        self.server = server
        self.deltas: list[Delta] = []
        self.before_last_chunk: list[bool] = []

    async def __call__(self, delta: Delta) -> None:
        self.deltas.append(delta)
        if self.server is not None:
            self.before_last_chunk.append(not self.server.last_chunk_sent.is_set())
            if len(self.deltas) >= 2:
                self.server.client_saw_deltas.set()

    def text(self) -> str:
        return "".join(d.text for d in self.deltas if isinstance(d, TextDelta))

    def thinking(self) -> str:
        return "".join(d.text for d in self.deltas if isinstance(d, ThinkingDelta))


def client_for(
    provider: str,
    server: StreamServer,
    http: httpx.AsyncClient,
    *,
    max_retries: int = 0,
    timeout: httpx.Timeout | None = None,
) -> HttpModelClient:
    settings = Settings(
        provider_env={
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "ak-test",
        },
    )
    client = build_model_client(
        parse_model_ref(f"{MODELS[provider]}:m"),
        settings,
        http,
        max_retries=max_retries,
        timeout=timeout or httpx.Timeout(10.0),
    )
    assert isinstance(client, HttpModelClient)
    return client


def ask(stream: bool = True) -> ModelRequest:
    return ModelRequest(model="m", messages=[UserMessage(content="hi")], stream=stream)


@pytest.mark.parametrize("expected", STREAMS, ids=lambda e: e["file"])
async def test_recorded_stream_arrives_in_deltas_before_the_response_ends(
    server: StreamServer, http: httpx.AsyncClient, expected: dict[str, Any]
) -> None:
    provider = expected["provider"]
    server.answers.append(Answer(file=expected["file"], gate=True))
    recorder = Recorder(server)
    turn = await client_for(provider, server, http).complete(ask(), recorder)
    assert isinstance(turn, Turn), turn
    assert sum(recorder.before_last_chunk) >= 2, recorder.before_last_chunk
    plain = MODULES[provider].from_stream((server.responses_dir / expected["file"]).read_text("utf-8"))
    assert turn == plain.model_copy(update={"provider": MODELS[provider]})
    check_turn(turn, expected)
    assert recorder.text() == (turn.text or "") and recorder.thinking() == (turn.thinking or "")
    calls = [(d.tool, d.call_id) for d in recorder.deltas if isinstance(d, ToolCallDelta)]
    assert calls == [(c.name, c.id) for c in turn.tool_calls]
    body = server.received[0]
    assert body["stream"] is True
    if provider in SCHEMAS:
        assert_valid(body, SCHEMAS[provider])
    if provider == "openai_chat":
        assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("provider", "file"),
    [
        ("openai_chat", "openai_chat__parallel_tool_calls.json"),
        ("openai_responses", "openai_responses__reasoning_summary_and_function_call.json"),
        ("anthropic", "anthropic__thinking_text_and_tool_use_empty_input.json"),
    ],
)
async def test_a_server_that_ignores_stream_answers_with_a_plain_body(
    server: StreamServer, http: httpx.AsyncClient, provider: str, file: str
) -> None:
    server.answers += [
        Answer(file=file, content_type="application/json"),
        Answer(file=file, content_type="text/plain"),  # no JSON type either: sniffed as not SSE
    ]
    module = MODULES[provider]
    plain = module.from_wire(json.loads((server.responses_dir / file).read_text("utf-8")))
    client = client_for(provider, server, http)
    for _ in range(2):
        recorder = Recorder()
        turn = await client.complete(ask(), recorder)
        assert isinstance(turn, Turn) and isinstance(plain, Turn)
        assert turn.model_copy(update={"tool_calls": []}) == plain.model_copy(
            update={"provider": MODELS[provider], "tool_calls": []}
        )
        assert [c.name for c in turn.tool_calls] == [c.name for c in plain.tool_calls]
        assert recorder.deltas == []
    assert all(body["stream"] is True for body in server.received)


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
async def test_a_stream_without_its_content_type_is_sniffed(
    server: StreamServer, http: httpx.AsyncClient, content_type: str
) -> None:
    server.answers.append(Answer(file="anthropic__stream_thinking_then_text.sse", content_type=content_type))
    recorder = Recorder()
    turn = await client_for("anthropic", server, http).complete(ask(), recorder)
    assert isinstance(turn, Turn) and turn.text == "The primes were: 79, 179, and 379."
    assert recorder.text() == turn.text and recorder.thinking() == turn.thinking


async def test_error_statuses_on_a_streaming_request(server: StreamServer, http: httpx.AsyncClient) -> None:
    server.answers += [
        Answer(
            file="openai__error_429_rate_limit_exceeded.json",
            status=429,
            content_type="application/json",
            headers={"retry-after": "1"},
        ),
        Answer(file="openai_chat__stream_parallel_tool_calls.sse"),
        Answer(
            file="openai__error_400_tool_call_ids_without_tool_messages.json",
            status=400,
            content_type="application/json",
        ),
    ]
    client = client_for("openai_chat", server, http, max_retries=2)
    client.sleep = sleep = SleepRecorder()
    recorder = Recorder()
    turn = await client.complete(ask(), recorder)
    assert isinstance(turn, Turn) and len(turn.tool_calls) == 2
    assert sleep.waits == [1.0] and len(server.received) == 2  # nothing was streamed: retried
    error = await client.complete(ask(), Recorder())
    assert isinstance(error, ProviderError)
    assert (error.status, error.retryable, error.provider) == (400, False, "openai")
    assert "tool_call_id" in error.message and len(server.received) == 3


@pytest.mark.parametrize(
    ("answer", "error_type", "read_timeout_s"),
    [
        # A read timeout far beyond any pause of the server's: only the stall (until the test ends) meets it.
        (Answer(cut_after=10), "invalid_response", 10.0),
        (Answer(drop_after=10), "transport_error", 10.0),
        (Answer(stall_after=10), "timeout", 2.0),
    ],
    ids=["cut", "dropped", "stalled"],
)
async def test_a_stream_broken_mid_way_is_retryable_and_not_retried_after_deltas(
    server: StreamServer, http: httpx.AsyncClient, answer: Answer, error_type: str, read_timeout_s: float
) -> None:
    answer.file = "anthropic__stream_thinking_then_text.sse"
    server.answers.append(answer)
    client = client_for("anthropic", server, http, max_retries=2, timeout=httpx.Timeout(read_timeout_s))
    client.sleep = sleep = SleepRecorder()
    recorder = Recorder()
    error = await client.complete(ask(), recorder)
    assert isinstance(error, ProviderError), error
    assert (error.type, error.retryable, error.provider) == (error_type, True, "anthropic")
    assert recorder.thinking() and "The user is asking me to recall".startswith(recorder.thinking()[:31])
    assert len(server.received) == 1 and sleep.waits == []


async def test_stream_false_or_no_sink_sends_no_stream_field(
    server: StreamServer, http: httpx.AsyncClient
) -> None:
    for provider in MODELS:
        file = {
            "openai_chat": "openai_chat__refusal.json",
            "openai_responses": "openai_responses__refusal.json",
        }
        reply = file.get(provider, "anthropic__final_answer_unicode.json")
        server.answers += [Answer(file=reply, content_type="application/json") for _ in range(2)]
        client = client_for(provider, server, http)
        recorder = Recorder()
        assert isinstance(await client.complete(ask(stream=False), recorder), Turn)
        assert isinstance(await client.complete(ask()), Turn)
        assert recorder.deltas == []
    assert len(server.received) == 6
    assert not any({"stream", "stream_options"} & body.keys() for body in server.received)


async def test_a_failing_sink_does_not_fail_the_call(server: StreamServer, http: httpx.AsyncClient) -> None:
    server.answers.append(Answer(file="anthropic__stream_text_and_two_tool_use.sse"))
    calls: list[Delta] = []

    async def broken(delta: Delta) -> None:
        calls.append(delta)
        raise RuntimeError("the sink is broken")

    turn = await client_for("anthropic", server, http).complete(ask(), broken)
    assert isinstance(turn, Turn) and len(turn.tool_calls) == 2
    assert len(calls) == 1  # sent nothing more once it failed


async def test_scripted_model_streams_a_word_at_a_time(http: httpx.AsyncClient) -> None:
    text = "Six times seven is forty-two, and six plus seven is thirteen."
    plan = json.dumps({"plan": [{"text": text}]})
    clients = ModelClients(Settings(scripted_stream_delay_s=0.01), http, max_retries=0)
    try:
        client = await clients.get("scripted:plan")
        assert clients._scripted is not None and clients._scripted.chunk_delay_s == 0.01
        recorder = Recorder()
        turn = await client.complete(
            ModelRequest(model="plan", messages=[UserMessage(content=plan)]), recorder
        )
    finally:
        await clients.aclose()
    assert isinstance(turn, Turn) and turn.text == text
    assert recorder.text() == text and len(recorder.deltas) >= 10


async def test_scripted_server_without_delay_streams_too(http: httpx.AsyncClient) -> None:
    async with ScriptedServer() as base_url:
        client = build_model_client(
            parse_model_ref("scripted:echo"), Settings(), http, scripted_base_url=base_url
        )
        recorder = Recorder()
        turn = await client.complete(
            ModelRequest(model="echo", messages=[UserMessage(content="one two three four")]), recorder
        )
    assert isinstance(turn, Turn) and turn.text == "one two three four"
    assert [d.text for d in recorder.deltas if isinstance(d, TextDelta)] == ["one ", "two ", "three ", "four"]


def test_scripted_server_command_takes_a_stream_delay() -> None:
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "orchestrator.providers.scripted.server", "--port", "0"]
    command += ["--stream-delay", "0.01"]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        body = {"model": "echo", "messages": [{"role": "user", "content": "a b c"}], "stream": True}
        url = f"{line.removeprefix('listening on ')}/chat/completions"
        text = httpx.post(url, json=body, timeout=10).text
        assert text.count("data: ") == 6, text  # role, a chunk a word, finish, [DONE]
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
