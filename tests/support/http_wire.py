"""A raw asyncio HTTP/1.1 server a test drives byte by byte, for testing an HTTP client's transport.

A real server (uvicorn) always answers well; a transport is tested on what servers do wrong or late, so
here each test hands the server a `Handler` that writes the bytes it wants: a Content-Length or chunked
answer, a chunk held until the test's event, an answer cut short, garbage, no answer, a close. The server
notes what it saw — connections accepted, each request (method, target, headers, body, on which connection),
how many connections and requests were open at once — for the test to assert on.

    async def hold(seen: Seen, wire: Wire) -> bool:       # True: keep the connection for another request
        await wire.send(chunked_head() + chunk(b"first"))
        await go.wait()
        await wire.send(chunk(b"second") + LAST_CHUNK)
        return True

    async with WireServer(hold) as server:
        ... server.url("/v1/x") ..., server.connections, server.requests
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LAST_CHUNK = b"0\r\n\r\n"


@dataclass(frozen=True)
class Seen:
    """One request as it arrived: `connection` is the index (from 0) of the connection it came on."""

    connection: int
    method: str
    target: str
    headers: dict[str, str]  # names lowercased
    body: bytes


@dataclass
class Wire:
    """The connection a handler answers on."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_closed(self) -> None:
        """Read (and drop) whatever comes until the client closes: a server that never answers, but notices
        the client giving up."""
        with contextlib.suppress(OSError):
            while await self.reader.read(65536):
                pass


Handler = Callable[[Seen, Wire], Awaitable[bool]]


def answer(
    status: int = 200, body: bytes = b"", headers: Iterable[tuple[str, str]] = (), reason: str = "OK"
) -> bytes:
    """A whole answer with a Content-Length body."""
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_answer(value: Any, status: int = 200, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    return answer(status, json.dumps(value).encode(), [("Content-Type", "application/json"), *headers])


def chunked_head(status: int = 200) -> bytes:
    return f"HTTP/1.1 {status} OK\r\nTransfer-Encoding: chunked\r\n\r\n".encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def ok(seen: Seen, wire: Wire) -> bool:
    """The well-behaved server: a JSON answer naming the connection, kept alive."""
    await wire.send(json_answer({"connection": seen.connection, "target": seen.target}))
    return True


class WireServer:
    """An HTTP/1.1 server on 127.0.0.1 (a free port), each request answered by `handler`."""

    def __init__(self, handler: Handler = ok, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.requests: list[Seen] = []
        self.connections = 0
        self.open_now = 0
        self.max_in_flight = 0
        self._in_flight = 0
        self._ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def url(self, path: str = "/") -> str:
        return f"{'https' if self._ssl_context else 'http'}://127.0.0.1:{self.port}{path}"

    def on(self, connection: int) -> list[Seen]:
        """The requests that came on one connection."""
        return [seen for seen in self.requests if seen.connection == connection]

    async def __aenter__(self) -> WireServer:
        # A backlog above the default 100: a burst of connects must not wait on SYN retries.
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, backlog=1024, ssl=self._ssl_context
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        # Handlers still holding (a held chunk, a silent server) end with the test.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = self.connections
        self.connections += 1
        self.open_now += 1
        try:
            while (seen := await _read_request(reader, index)) is not None:
                self.requests.append(seen)
                self._in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self._in_flight)
                try:
                    keep = await self.handler(seen, Wire(reader, writer))
                finally:
                    self._in_flight -= 1
                if not keep:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError):
            pass  # the client went away: what the tests look at is already noted
        except asyncio.CancelledError:
            # The test is over (`__aexit__`). Not re-raised: asyncio would log the cancelled task as an error.
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self.open_now -= 1  # once closed: a test waiting on it may count on the client seeing the close


async def _read_request(reader: asyncio.StreamReader, connection: int) -> Seen | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed between requests
    request_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    method, target, _version = request_line.split(" ")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Seen(connection, method, target, headers, body)


def closed_port() -> int:
    """A port nothing listens on (just freed): a connect to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@dataclass
class SelfSigned:
    """A self-signed certificate for 127.0.0.1: the server's context, and a client context trusting it."""

    cert: Path
    key: Path
    server: ssl.SSLContext = field(init=False)
    client: ssl.SSLContext = field(init=False)

    def __post_init__(self) -> None:
        self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server.load_cert_chain(self.cert, self.key)
        self.client = ssl.create_default_context(cafile=str(self.cert))


def self_signed(directory: Path) -> SelfSigned:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return SelfSigned(cert_path, key_path)
