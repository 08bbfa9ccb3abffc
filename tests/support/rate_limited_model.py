"""An OpenAI-compatible model server that enforces a rate limit as OpenAI does, for the fleet's limit tests.

The scripted brain answers (`providers.scripted.server.build_app`: a tool call, then a final answer, as a
`scripted:plan` prompt asks), behind a sliding window of `limit` accepted requests per `window_s` seconds.
A request past it is refused as OpenAI refuses one: HTTP 429 with its `rate_limit_exceeded` body,
`x-ratelimit-*` headers and `retry-after` (whole seconds) with `retry-after-ms`. An accepted request's answer
carries the `x-ratelimit-*` headers too (remaining, and the reset as OpenAI writes it: "1s", "6m0s",
"20ms"), so a client can see the limit coming. Tokens are reported with a limit never reached.

It runs in a thread of the test process (uvicorn), so the orchestrators under test reach it over HTTP as
they would reach a provider, and it counts what it accepted and refused.

    with RateLimitedModelServer(limit=20, window_s=5.0) as server:
        ... OPENAI_BASE_URL=server.base_url ...; server.accepted, server.refused
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import socket
import threading
import time
from typing import Self

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.providers.scripted.server import build_app
from tests.support.waiting import wait_until

TOKENS_LIMIT = 10_000_000


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes a reset: `20ms` under a second, else `1s`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(round(seconds * 1000), 1)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class _Limited:
    """ASGI middleware: the window's check before the scripted app, the headers on its answer."""

    def __init__(self, app: ASGIApp, server: RateLimitedModelServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        remaining, reset_s = self.server.admit()
        headers = self.server.headers(remaining, reset_s)
        if remaining < 0:
            await self._refuse(send, headers, reset_s)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _refuse(self, send: Send, headers: list[tuple[bytes, bytes]], reset_s: float) -> None:
        limit = self.server.limit
        message = (
            f"Rate limit reached for plan in organization org-test on requests per min (RPM): Limit {limit}, "
            f"Used {limit}, Requested 1. Please try again in {format_reset(reset_s)}."
        )
        body = json.dumps(
            {"error": {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
        ).encode()
        retry = [
            (b"retry-after", str(max(math.ceil(reset_s), 1)).encode()),
            (b"retry-after-ms", str(max(round(reset_s * 1000), 1)).encode()),
        ]
        start_headers = [(b"content-type", b"application/json"), *headers, *retry]
        await send({"type": "http.response.start", "status": 429, "headers": start_headers})
        await send({"type": "http.response.body", "body": body})


class RateLimitedModelServer:
    """`limit` requests per sliding `window_s`; `base_url` ends in `/v1` as OPENAI_BASE_URL does."""

    def __init__(self, *, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self.accepted = 0
        self.refused = 0
        self._times: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        port = self._socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(
            _Limited(build_app(), self), lifespan="off", log_level="warning", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="rate-limited-model", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def __enter__(self) -> Self:
        self._thread.start()
        wait_until(lambda: self._server.started or not self._thread.is_alive(), "the model server", 10)
        if not self._server.started:
            raise RuntimeError("the rate-limited model server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def admit(self) -> tuple[int, float]:
        """Count one request: (requests left in the window after it, -1 when refused; seconds until the
        window's oldest request leaves it)."""
        now = time.monotonic()
        with self._lock:
            while self._times and self._times[0] <= now - self.window_s:
                self._times.popleft()
            if len(self._times) >= self.limit:
                self.refused += 1
                return -1, self._times[0] + self.window_s - now
            self._times.append(now)
            self.accepted += 1
            return self.limit - len(self._times), self._times[0] + self.window_s - now

    def headers(self, remaining: int, reset_s: float) -> list[tuple[bytes, bytes]]:
        """OpenAI's rate-limit headers for an answer that leaves `remaining` requests (-1: refused)."""
        values = {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(max(remaining, 0)),
            "x-ratelimit-reset-requests": format_reset(reset_s),
            "x-ratelimit-limit-tokens": str(TOKENS_LIMIT),
            "x-ratelimit-remaining-tokens": str(TOKENS_LIMIT - 1000),
            "x-ratelimit-reset-tokens": "6ms",
        }
        return [(name.encode(), value.encode()) for name, value in values.items()]

    @property
    def refused_share(self) -> float:
        """Refused requests over all requests."""
        with self._lock:
            total = self.accepted + self.refused
            return self.refused / total if total else 0.0
