"""A model server that goes silent fails the call after `TOOLLOOP_MODEL_TIMEOUT_S`, as a retryable timeout.

A real socket server that accepts the request and never answers (or answers half a stream, then nothing):
the call comes back as `ProviderError(type="timeout", retryable=True)` once the setting's time has passed
without a byte, on the transport the orchestrator uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from orchestrator.model import ProviderError, UserMessage
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.registry import ModelClients
from orchestrator.providers.transport import build_model_http
from orchestrator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
# An answer that promises far more than it sends: the stream stops after its first event.
HALF_A_STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100000\r\n\r\n" + EVENT
)


@pytest.fixture(params=["silent", "half_a_stream"])
async def silent_server(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    released = asyncio.Event()
    handlers: list[asyncio.Task[None]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if request.param == "half_a_stream":
            writer.write(HALF_A_STREAM)
            await writer.drain()
        await released.wait()  # and nothing more until the test is over, the connection open
        writer.close()

    def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.ensure_future(answer(reader, writer)))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1"
        released.set()
        await asyncio.gather(*handlers, return_exceptions=True)


async def test_a_silent_model_server_fails_the_call_after_the_setting(silent_server: str) -> None:
    settings = Settings(
        redis_url="redis://127.0.0.1:1/0", scripted_base_url=silent_server, model_timeout_s=0.5
    )
    async with build_model_http() as http:
        client = await ModelClients(settings, http, max_retries=0).get("scripted:demo")
        deltas: list[object] = []

        async def sink(delta: object) -> None:
            deltas.append(delta)

        request = ModelRequest(model="scripted:demo", messages=[UserMessage(content="hi")])
        result = await client.complete(request, sink)
    assert isinstance(result, ProviderError), result
    assert (result.type, result.retryable) == ("timeout", True), result.message
    assert "ReadTimeout" in result.message
