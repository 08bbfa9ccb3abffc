"""The HTTP adapters against a real local HTTP server replaying recorded provider bodies.

Per wire format: a full tool round trip (tools asked for → results sent back → final answer) with request
bodies the real APIs accept (OpenAI's checked against its published OpenAPI schemas; Anthropic's for
tool_result pairing and id format); a 429 with Retry-After retried; a 400 not retried; a timeout mapped to a
retryable ProviderError; and the scripted model reached through the same adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orchestrator.model import (
    Message,
    ProviderError,
    ToolMessage,
    Turn,
    UserMessage,
    assistant_message_from_turn,
)
from orchestrator.providers.base import HttpModelClient, ModelClient, ModelRequest, parse_model_ref
from orchestrator.providers.registry import build_model_client
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.settings import Settings
from tests.openapi_schemas import assert_valid
from tests.support.api_server import serving_in_loop
from tests.support.fake_time import SleepRecorder
from workers.contract import ToolSpec
from workers.examples import arithmetic, demo

pytestmark = pytest.mark.timeout(30)

TOOLS = [arithmetic.add.spec, arithmetic.multiply.spec, demo.get_weather.spec]


@dataclass
class Reply:
    """One canned answer: a recorded body (file name) or raw JSON, with status, headers, delay."""

    status: int = 200
    file: str | None = None
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class ReplayServer:
    """A real HTTP server on 127.0.0.1 that answers each POST with the next canned reply and records it."""

    def __init__(self, shared_dir: Path) -> None:
        self.responses_dir = shared_dir / "provider_responses"
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.release = asyncio.Event()
        app = Starlette(routes=[Route("/{path:path}", self._answer, methods=["POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        )
        self.url = ""

    async def _answer(self, request: Request) -> Response:
        self.received.append(
            Received(request.url.path, dict(request.headers), json.loads(await request.body()))
        )
        reply = self.replies.pop(0)
        if reply.delay_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), reply.delay_s)
        content = (
            (self.responses_dir / reply.file).read_bytes() if reply.file else json.dumps(reply.body).encode()
        )
        return Response(content, reply.status, reply.headers, media_type="application/json")

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)


@pytest.fixture
async def replay(shared_dir: Path) -> AsyncIterator[ReplayServer]:
    server = ReplayServer(shared_dir)
    async with serving_in_loop(server.server, "the replay server") as url:
        server.url = url
        try:
            yield server
        finally:
            server.release.set()


def settings_for(url: str) -> Settings:
    return Settings(
        provider_env={
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "ak-test",
        },
    )


def client_for(
    model: str,
    replay: ReplayServer,
    http: httpx.AsyncClient,
    *,
    max_retries: int = 2,
    sleep: SleepRecorder | None = None,
) -> ModelClient:
    client = build_model_client(
        parse_model_ref(model), settings_for(replay.url), http, max_retries=max_retries
    )
    if sleep is not None:
        assert isinstance(client, HttpModelClient)
        client.sleep = sleep
    return client


def answer_all(turn: Turn) -> list[Message]:
    """The history entries after a tool-calls turn: the assistant message, then one result per call."""
    results: list[Message] = [
        ToolMessage(tool_call_id=c.id, name=c.name, content=json.dumps({"ok": c.name}))
        for c in turn.tool_calls
    ]
    return [assistant_message_from_turn(turn), *results]


async def round_trip(
    client: ModelClient,
    model: str,
    replay: ReplayServer,
    first: str,
    final: str,
    *,
    tools: Sequence[ToolSpec] = TOOLS,
) -> tuple[Turn, Turn]:
    replay.queue(Reply(file=first), Reply(file=final))
    history: list[Message] = [UserMessage(content="What is the weather in Paris?")]
    asked = await client.complete(
        ModelRequest(model=model, messages=history, tools=tools, tool_choice="auto")
    )
    assert isinstance(asked, Turn), asked
    assert asked.type == "tool_calls"
    history += answer_all(asked)
    answered = await client.complete(
        ModelRequest(model=model, messages=history, tools=tools, max_output_tokens=500)
    )
    assert isinstance(answered, Turn), answered
    assert answered.type == "final_answer" and answered.text
    return asked, answered


async def test_openai_chat_round_trip_sends_bodies_the_api_accepts(
    replay: ReplayServer, http: httpx.AsyncClient
) -> None:
    client = client_for("openai:gpt-4o", replay, http)
    asked, _ = await round_trip(
        client,
        "gpt-4o",
        replay,
        "openai_chat__parallel_tool_calls.json",
        "openai_chat__final_answer_after_tool_results.json",
    )
    assert [r.path for r in replay.received] == ["/v1/chat/completions"] * 2
    assert replay.received[0].headers["authorization"] == "Bearer sk-test"
    for received in replay.received:
        assert_valid(received.body, "CreateChatCompletionRequest")
    messages = replay.received[1].body["messages"]
    call_ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert call_ids == [c.id for c in asked.tool_calls]
    assert [m["tool_call_id"] for m in messages[2:]] == call_ids
    assert all(isinstance(c["function"]["arguments"], str) for c in messages[1]["tool_calls"])


async def test_openai_responses_round_trip_sends_bodies_the_api_accepts(
    replay: ReplayServer, http: httpx.AsyncClient
) -> None:
    client = client_for("openai_responses:gpt-5", replay, http)
    asked, answered = await round_trip(
        client,
        "gpt-5",
        replay,
        "openai_responses__reasoning_summary_and_function_call.json",
        "openai_responses__final_answer_with_reasoning_summary.json",
    )
    assert answered.thinking
    assert [r.path for r in replay.received] == ["/v1/responses"] * 2
    for received in replay.received:
        assert_valid(received.body, "CreateResponse")
    items = replay.received[1].body["input"]
    assert [i["type"] for i in items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert items[1]["id"] == asked.provider_data["reasoning_items"][0]["id"]
    assert items[2]["call_id"] == items[3]["call_id"] == asked.tool_calls[0].id


async def test_anthropic_round_trip_pairs_results_and_keeps_valid_ids(
    replay: ReplayServer, http: httpx.AsyncClient
) -> None:
    client = client_for("anthropic:claude-sonnet-4-5", replay, http)
    asked, _ = await round_trip(
        client,
        "claude-sonnet-4-5",
        replay,
        "anthropic__thinking_text_and_tool_use_empty_input.json",
        "anthropic__final_answer_unicode.json",
    )
    assert [r.path for r in replay.received] == ["/v1/messages"] * 2
    headers = replay.received[0].headers
    assert (headers["x-api-key"], headers["anthropic-version"]) == ("ak-test", "2023-06-01")
    second = replay.received[1].body
    assert second["max_tokens"] == 500
    assistant, results = second["messages"][1], second["messages"][2]
    assert assistant["content"][0]["type"] == "thinking" and assistant["content"][0]["signature"]
    uses = [b["id"] for b in assistant["content"] if b["type"] == "tool_use"]
    assert uses == [c.id for c in asked.tool_calls]
    assert [b["tool_use_id"] for b in results["content"] if b["type"] == "tool_result"] == uses
    assert all(b.get("type") == "tool_result" for b in results["content"])
    for block in assistant["content"]:
        if block["type"] == "tool_use":
            assert isinstance(block["input"], dict)
            assert all(ch.isalnum() or ch in "_-" for ch in block["id"])


async def test_429_with_retry_after_is_retried_then_succeeds(
    replay: ReplayServer, http: httpx.AsyncClient
) -> None:
    sleep = SleepRecorder()
    client = client_for("openai:gpt-4o", replay, http, sleep=sleep)
    replay.queue(
        Reply(429, "openai__error_429_rate_limit_exceeded.json", headers={"retry-after": "1"}),
        Reply(file="openai_chat__single_tool_call_empty_args.json"),
    )
    turn = await client.complete(
        ModelRequest(model="gpt-4o", messages=[UserMessage(content="hi")], tools=TOOLS)
    )
    assert isinstance(turn, Turn)
    assert len(replay.received) == 2
    assert sleep.waits == [1.0]


async def test_529_overloaded_is_retried_with_backoff_until_retries_run_out(
    replay: ReplayServer, http: httpx.AsyncClient
) -> None:
    sleep = SleepRecorder()
    client = client_for("anthropic:claude", replay, http, max_retries=2, sleep=sleep)
    overloaded = Reply(529, "anthropic__error_529_overloaded.json", headers={"request-id": "req_x"})
    replay.queue(overloaded, overloaded, overloaded)
    error = await client.complete(ModelRequest(model="claude", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError)
    assert (error.status, error.type, error.retryable, error.provider) == (
        529,
        "overloaded_error",
        True,
        "anthropic",
    )
    assert error.request_id == "req_011CZAau32QzxDkriovTaFCB"  # the body's id wins over the header
    assert len(replay.received) == 3
    assert len(sleep.waits) == 2 and 0.25 <= sleep.waits[0] <= 0.5 and 0.5 <= sleep.waits[1] <= 1.0


async def test_400_is_not_retried(replay: ReplayServer, http: httpx.AsyncClient) -> None:
    sleep = SleepRecorder()
    client = client_for("openai:gpt-4o", replay, http, sleep=sleep)
    replay.queue(Reply(400, "openai__error_400_tool_call_ids_without_tool_messages.json"))
    error = await client.complete(ModelRequest(model="gpt-4o", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError)
    assert (error.status, error.retryable, error.provider) == (400, False, "openai")
    assert "tool_call_id" in error.message
    assert len(replay.received) == 1 and sleep.waits == []


async def test_timeout_is_a_retryable_provider_error(replay: ReplayServer, http: httpx.AsyncClient) -> None:
    client = build_model_client(
        parse_model_ref("openai_responses:gpt-5"),
        settings_for(replay.url),
        http,
        max_retries=0,
        timeout=httpx.Timeout(0.2),
    )
    replay.queue(Reply(file="openai_responses__parallel_function_calls.json", delay_s=5))
    error = await client.complete(ModelRequest(model="gpt-5", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError)
    assert (error.status, error.type, error.retryable) == (None, "timeout", True)
    assert len(replay.received) == 1


async def test_connection_refused_is_a_retryable_transport_error(http: httpx.AsyncClient) -> None:
    settings = Settings(provider_env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    client = build_model_client(parse_model_ref("openai:gpt-4o"), settings, http, max_retries=0)
    error = await client.complete(ModelRequest(model="gpt-4o", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError)
    assert (error.status, error.type, error.retryable) == (None, "transport_error", True)


async def test_scripted_model_through_the_same_adapter(http: httpx.AsyncClient) -> None:
    async with ScriptedServer() as base_url:
        client = build_model_client(
            parse_model_ref("scripted:demo"), Settings(), http, scripted_base_url=base_url
        )
        history: list[Message] = [UserMessage(content="What is 6 plus 7, and 6 times 7?")]
        asked = await client.complete(
            ModelRequest(model="demo", messages=history, tools=TOOLS, id_prefix="t1_1")
        )
        assert isinstance(asked, Turn) and asked.provider == "scripted"
        assert {c.name for c in asked.tool_calls} == {"add", "multiply"}
        history += [
            assistant_message_from_turn(asked),
            *[
                ToolMessage(tool_call_id=c.id, name=c.name, content=str(c.arguments))
                for c in asked.tool_calls
            ],
        ]
        answered = await client.complete(ModelRequest(model="demo", messages=history, tools=TOOLS))
        assert isinstance(answered, Turn) and answered.type == "final_answer"
        assert "multiply(a=6, b=7)" in (answered.text or "")


async def test_scripted_error_round_is_retried_by_the_adapter_honouring_retry_after(
    http: httpx.AsyncClient,
) -> None:
    plan = {
        "plan": [{"error": {"status": 503, "message": "busy", "retry_after": 1, "times": 1}}, {"text": "ok"}]
    }
    sleep = SleepRecorder()
    async with ScriptedServer() as base_url:
        client = build_model_client(
            parse_model_ref("scripted:plan"), Settings(), http, scripted_base_url=base_url
        )
        assert isinstance(client, HttpModelClient)
        client.sleep = sleep
        turn = await client.complete(
            ModelRequest(model="plan", messages=[UserMessage(content=json.dumps(plan))])
        )
    assert isinstance(turn, Turn) and turn.text == "ok"
    assert sleep.waits == [1.0]
