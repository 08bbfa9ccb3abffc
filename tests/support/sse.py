"""Reading a server-sent events stream as a client does (httpx), for the API's SSE tests.

    stream = await read_sse(http, f"/v1/turns/{turn_id}/events")
    assert stream.names[-1] == "turn_finished"
    live = SseStream(0)
    reading = asyncio.create_task(follow_sse(http, path, live))   # `live` fills as the lines come
    for message in iter_sse(reply.iter_lines()): ...               # a sync reply's, or a body's lines

Each message is parsed by the SSE rules (fields `id`, `event`, `data`; a blank line ends a message; a line
starting with `:` is a comment, kept in `comments`). Transport errors propagate: a test that must see a
stream survive counts any error as a failure.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class SseMessage:
    """One message of a stream."""

    id: str | None
    event: str | None
    data: str

    def json(self) -> Any:
        """`data` parsed as JSON."""
        return json.loads(self.data)


@dataclass
class SseStream:
    """What one request to an SSE endpoint returned."""

    status: int
    messages: list[SseMessage] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    body: str = ""

    @property
    def names(self) -> list[str]:
        """The `event` of each message."""
        return [m.event or "message" for m in self.messages]

    @property
    def ids(self) -> list[str]:
        """The `id` of each message."""
        return [m.id or "" for m in self.messages]


def parse_sse_line(line: str, pending: dict[str, str], stream: SseStream) -> None:
    """Apply one SSE line: a field goes into `pending`; a comment or a finished message into `stream`."""
    if not line:
        if pending:
            data = pending.get("data", "")
            stream.messages.append(SseMessage(pending.get("id"), pending.get("event"), data))
            pending.clear()
        return
    if line.startswith(":"):
        stream.comments.append(line[1:].strip())
        return
    name, _, value = line.partition(":")
    value = value.removeprefix(" ")
    pending[name] = f"{pending['data']}\n{value}" if name == "data" and "data" in pending else value


def iter_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """The messages of an SSE body's `lines` (a sync reply's `iter_lines()`, a body's `splitlines()`), each
    as soon as it is complete."""
    stream = SseStream(0)
    pending: dict[str, str] = {}
    for line in itertools.chain(lines, [""]):
        parse_sse_line(line, pending, stream)
        yield from stream.messages
        stream.messages.clear()


async def follow_sse(
    http: httpx.AsyncClient,
    path: str,
    stream: SseStream,
    headers: Mapping[str, str] | None = None,
    on_message: Callable[[SseMessage], None] | None = None,
) -> SseStream:
    """GET `path` and read its stream to the end into `stream` as the lines come, so that a test can look
    at a stream still open; a non-200 reply leaves its body in `stream.body`."""
    async with http.stream("GET", path, headers=dict(headers or {})) as reply:
        stream.status = reply.status_code
        if reply.status_code != 200:
            stream.body = (await reply.aread()).decode(errors="replace")
            return stream
        pending: dict[str, str] = {}
        async for line in reply.aiter_lines():
            before = len(stream.messages)
            parse_sse_line(line, pending, stream)
            if on_message is not None and len(stream.messages) > before:
                on_message(stream.messages[-1])
        parse_sse_line("", pending, stream)
    return stream


async def read_sse(
    http: httpx.AsyncClient,
    path: str,
    headers: Mapping[str, str] | None = None,
    on_message: Callable[[SseMessage], None] | None = None,
) -> SseStream:
    """GET `path` and read its stream to the end; a non-200 reply is returned with its body."""
    return await follow_sse(http, path, SseStream(0), headers, on_message)
