"""A fast OpenAI-compatible model server for the benchmark's HTTP variant, as its own process.

The scripted brain's answers (`providers.scripted.brain.build_reply`: a plain body, or SSE chunks when the
request asks for a stream, `wire.build_stream_chunks`, no pause between them), with one change the
benchmark needs: every tool call gets a random id, as real providers give them (`instant.give_unique_ids`),
rather than the brain's per-round numbers (`call_r1_0`): the id is in every key and message of the call, so
its length and its spread are those of production.

It runs apart from the orchestrator so that the model's CPU is the model server's, not the orchestrator's,
and the orchestrator pays exactly what it pays in production: building the request, the socket, reading the
answer. A real model runs on other machines; this one shares the bench's two cores with everything measured,
so it is served by a bare asyncio protocol (HTTP/1.1, keep-alive, `Content-Length` requests) rather than an
ASGI stack: what it costs is taken from the processes measured, in the throughput phase only. Each SSE chunk
is still its own chunk of the body and its own write, as a model server streaming what it generates sends
it: what the orchestrator reads is what it would read from a real one. Only what the bench asks is served:
`POST /v1/chat/completions` and `GET /v1/models` (no attempt counting: the bench's plans have no error
rounds).

    python -m ops.bench.http_model --port P      # http://127.0.0.1:P/v1; ready when GET /v1/models answers
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from http import HTTPStatus
from typing import Any

import httpx
import typer

from ops.bench.instant import give_unique_ids
from ops.bench.procs import Proc
from orchestrator.providers.scripted.brain import build_models_list, build_reply
from orchestrator.providers.scripted.wire import build_error_reply, build_stream_chunks
from orchestrator.redis_server import find_free_port

HOST = "127.0.0.1"


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


class ModelProtocol(asyncio.Protocol):
    """One connection: each request read once whole (head, then `Content-Length` bytes), answered in turn."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            length = _content_length(head[1:])
            if len(self._buffer) < end + 4 + length:
                return
            body = bytes(self._buffer[end + 4 : end + 4 + length])
            del self._buffer[: end + 4 + length]
            self._answer(head[0], body)

    def _answer(self, request_line: str, body: bytes) -> None:
        assert self._transport is not None
        method, _, rest = request_line.partition(" ")
        path = rest.partition(" ")[0]
        if method == "GET" and path == "/v1/models":
            self._send_json(200, build_models_list())
        elif method == "POST" and path == "/v1/chat/completions":
            self._complete(body)
        else:
            self._send_json(404, build_error_reply(404, f"no route {method} {path}").body)

    def _complete(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reply = build_error_reply(400, f"request body is not valid JSON: {exc}")
            self._send_json(reply.status, reply.body)
            return
        reply = build_reply(body, created=int(time.time()))
        if reply.status != 200:
            self._send_json(reply.status, reply.body)
            return
        give_unique_ids(reply.body)
        if not (isinstance(body, dict) and body.get("stream") is True):
            self._send_json(200, reply.body)
            return
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        chunks = build_stream_chunks(reply.body, include_usage=include_usage)
        assert self._transport is not None
        write = self._transport.write
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for chunk in chunks:
            write(_chunk(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()))
        write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def _send_json(self, status: int, body: Any) -> None:
        assert self._transport is not None
        data = json.dumps(body).encode()
        reason = HTTPStatus(status).phrase
        head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
        self._transport.write(head.encode() + b"\r\n\r\n" + data)


def _content_length(header_lines: list[str]) -> int:
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return int(value.strip())
    return 0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_forever(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(ModelProtocol, HOST, port)
    async with server:
        await server.serve_forever()


def serve(port: int = typer.Option(..., help="Port on 127.0.0.1.")) -> None:
    """Serve until SIGTERM/SIGINT."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(port))


if __name__ == "__main__":
    typer.run(serve)
