"""The streaming HTTP path: one POST whose answer is read as it arrives, deltas sent on the way.

`HttpModelClient.complete(request, on_delta)` comes here when the request may stream, a sink is given and
the wire module can stream. The body asks for a stream (`to_wire(request, stream=True)`); the answer is read
with `httpx.AsyncClient.stream` chunk by chunk, decoded incrementally (`SSEByteDecoder`, then the module's
`StreamReader`), and each delta is awaited on the sink in order before the next chunk is read.

What the answer can be::

    HTTP >= 400                        -> the module's error_from_wire(status, body, headers), as unstreamed
    text/event-stream, or a body that
      starts like SSE under another type
      (text/plain, application/json)   -> the stream reader's Turn, or its ProviderError (error event,
                                           malformed event, a stream cut before its end: retryable)
    anything else (a server that
      ignored `stream`)                 -> the plain body through the module's from_wire; no deltas
    httpx.TimeoutException, at once
      or mid-stream                     -> ProviderError(type="timeout", retryable=True)
    any other httpx error               -> ProviderError(type="transport_error", retryable=True)

Retries follow the client's RetryPolicy as `post_json`'s do, except that a call which already sent a delta
is never retried here: its error goes back to the caller, whose state machine retries (and tells a viewer
to drop what was shown). A sink that raises is a broken preview, not a failed call: it is logged and sent
nothing more, and the Turn still comes back.
"""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import decode_json, decode_text, invalid_response
from orchestrator.providers.common import IdSource, SSEEvent, transport_error
from orchestrator.providers.deltas import Delta, DeltaSink
from orchestrator.providers.sending import build_headers, encode_body
from orchestrator.providers.stream_reader import EventDecoder, SSEByteDecoder, StreamReader

if TYPE_CHECKING:
    from orchestrator.providers.base import HttpModelClient, ModelRequest, StreamingWireFormat

log = logging.getLogger("toolloop.orchestrator")

# A body without an SSE content type is sniffed from its first bytes: SSE lines start with one of these.
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")
_SNIFF_BYTES = 8


@dataclass
class _Sink:
    """The caller's sink, counting what it was sent; a sink that raised is sent nothing more."""

    on_delta: DeltaSink
    provider: str
    sent: int = 0
    broken: bool = False

    async def send(self, delta: Delta) -> None:
        if self.broken:
            return
        self.sent += 1
        try:
            await self.on_delta(delta)
        except Exception:
            self.broken = True
            log.warning(
                "%s: the delta sink failed; the call goes on without it", self.provider, exc_info=True
            )


async def call_stream(
    client: HttpModelClient, wire: StreamingWireFormat, request: ModelRequest, on_delta: DeltaSink
) -> Turn | ProviderError:
    """One streamed LLM call through `client`, retried per its policy until a delta was sent; never raises."""
    body = wire.to_wire(request, stream=True)
    sink = _Sink(on_delta, client.provider)
    retry_number = 0
    while True:
        ids = IdSource(request.id_prefix) if request.id_prefix else None
        result = await _stream_once(client, wire, request, body, ids=ids, sink=sink)
        if not isinstance(result, ProviderError) or sink.sent:
            return result
        retry_number += 1
        delay = client.retry.delay_s(retry_number, result)
        if delay is None:
            return result
        await client.sleep(delay)


async def _stream_once(
    client: HttpModelClient,
    wire: StreamingWireFormat,
    request: ModelRequest,
    body: dict[str, object],
    *,
    ids: IdSource | None,
    sink: _Sink,
) -> Turn | ProviderError:
    url = client.build_url(request, stream=True)
    content = encode_body(body)
    headers = await build_headers(client.provider, url, client.headers, content, client.auth)
    if isinstance(headers, ProviderError):
        return headers
    on_answer = client.build_answer_hook(request)
    try:
        async with client.http.stream(
            "POST", url, content=content, headers=headers, timeout=client.timeout
        ) as response:
            if on_answer is not None:
                on_answer(response.status_code, response.headers)
            if response.status_code >= 400:
                await response.aread()
                return wire.error_from_wire(response.status_code, read_error_body(response), response.headers)
            return await _read_answer(response, wire, request, ids, sink)
    except httpx.TimeoutException as exc:
        error = transport_error(client.provider, f"request to {url} timed out ({type(exc).__name__})")
        return error.model_copy(update={"type": "timeout"})
    except httpx.HTTPError as exc:
        return transport_error(client.provider, f"request to {url} failed: {type(exc).__name__}: {exc}")


def read_error_body(response: httpx.Response) -> object:
    """An error answer's body: its JSON when it is JSON, else its text (read already)."""
    try:
        return json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return response.text


async def _read_answer(
    response: httpx.Response,
    wire: StreamingWireFormat,
    request: ModelRequest,
    ids: IdSource | None,
    sink: _Sink,
) -> Turn | ProviderError:
    chunks = response.aiter_bytes()
    content_type = response.headers.get("content-type", "")
    try:
        return await _read_chunks(chunks, content_type, wire, request, ids=ids, sink=sink)
    finally:
        # An answer read only in part (an error event, a failed stream) leaves its iterator open.
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


async def _read_chunks(
    chunks: AsyncIterator[bytes],
    content_type: str,
    wire: StreamingWireFormat,
    request: ModelRequest,
    *,
    ids: IdSource | None,
    sink: _Sink,
) -> Turn | ProviderError:
    content_type = content_type.lower()
    framed = _framed_decoder(wire, content_type)
    if framed is not None:
        return await _read_events(chunks, b"", wire.stream_reader(request), ids, sink, decoder=framed)
    if content_type.startswith("text/event-stream"):
        return await _read_events(chunks, b"", wire.stream_reader(request), ids, sink)
    # Any other type is sniffed, JSON's too: servers label their streams text/plain or application/json.
    head = b""
    async for chunk in chunks:
        head += chunk
        if len(head.lstrip()) >= _SNIFF_BYTES:
            break
    if head.removeprefix(codecs.BOM_UTF8).lstrip().startswith(_SSE_STARTS):
        return await _read_events(chunks, head, wire.stream_reader(request), ids, sink)
    rest = [chunk async for chunk in chunks]
    text = decode_text(b"".join([head, *rest]), sink.provider)
    if isinstance(text, ProviderError):
        return text
    decoded = decode_json(text, sink.provider)
    return decoded if isinstance(decoded, ProviderError) else wire.from_wire(decoded, ids=ids)


def _framed_decoder(wire: StreamingWireFormat, content_type: str) -> EventDecoder | None:
    """The wire module's own decoder when the answer has its stream's content type (Bedrock's binary
    event stream), else None (SSE, or a plain body)."""
    stream_type = getattr(wire, "STREAM_CONTENT_TYPE", None)
    build = getattr(wire, "stream_decoder", None)
    if isinstance(stream_type, str) and build is not None and content_type.startswith(stream_type):
        decoder: EventDecoder = build()
        return decoder
    return None


async def _read_events(
    chunks: AsyncIterator[bytes],
    head: bytes,
    reader: StreamReader,
    ids: IdSource | None,
    sink: _Sink,
    *,
    decoder: EventDecoder | None = None,
) -> Turn | ProviderError:
    decoder = decoder or SSEByteDecoder()
    try:
        if head and await _deliver(decoder.feed(head), reader, sink):
            return reader.finish(ids)
        async for chunk in chunks:
            if await _deliver(decoder.feed(chunk), reader, sink):
                return reader.finish(ids)
    except UnicodeDecodeError as exc:
        return invalid_response(sink.provider, f"event stream is not UTF-8 ({exc.reason})")
    except ValueError as exc:
        # A framed stream's broken frame (a bad checksum, an impossible length).
        return invalid_response(sink.provider, f"malformed event stream: {exc}")
    try:
        last = decoder.close()
    except UnicodeDecodeError:
        # The body stopped inside a character: the stream was cut, whatever its last event says.
        return invalid_response(sink.provider, "event stream ended inside a character", retryable=True)
    except ValueError as exc:
        # The body stopped inside a frame.
        return invalid_response(sink.provider, f"event stream cut: {exc}", retryable=True)
    await _deliver(last, reader, sink)
    return reader.finish(ids)


async def _deliver(events: list[SSEEvent], reader: StreamReader, sink: _Sink) -> bool:
    """Send the deltas of `events` in order; True once the stream has failed (stop reading)."""
    for event in events:
        for delta in reader.add(event):
            await sink.send(delta)
        if reader.error is not None:
            return True
    return False
