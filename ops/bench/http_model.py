"""A fast OpenAI-compatible model server for the benchmark's HTTP variant, as its own process.

The scripted brain (`providers.scripted.brain.build_reply`) behind `POST /v1/chat/completions`, as the
shipped scripted server (`providers.scripted.server`) serves it — a plain body, or SSE chunks when the request
asks for a stream — with two differences that the benchmark needs:

- every tool call gets a random id, as real providers give them (`instant.give_unique_ids`), rather than the
  brain's per-round numbers (`call_r1_0`): the id is in every key and message of the call, so its length and
  its spread are those of production;
- no pause between chunks and no count of identical requests (the benchmark's plans have no error round).

It runs apart from the orchestrator so that the model's CPU is the model server's, not the orchestrator's,
and the orchestrator pays exactly what it pays in production: building the request, the socket, reading the
answer.

    python -m ops.bench.http_model --port P      # http://127.0.0.1:P/v1; ready when GET /v1/models answers
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import typer
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ops.bench.instant import give_unique_ids
from ops.bench.procs import Proc
from ops.redis_server import find_free_port
from orchestrator.providers.scripted.brain import build_models_list, build_reply
from orchestrator.providers.scripted.wire import build_error_reply, build_stream_chunks

HOST = "127.0.0.1"


def build_app() -> Starlette:
    """The Starlette app of the bench's model server."""

    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reply = build_error_reply(400, f"request body is not valid JSON: {exc}")
            return JSONResponse(reply.body, status_code=reply.status)
        reply = build_reply(body, created=int(time.time()))
        if reply.status != 200:
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        give_unique_ids(reply.body)
        if isinstance(body, dict) and body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            chunks = build_stream_chunks(reply.body, include_usage=include_usage)
            return StreamingResponse(_sse(chunks), media_type="text/event-stream")
        return JSONResponse(reply.body)

    async def models(_: Request) -> Response:
        return JSONResponse(build_models_list())

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


async def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
    yield b"data: [DONE]\n\n"


class ModelServer:
    """The model server subprocess; `base_url` ends in `/v1`, as OPENAI_BASE_URL does."""

    def __init__(self) -> None:
        self.port = find_free_port(HOST)
        self.base_url = f"http://{HOST}:{self.port}/v1"
        command = [sys.executable, "-m", "ops.bench.http_model", f"--port={self.port}"]
        self.proc = Proc(command, {}, "model")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until `GET /v1/models` answers (an orchestrator may start before: it calls no model then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"model server exited early:\n{self.proc.log_text()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"model server not ready after {timeout_s} s:\n{self.proc.log_text()}")


def serve(port: int = typer.Option(..., help="Port on 127.0.0.1.")) -> None:
    """Serve until SIGTERM/SIGINT."""
    uvicorn.run(build_app(), host=HOST, port=port, lifespan="off", log_level="warning", access_log=False)


if __name__ == "__main__":
    typer.run(serve)
