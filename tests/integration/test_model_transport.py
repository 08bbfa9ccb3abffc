"""`ModelTransport` (the model calls' HTTP/1.1 transport) over real sockets, against a raw server per test.

The transport replaces httpcore's pool for every model call, so what httpcore did for free must hold here: a
request arrives intact and its answer reads back; connections are reused, but never one the server closed, one
that said `Connection: close`, one whose answer was not read to its end, or one idle past `idle_s`; a request
is never sent twice (a connection closed under it fails the call with httpx's error); a chunked answer is
handed over as it arrives, what one read brought as one piece; at most `max_connections` requests hold a
connection, and every way a request ends (read timeout, cancel, a cut answer, a refused connect) gives its
slot back; failures come out as httpx's own exceptions; https works with a trusted certificate and fails
without one. The server (`tests.support.http_wire`) writes what each test wants, byte by byte, and notes what
it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.providers.transport import ModelTransport, build_model_http
from tests.support.http_wire import (
    LAST_CHUNK,
    Handler,
    Seen,
    Wire,
    WireServer,
    answer,
    chunk,
    chunked_head,
    closed_port,
    json_answer,
    self_signed,
)
from tests.support.waiting import async_wait_until

# Bound on how long a server holds a chunk when the client never does its part: it then sends it anyway,
# and the test fails on its assertion rather than hanging until pytest's timeout.
HOLD_S = 10.0


def client_of(transport: ModelTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport)


def held_stream(go: asyncio.Event) -> Handler:
    """A handler sending a chunked answer's head and first chunk, and the rest once `go` is set."""

    async def handler(seen: Seen, wire: Wire) -> bool:
        await wire.send(chunked_head() + chunk(b"first"))
        await hold(go)
        await wire.send(chunk(b"second") + LAST_CHUNK)
        return True

    return handler


async def hold(go: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(go.wait(), HOLD_S)


async def silent(seen: Seen, wire: Wire) -> bool:
    await wire.until_closed()
    return False


async def test_a_post_arrives_intact_and_its_answer_reads_back() -> None:
    async def created(seen: Seen, wire: Wire) -> bool:
        await wire.send(json_answer({"echo": seen.body.decode()}, 201, [("X-Model", "m-1")]))
        return True

    async with WireServer(created) as server, client_of(ModelTransport()) as client:
        response = await client.post(server.url("/v1/chat?stream=no"), json={"q": "hi", "n": 2})
    assert response.status_code == 201
    assert response.reason_phrase == "OK"
    assert response.headers["x-model"] == "m-1"
    assert response.json() == {"echo": '{"q":"hi","n":2}'}
    [seen] = server.requests
    assert (seen.method, seen.target) == ("POST", "/v1/chat?stream=no")
    assert seen.headers["host"] == server.url().removeprefix("http://").rstrip("/")
    assert seen.headers["content-length"] == str(len(seen.body))
    assert seen.headers["content-type"] == "application/json"
    assert seen.body == b'{"q":"hi","n":2}'


@pytest.mark.parametrize("status", [429, 500])
async def test_an_error_status_comes_back_with_its_body(status: int) -> None:
    async def failing(seen: Seen, wire: Wire) -> bool:
        await wire.send(answer(status, b'{"error":"slow down"}', reason="Nope"))
        return True

    async with WireServer(failing) as server, client_of(ModelTransport()) as client:
        response = await client.get(server.url())
    assert response.status_code == status
    assert response.reason_phrase == "Nope"
    assert response.json() == {"error": "slow down"}


async def test_sequential_requests_reuse_one_connection_per_origin() -> None:
    transport = ModelTransport()
    async with WireServer() as one, WireServer() as two, client_of(transport) as client:
        for _ in range(3):
            assert (await client.get(one.url())).json()["connection"] == 0
        assert one.connections == 1
        assert transport.idle_connections == 1
        await client.get(two.url())
        await client.get(two.url())
        assert (one.connections, two.connections) == (1, 1)
        assert transport.idle_connections == 2


async def test_the_most_recently_idle_connection_is_taken_first() -> None:
    transport = ModelTransport()
    async with WireServer() as server, client_of(transport) as client:
        async with client.stream("GET", server.url()) as first:  # on connection 0
            async with client.stream("GET", server.url()) as second:  # 0 is busy: on connection 1
                await second.aread()
            await first.aread()  # 0 back to the pool last
        assert transport.idle_connections == 2
        # LIFO: the warmest connection; the other one ages towards idle_s and is closed when met.
        assert (await client.get(server.url())).json()["connection"] == 0


async def test_a_chunked_answer_is_read_as_it_arrives() -> None:
    go = asyncio.Event()
    order: list[str] = []

    async def handler(seen: Seen, wire: Wire) -> bool:
        await wire.send(chunked_head() + chunk(b"first"))
        # Until the client has the first piece (or the bound: then the order below shows it came too late).
        await hold(go)
        order.append("server sent second")
        await wire.send(chunk(b"second") + LAST_CHUNK)
        return True

    async with (
        WireServer(handler) as server,
        client_of(ModelTransport()) as client,
        client.stream("GET", server.url()) as response,
    ):
        async for piece in response.aiter_bytes():
            order.append(f"client got {piece.decode()}")
            go.set()
    assert order == ["client got first", "server sent second", "client got second"]


async def raw_pieces(
    handler: Handler, go: asyncio.Event | None = None
) -> tuple[list[bytes], httpx.HTTPError | None]:
    """The pieces `aiter_raw` hands on for a GET `handler` answers (setting `go` after each), and the error
    that ended the reading, if one did."""
    pieces: list[bytes] = []
    async with (
        WireServer(handler) as server,
        client_of(ModelTransport()) as client,
        client.stream("GET", server.url()) as response,
    ):
        try:
            async for piece in response.aiter_raw():
                pieces.append(piece)
                if go is not None:
                    go.set()
        except httpx.HTTPError as exc:
            return pieces, exc
    return pieces, None


async def test_chunks_that_arrive_together_are_handed_on_as_one_piece() -> None:
    # A streamed answer is many small chunks; each piece costs the reader a pass through httpx's layers.
    go = asyncio.Event()

    async def handler(seen: Seen, wire: Wire) -> bool:
        await wire.send(chunked_head() + chunk(b"a") + chunk(b"b") + chunk(b"c"))
        await hold(go)
        await wire.send(chunk(b"d") + chunk(b"e") + LAST_CHUNK)
        return True

    assert await raw_pieces(handler, go) == ([b"abc", b"de"], None)


async def test_data_before_a_malformed_chunk_is_handed_on_before_the_error() -> None:
    async def broken(seen: Seen, wire: Wire) -> bool:
        await wire.send(chunked_head() + chunk(b"kept") + b"zz\r\nnot a chunk\r\n")
        return False

    pieces, error = await raw_pieces(broken)
    assert pieces == [b"kept"] and isinstance(error, httpx.RemoteProtocolError)


async def test_a_request_is_never_sent_twice_when_its_connection_closes_under_it() -> None:
    async def closes_on_second(seen: Seen, wire: Wire) -> bool:
        # The first connection answers once, then closes as the next request arrives: the server read it,
        # and may have started (and billed) the work, so the call fails rather than go again.
        if seen.connection == 0 and len(server.on(0)) == 2:
            return False
        await wire.send(json_answer({"connection": seen.connection}))
        return True

    async with WireServer(closes_on_second) as server, client_of(ModelTransport(max_connections=1)) as client:
        await client.post(server.url("/a"), content=b"one")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            await client.post(server.url("/b"), content=b"two")
        # The failed connection is dropped and its slot given back: the next call works, on a new one.
        assert (await client.post(server.url("/c"), content=b"three")).json() == {"connection": 1}
    sent = [(seen.connection, seen.body) for seen in server.requests]
    assert sent == [(0, b"one"), (0, b"two"), (1, b"three")]


async def test_an_idle_connection_the_server_closed_is_not_used() -> None:
    async def answers_then_closes(seen: Seen, wire: Wire) -> bool:
        await wire.send(json_answer({"connection": seen.connection}))
        return False

    async with WireServer(answers_then_closes) as server, client_of(ModelTransport()) as client:
        await client.get(server.url())
        await async_wait_until(lambda: server.open_now == 0, "the server's close")
        assert (await client.get(server.url())).json() == {"connection": 1}
    # Sent once, on a new connection: the closed one was dropped when met.
    assert [seen.connection for seen in server.on(1)] == [1]
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    "closing",
    [
        json_answer({}, headers=[("Connection", "close")]),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + chunk(b"x")
        + LAST_CHUNK,
    ],
    ids=["content-length", "chunked"],
)
async def test_connection_close_in_an_answer_is_not_reused(closing: bytes) -> None:
    async def says_close(seen: Seen, wire: Wire) -> bool:
        await wire.send(closing)
        return True  # yet keeps it open: reusing it would work, so only the header stops it

    transport = ModelTransport()
    async with WireServer(says_close) as server, client_of(transport) as client:
        await client.get(server.url())
        assert transport.idle_connections == 0
        await client.get(server.url())
    assert server.connections == 2


@pytest.mark.parametrize(
    ("ending", "reused"),
    [
        (LAST_CHUNK, True),
        (b"0\r\nX-Checksum: 1\r\n\r\n", True),  # trailer fields read past
        (LAST_CHUNK + b"HTTP/1.1 200 OK\r\n", False),  # more than its one answer
    ],
)
async def test_a_chunked_answer_read_to_its_end_gives_its_connection_back(
    ending: bytes, reused: bool
) -> None:
    async def chunked(seen: Seen, wire: Wire) -> bool:
        await wire.send(chunked_head() + chunk(b"part") + ending)
        return True

    transport = ModelTransport()
    async with WireServer(chunked) as server, client_of(transport) as client:
        assert (await client.get(server.url())).content == b"part"
        assert transport.idle_connections == (1 if reused else 0)
        assert (await client.get(server.url())).content == b"part"
    assert server.connections == (1 if reused else 2)


async def test_an_answer_closed_before_its_end_drops_its_connection() -> None:
    go = asyncio.Event()
    transport = ModelTransport(max_connections=1)
    async with WireServer(held_stream(go)) as server, client_of(transport) as client:
        async with client.stream("GET", server.url()) as response:
            async for _piece in response.aiter_bytes():
                break
        assert transport.idle_connections == 0
        go.set()
        # The slot came back: with one connection allowed, the next request goes, on a new connection.
        response = await client.get(server.url())
        assert response.content == b"firstsecond"
    assert server.connections == 2


async def test_one_connection_allowed_serves_concurrent_requests_in_turn() -> None:
    async def slow_first(seen: Seen, wire: Wire) -> bool:
        if len(server.requests) == 1:
            # Give a second request (were it let through) time to reach the server while this one is open.
            await async_wait_until(lambda: len(server.requests) > 1 or time.monotonic() > until, "held")
        await wire.send(json_answer({"connection": seen.connection}))
        return True

    until = time.monotonic() + 0.5
    async with WireServer(slow_first) as server, client_of(ModelTransport(max_connections=1)) as client:
        responses = await asyncio.gather(client.get(server.url("/1")), client.get(server.url("/2")))
    assert [response.status_code for response in responses] == [200, 200]
    assert server.max_in_flight == 1
    assert server.connections == 1


async def test_waiting_for_the_only_connection_ends_at_the_pool_timeout() -> None:
    go = asyncio.Event()
    async with WireServer(held_stream(go)) as server, client_of(ModelTransport(max_connections=1)) as client:
        async with client.stream("GET", server.url()):
            with pytest.raises(httpx.PoolTimeout):
                await client.get(server.url(), timeout=httpx.Timeout(5, pool=0.05))
        go.set()
        assert (await client.get(server.url())).status_code == 200
    assert len(server.requests) == 2  # the request that timed out in the pool never went out


async def test_a_read_timeout_raises_and_gives_the_slot_back() -> None:
    transport = ModelTransport(max_connections=1)
    async with WireServer(silent) as mute, WireServer() as good, client_of(transport) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(mute.url(), timeout=httpx.Timeout(5, read=0.2))
        await async_wait_until(lambda: mute.open_now == 0, "the timed-out connection closed")
        assert (await client.get(good.url())).status_code == 200
        assert transport.idle_connections == 1  # the good server's: the timed-out one was not kept


async def test_a_refused_connect_and_a_foreign_scheme_are_httpx_errors() -> None:
    async with WireServer() as good, client_of(ModelTransport(max_connections=1)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{closed_port()}/")
        with pytest.raises(httpx.UnsupportedProtocol):
            await client.get("ftp://127.0.0.1/file")
        assert (await client.get(good.url())).status_code == 200


@pytest.mark.parametrize(
    "cut_answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10,
        chunked_head() + chunk(b"x" * 10) + b"5\r\nxx",
    ],
    ids=["content-length", "chunked"],
)
async def test_an_answer_cut_mid_body_raises_while_reading(cut_answer: bytes) -> None:
    async def cut(seen: Seen, wire: Wire) -> bool:
        await wire.send(cut_answer)
        return False

    async with WireServer(cut) as server, client_of(ModelTransport(max_connections=1)) as client:
        async with client.stream("GET", server.url()) as response:
            assert response.status_code == 200
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await response.aread()
        # Its slot came back (the next one fails the same way, but goes).
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.get(server.url())
    assert server.connections == 2


async def test_garbage_for_a_status_line_is_a_protocol_error() -> None:
    async def garbage(seen: Seen, wire: Wire) -> bool:
        await wire.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        return True

    async with WireServer(garbage) as server, client_of(ModelTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(server.url())
    assert server.connections == 1  # a new connection's garbage is not a keep-alive race: not retried


async def test_a_cancelled_call_gives_its_slot_and_connection_back() -> None:
    transport = ModelTransport(max_connections=1)
    async with WireServer(silent) as mute, WireServer() as good, client_of(transport) as client:
        call = asyncio.create_task(client.get(mute.url()))
        await async_wait_until(lambda: mute.requests, "the request at the server")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await async_wait_until(lambda: mute.open_now == 0, "the cancelled call's connection closed")
        assert (await client.get(good.url(), timeout=httpx.Timeout(5, pool=2))).status_code == 200


async def test_a_connection_idle_past_idle_s_is_replaced() -> None:
    transport = ModelTransport(idle_s=0.05)
    async with WireServer() as server, client_of(transport) as client:
        await client.get(server.url())
        expired = time.monotonic() + 0.1
        await async_wait_until(lambda: time.monotonic() > expired, "idle_s to pass")
        assert (await client.get(server.url())).json()["connection"] == 1
        await async_wait_until(lambda: server.open_now == 1, "the expired connection closed")
        assert transport.idle_connections == 1


async def test_https_with_a_trusted_certificate_and_without(tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    async with WireServer(ssl_context=tls.server) as server:
        async with client_of(ModelTransport(ssl_context=tls.client)) as client:
            assert server.url().startswith("https://")
            response = await client.get(server.url("/secure"))
            assert response.json() == {"connection": 0, "target": "/secure"}
        async with client_of(ModelTransport()) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(server.url("/secure"))
    assert len(server.requests) == 1


async def test_two_hundred_concurrent_calls() -> None:
    transport = ModelTransport()
    async with WireServer() as server, client_of(transport) as client:
        responses = await asyncio.gather(*(client.get(server.url(f"/{n}")) for n in range(200)))
        assert [response.status_code for response in responses] == [200] * 200
        assert sorted(seen.target for seen in server.requests) == sorted(f"/{n}" for n in range(200))
        # Every connection opened is back in the pool, none leaked nor lost.
        assert transport.idle_connections == server.connections <= 200


async def test_build_model_http_caps_its_connections() -> None:
    async with WireServer() as server, build_model_http(max_connections=1) as client:
        responses = await asyncio.gather(*(client.get(server.url()) for _ in range(5)))
    assert {response.json()["connection"] for response in responses} == {0}
    assert server.connections == 1


async def test_a_header_h11_refuses_is_an_httpx_error() -> None:
    async with WireServer() as server, client_of(ModelTransport(max_connections=1)) as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.get(server.url(), headers={"X-Bad": "a\nb"})
        # Nothing was sent, and the slot is free again.
        assert (await client.get(server.url())).status_code == 200
    assert len(server.requests) == 1
