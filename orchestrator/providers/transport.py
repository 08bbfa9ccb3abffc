"""The HTTP/1.1 transport of the orchestrator's model calls: an httpx transport with a keyed idle pool.

httpx's default transport (httpcore's pool) looks at every connection of the pool for every request it
places, and asks each whether it expired — a readability poll of its socket through anyio's attribute
lookups. An orchestrator has as many model calls in flight as it has turns asking their model, so that
work grows with its load: in the bench's HTTP variant, with 20 calls in flight, a model call cost 3.2 ms of
CPU against 1.3 ms with one, most of the difference in that scan (py-spy). The pool also caps an
orchestrator at 100 connections, so its 101st concurrent model call waited for one to free up.

`ModelTransport` keeps what a model call needs and nothing it pays for per request: idle connections in a
deque per origin (take the most recent, O(1); one older than `idle_s`, or one whose end the server has sent,
is dropped when met), the request written in one write (head and body together: one loopback send instead of
two), the answer read as the caller reads it (its head through h11, a chunked body per read by
`chunked.ChunkedDecoder`), and at most `max_connections` requests in flight, each on a connection of its own
(a call beyond waits, up to the request's pool timeout; idle connections hold no slot). A request is never
sent twice: a connection the server closes as it is reused fails the call with httpx's error, as httpcore's
does, and the model call's retry policy decides — a server that read a POST before it closed may have started
(and billed) the work. Errors are httpx's own exceptions, so callers handle them as they always did.

Only `http://` and `https://` origins come here, and no proxy: with `HTTP(S)_PROXY` set, `build_model_http`
gives httpx's own transport, which goes through it.
"""

from __future__ import annotations

import asyncio
import collections
import select
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import h11
import httpx

from orchestrator.providers.chunked import ChunkedDecoder, is_chunked, keeps_alive

Origin = tuple[str, str, int]
DEFAULT_PORTS = {"http": 80, "https": 443}
READ_BYTES = 64 * 1024
# Idle connections older than this are closed rather than reused: below the 5 s after which common servers
# (uvicorn, httpx's own default) close theirs, so that a reuse rarely meets a connection closing under it.
DEFAULT_IDLE_S = 4.0
DEFAULT_MAX_CONNECTIONS = 1000
_CUT = "the server closed the connection before its answer ended"


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    http: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def is_usable(self, now: float, idle_s: float) -> bool:
        if now - self.idle_since >= idle_s or self.reader.at_eof() or self.writer.is_closing():
            return False
        # The server's close may be in the socket before the event loop has read it: an idle HTTP/1.1
        # connection with anything to read (its end, or bytes nobody asked for) is not one to send on.
        return not _has_input(self.writer)

    def close(self) -> None:
        self.writer.close()


@asynccontextmanager
async def _limit(
    seconds: float | None, error: type[httpx.TimeoutException], request: httpx.Request
) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise error(f"{error.__name__}: no progress in {seconds} s", request=request) from None


class ModelTransport(httpx.AsyncBaseTransport):
    """httpx transport for model calls: HTTP/1.1, per-origin idle deques, one write per request."""

    def __init__(
        self,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_s: float = DEFAULT_IDLE_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._idle: dict[Origin, collections.deque[_Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._idle_s = idle_s
        self._ssl_context = ssl_context
        self._closed = False

    @property
    def idle_connections(self) -> int:
        """How many connections wait in the pool for their next request."""
        return sum(len(idle) for idle in self._idle.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the model transport is closed")
        timeouts = request.extensions.get("timeout", {})
        origin = _origin(request)
        body = await request.aread()
        if self._slots.locked():  # every slot taken: wait for one, up to the pool timeout
            async with _limit(timeouts.get("pool"), httpx.PoolTimeout, request):
                await self._slots.acquire()
        else:
            await self._slots.acquire()
        try:
            connection, answer = await self._exchange(request, origin, body, timeouts)
        except BaseException:
            self._slots.release()
            raise
        stream = _Body(self, origin, connection, request, timeouts.get("read"))
        if is_chunked(request.method.encode(), answer):
            stream.decode_chunks(keep_alive=keeps_alive(request.headers.raw, answer))
        return httpx.Response(
            answer.status_code,
            headers=answer.headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": bytes(answer.reason)},
        )

    async def _exchange(
        self, request: httpx.Request, origin: Origin, body: bytes, timeouts: dict[str, float | None]
    ) -> tuple[_Connection, h11.Response]:
        connection = self._take(origin) or await self._connect(origin, request, timeouts.get("connect"))
        try:
            await _send(connection, request, body, timeouts.get("write"))
            return connection, await _read_head(connection, request, timeouts.get("read"))
        except BaseException:
            connection.close()
            raise

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.is_usable(now, self._idle_s):
                return connection
            connection.close()
        return None

    def release(self, origin: Origin, connection: _Connection | None) -> None:
        """A request's answer has been read or dropped: its connection back to the pool (or closed)."""
        self._slots.release()
        if connection is None:
            return
        if self._closed:
            connection.close()
            return
        now = time.monotonic()
        connection.idle_since = now
        idle = self._idle.setdefault(origin, collections.deque())
        # The oldest idle connection is at the left: closed here once expired, so that a burst's connections
        # do not stay open after the burst.
        while idle and now - idle[0].idle_since >= self._idle_s:
            idle.popleft().close()
        idle.append(connection)

    async def _connect(self, origin: Origin, request: httpx.Request, limit_s: float | None) -> _Connection:
        scheme, host, port = origin
        context = self._tls() if scheme == "https" else None
        try:
            async with _limit(limit_s, httpx.ConnectTimeout, request):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host if context else None, limit=READ_BYTES
                )
        except OSError as exc:  # ssl.SSLError included
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        return _Connection(reader, writer)

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            # httpx's verified context (certifi, or SSL_CERT_FILE / SSL_CERT_DIR), built once: it costs ms.
            self._ssl_context = httpx.create_ssl_context()
        return self._ssl_context

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()


def _has_input(writer: asyncio.StreamWriter) -> bool:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def build_model_http(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> httpx.AsyncClient:
    """The HTTP client an orchestrator's model calls share, on a `ModelTransport`; on httpx's own transport
    when the environment names a proxy (`HTTP(S)_PROXY`, `ALL_PROXY`), which httpx honours only there."""
    if urllib.request.getproxies():
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        return httpx.AsyncClient(limits=limits)
    return httpx.AsyncClient(transport=ModelTransport(max_connections=max_connections))


class _Body(httpx.AsyncByteStream):
    """An answer's body as the caller reads it; closing gives the connection back when it can be reused."""

    def __init__(
        self,
        transport: ModelTransport,
        origin: Origin,
        connection: _Connection,
        request: httpx.Request,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: _Connection | None = connection
        self._request = request
        self._read_timeout = read_timeout
        self._released = False
        # Set for a chunked answer: its body is decoded here, not by h11 (`chunked`).
        self._chunks: ChunkedDecoder | None = None
        self._keep_alive = False

    def decode_chunks(self, *, keep_alive: bool) -> None:
        """Read the body's chunked coding here: what h11 received past the head is its start.
        `keep_alive`: the two heads let the connection serve another request once the body has ended."""
        self._chunks = ChunkedDecoder()
        self._keep_alive = keep_alive

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        if self._chunks is not None:
            async for data in self._decode(connection, self._chunks):
                yield data
            return
        try:
            # A body framed by its length or its end: h11 hands on what each read brought as one Data.
            while True:
                event = await _next_event(connection, self._request, self._read_timeout)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return
        except BaseException:
            self._drop()
            raise

    async def _decode(self, connection: _Connection, chunks: ChunkedDecoder) -> AsyncIterator[bytes]:
        # Every chunk a read brought, decoded in one pass and handed on as one piece.
        try:
            data = chunks.feed(connection.http.trailing_data[0])
            while True:
                if data:
                    yield data
                if chunks.error is not None:
                    message = f"malformed HTTP answer: {chunks.error}"
                    raise httpx.RemoteProtocolError(message, request=self._request)
                if chunks.done:
                    return
                received = await _read(connection, self._request, self._read_timeout)
                if not received:
                    raise httpx.RemoteProtocolError(_CUT, request=self._request)
                data = chunks.feed(received)
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        connection = self._connection
        if connection is not None and not _reusable(connection, self._chunks, keep_alive=self._keep_alive):
            self._drop()
            connection = None
        self._connection = None
        self._transport.release(self._origin, connection)


def _reusable(connection: _Connection, chunks: ChunkedDecoder | None, *, keep_alive: bool) -> bool:
    http = connection.http
    if chunks is not None:
        # h11 saw the head only: the answer ended when its last chunk did.
        if not (keep_alive and chunks.done) or chunks.extra or http.our_state is not h11.DONE:
            return False
        connection.http = h11.Connection(h11.CLIENT)
        return True
    if http.our_state is not h11.DONE or http.their_state is not h11.DONE:
        return False
    http.start_next_cycle()
    return True


def _origin(request: httpx.Request) -> Origin:
    url = request.url
    scheme = url.scheme
    if scheme not in DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"the model transport speaks http and https, not {scheme!r}", request=request
        )
    return scheme, url.host, url.port or DEFAULT_PORTS[scheme]


async def _send(connection: _Connection, request: httpx.Request, body: bytes, limit_s: float | None) -> None:
    """Write the request, head and body, in one write."""
    http = connection.http
    try:
        head = h11.Request(
            method=request.method, target=request.url.raw_path, headers=list(request.headers.raw)
        )
        parts = [http.send(head)]
        if body:
            parts.append(http.send(h11.Data(data=body)))
        parts.append(http.send(h11.EndOfMessage()))
    except h11.LocalProtocolError as exc:  # a header HTTP/1.1 cannot carry (a line break in a value, …)
        raise httpx.LocalProtocolError(f"cannot send this request: {exc}", request=request) from exc
    try:
        connection.writer.write(b"".join(part for part in parts if part))
        async with _limit(limit_s, httpx.WriteTimeout, request):
            await connection.writer.drain()
    except OSError as exc:
        raise httpx.WriteError(f"{type(exc).__name__}: {exc}", request=request) from exc


async def _read_head(connection: _Connection, request: httpx.Request, limit_s: float | None) -> h11.Response:
    """The answer's status line and headers."""
    while True:
        event = await _next_event(connection, request, limit_s)
        if isinstance(event, h11.Response):
            return event
        # 1xx answers (100 Continue, 103 Early Hints) come before the real one.


async def _read(connection: _Connection, request: httpx.Request, limit_s: float | None) -> bytes:
    """What the next read brings (b"": the server closed the connection)."""
    try:
        async with _limit(limit_s, httpx.ReadTimeout, request):
            return await connection.reader.read(READ_BYTES)
    except OSError as exc:
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc


async def _next_event(connection: _Connection, request: httpx.Request, limit_s: float | None) -> h11.Event:
    http = connection.http
    while True:
        try:
            event = http.next_event()
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(f"malformed HTTP answer: {exc}", request=request) from exc
        if event is h11.NEED_DATA:
            http.receive_data(await _read(connection, request, limit_s))
            continue
        if isinstance(event, h11.ConnectionClosed) or not isinstance(event, h11.Event):  # PAUSED
            raise httpx.RemoteProtocolError(_CUT, request=request)
        return event
