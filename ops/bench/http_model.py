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

A request whose prompt holds a first-token marker (`first-token-<32 hex digits>`, `first_token`) is answered
as a hosted model answers instead: after `--first-byte-delay-s` (its time to the first token), then, streamed,
a piece every `--piece-delay-s`, or, not streamed, whole once the same pieces would have been written. The
time of its first byte (the response head with the first piece of the answer, in one write) goes to
`--first-byte-log` as a JSON line `{"marker", "first_byte_at"}` (Unix time, s): what the first-token overhead
is measured from.

    python -m ops.bench.http_model --port P      # http://127.0.0.1:P/v1; ready when GET /v1/models answers
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from ops.bench.instant import give_unique_ids
from ops.bench.procs import Proc
from orchestrator.providers.scripted.brain import build_models_list, build_reply
from orchestrator.providers.scripted.wire import build_error_reply, build_stream_chunks
from orchestrator.redis_server import find_free_port

HOST = "127.0.0.1"
# What ties a request to its turn in the first-byte log: a marker the bench puts in the turn's prompt.
FIRST_TOKEN_MARKER = re.compile(rb"first-token-([0-9a-f]{32})")
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


@dataclass(frozen=True)
class HostedPace:
    """How a request with a first-token marker is answered: at a hosted model's pace, first byte logged."""

    first_byte_log: Path
    first_byte_delay_s: float
    piece_delay_s: float


class ModelServer:
    """The model server subprocess; `base_url` ends in `/v1`, as OPENAI_BASE_URL does. With `pace`, requests
    carrying a first-token marker are answered at that pace and their first byte logged."""

    def __init__(self, pace: HostedPace | None = None) -> None:
        self.port = find_free_port(HOST)
        self.base_url = f"http://{HOST}:{self.port}/v1"
        self.pace = pace
        command = [sys.executable, "-m", "ops.bench.http_model", f"--port={self.port}"]
        if pace is not None:
            command += [
                f"--first-byte-log={pace.first_byte_log}",
                f"--first-byte-delay-s={pace.first_byte_delay_s}",
                f"--piece-delay-s={pace.piece_delay_s}",
            ]
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

    def __init__(self, pace: HostedPace | None = None) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pace = pace
        # The paced answers under way: a reference keeps each task alive until it ends.
        self._paced: set[asyncio.Task[None]] = set()

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
        streamed = isinstance(body, dict) and body.get("stream") is True
        marker = FIRST_TOKEN_MARKER.search(raw)
        if marker is not None and self._pace is not None:
            task = asyncio.get_running_loop().create_task(
                self._answer_paced(self._pace, marker.group(0).decode(), body, reply.body, streamed=streamed)
            )
            self._paced.add(task)
            task.add_done_callback(self._paced.discard)
            return
        if not streamed:
            self._send_json(200, reply.body)
            return
        assert self._transport is not None
        write = self._transport.write
        write(_STREAM_HEAD)
        for chunk in _stream_chunks(body, reply.body):
            write(chunk)
        write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def _answer_paced(
        self, pace: HostedPace, marker: str, body: Any, completion: Any, *, streamed: bool
    ) -> None:
        assert self._transport is not None
        chunks = _stream_chunks(body, completion)
        await asyncio.sleep(pace.first_byte_delay_s)
        if not streamed:
            # A model asked for the whole answer sends it once it has written all of it.
            await asyncio.sleep(pace.piece_delay_s * max(0, len(chunks) - 2))
            first_byte_at = time.time()
            self._send_json(200, completion)
            _log_first_byte(pace.first_byte_log, marker, first_byte_at)
            return
        # The role chunk and the answer's first piece go out with the head: the first byte is the answer's.
        first_byte_at = time.time()
        self._transport.write(_STREAM_HEAD + b"".join(chunks[:2]))
        _log_first_byte(pace.first_byte_log, marker, first_byte_at)
        for chunk in chunks[2:]:
            await asyncio.sleep(pace.piece_delay_s)
            if self._transport.is_closing():
                return
            self._transport.write(chunk)
        self._transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

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


def _stream_chunks(body: Any, completion: Any) -> list[bytes]:
    # Each SSE chunk of the streamed answer, framed as a chunk of the body.
    options = body.get("stream_options") if isinstance(body, dict) else None
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return [
        _chunk(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
        for chunk in build_stream_chunks(completion, include_usage=include_usage)
    ]


def _log_first_byte(path: Path, marker: str, first_byte_at: float) -> None:
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps({"marker": marker, "first_byte_at": first_byte_at}) + "\n")


def read_first_bytes(path: Path) -> dict[str, float]:
    """The first-byte log: each marker's first byte (Unix time, s); the first line of a marker wins."""
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                found.setdefault(str(entry["marker"]), float(entry["first_byte_at"]))
    return found


async def _serve_forever(port: int, pace: HostedPace | None) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: ModelProtocol(pace), HOST, port)
    async with server:
        await server.serve_forever()


def serve(
    port: int = typer.Option(..., help="Port on 127.0.0.1."),
    first_byte_log: Annotated[
        Path | None, typer.Option(help="Log marked requests' first bytes here.")
    ] = None,
    first_byte_delay_s: Annotated[float, typer.Option(help="A marked request's time to first byte.")] = 0.0,
    piece_delay_s: Annotated[float, typer.Option(help="Between a marked answer's pieces.")] = 0.0,
) -> None:
    """Serve until SIGTERM/SIGINT."""
    pace = None if first_byte_log is None else HostedPace(first_byte_log, first_byte_delay_s, piece_delay_s)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(port, pace))


if __name__ == "__main__":
    typer.run(serve)
