"""The scripted model over HTTP: an OpenAI-compatible server around its brain (`scripted.brain`).

`POST /v1/chat/completions` (non-streaming, or SSE when `stream: true`) and `GET /v1/models`. Run it
inside the current event loop with `async with ScriptedServer() as base_url:` (a free 127.0.0.1 port;
`base_url` ends in `/v1`, as OPENAI_BASE_URL does), or as its own process with
`python -m orchestrator.providers.scripted.server --port P`, which prints `listening on <base_url>` once it
accepts connections. A streamed answer goes out a word or so a chunk; `chunk_delay_s` (`--stream-delay`,
TOOLLOOP_SCRIPTED_STREAM_DELAY_S for the orchestrator's own server) pauses between chunks so that the answer
is seen being written.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import typer
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator.providers.scripted.brain import build_models_list, build_reply, request_fingerprint
from orchestrator.providers.scripted.wire import build_error_reply, build_stream_chunks

_STREAM_FIELDS = frozenset({"stream", "stream_options"})


def build_app(
    chunk_delay_s: float = 0.0, *, amend: Callable[[dict[str, Any]], None] | None = None
) -> Starlette:
    """The Starlette app. It counts identical requests so that a plan's error round can let a retry pass;
    a streamed answer waits `chunk_delay_s` between its chunks; `amend` changes each answer (a completion
    body) in place before it goes out, streamed or not."""
    attempts: Counter[str] = Counter()

    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reply = build_error_reply(400, f"request body is not valid JSON: {exc}")
            return JSONResponse(reply.body, status_code=reply.status)
        # Streamed or not, a request is the same request: a retry counts as one however it asks.
        asked = {k: v for k, v in body.items() if k not in _STREAM_FIELDS} if isinstance(body, dict) else body
        fingerprint = request_fingerprint(asked)
        reply = build_reply(body, attempt=attempts[fingerprint], created=int(time.time()))
        attempts[fingerprint] += 1
        if reply.status != 200:
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        if amend is not None:
            amend(reply.body)
        if isinstance(body, dict) and body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            chunks = build_stream_chunks(reply.body, include_usage=include_usage)
            return StreamingResponse(_sse(chunks, chunk_delay_s), media_type="text/event-stream")
        return JSONResponse(reply.body)

    async def models(_: Request) -> Response:
        return JSONResponse(build_models_list())

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


async def _sse(chunks: list[dict[str, Any]], delay_s: float) -> AsyncIterator[bytes]:
    for number, chunk in enumerate(chunks):
        if delay_s and number:
            await asyncio.sleep(delay_s)
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _bind(host: str, port: int) -> socket.socket:
    # Binding before uvicorn starts gives the real port at once (port 0 = any free one) with no race.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class ScriptedServer:
    """Runs the scripted model with uvicorn inside the current event loop; yields its `/v1` base URL."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, chunk_delay_s: float = 0.0) -> None:
        self._host = host
        self._port = port
        self.chunk_delay_s = chunk_delay_s
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.base_url = ""

    async def __aenter__(self) -> str:
        self._socket = _bind(self._host, self._port)
        port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.chunk_delay_s), lifespan="off", log_level="warning", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raises why it could not start
                raise RuntimeError("scripted server stopped before it started")
            await asyncio.sleep(0.01)
        self.base_url = f"http://{self._host}:{port}/v1"
        return self.base_url

    async def wait(self) -> None:
        """Return when the server stops (uvicorn stops it on SIGINT/SIGTERM)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
        if self._socket is not None:
            self._socket.close()


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(0, help="Port; 0 picks a free one."),
    stream_delay: float = typer.Option(
        0.0, "--stream-delay", min=0.0, help="Seconds between the chunks of a streamed answer."
    ),
) -> None:
    """Serve the scripted model in the foreground until interrupted (SIGINT/SIGTERM)."""

    async def run() -> None:
        server = ScriptedServer(host, port, chunk_delay_s=stream_delay)
        async with server as base_url:
            print(f"listening on {base_url}", flush=True)
            await server.wait()

    asyncio.run(run())


if __name__ == "__main__":
    typer.run(serve)
