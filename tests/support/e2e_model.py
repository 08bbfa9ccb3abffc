"""The scripted model server for end-to-end tests, in a thread of the test process, counting requests.

The orchestrator under test is a separate process that reaches this server over HTTP exactly as it would a
real provider; the test reads `requests_with(marker)` to count the model calls a turn really made.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any, Self

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.providers.scripted.server import build_app
from tests.support.waiting import wait_until

# Longest a held request waits before it is answered anyway (tests release it well before).
HOLD_LIMIT_S = 45.0


class _Recorder:
    """ASGI middleware keeping every request body, before the scripted app answers it."""

    def __init__(self, app: ASGIApp, server: RecordingModelServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        if self.server.record(body.decode("utf-8", errors="replace")):
            # The test thread sets a threading event; waiting on it in a thread keeps the server's loop free.
            await asyncio.to_thread(self.server.released.wait, HOLD_LIMIT_S)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class RecordingModelServer:
    """`with RecordingModelServer() as server:` — `server.base_url` ends in `/v1` like OPENAI_BASE_URL."""

    def __init__(self) -> None:
        self._bodies: list[str] = []
        self._lock = threading.Lock()
        self.released = threading.Event()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        port = self._socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(
            _Recorder(build_app(), self),
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        # Not the main thread: uvicorn leaves the test process's signal handlers alone.
        self._thread = threading.Thread(target=self._serve, name="model-server", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def __enter__(self) -> Self:
        self._thread.start()
        wait_until(
            lambda: self._server.started or not self._thread.is_alive(),
            "the scripted model server to start",
            10,
        )
        if not self._server.started:
            raise RuntimeError("the scripted model server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def record(self, body: str) -> bool:
        """Keep a request body; True when it is to be held open until `released` is set."""
        with self._lock:
            self._bodies.append(body)
            return self.should_hold(body, self._bodies)

    def should_hold(self, body: str, bodies: list[str]) -> bool:
        """Whether to hold this request (called under the lock); never, unless a subclass says so."""
        return False

    def requests(self) -> list[dict[str, Any]]:
        """Every request body received so far, decoded."""
        with self._lock:
            bodies = list(self._bodies)
        return [json.loads(b) for b in bodies]

    def requests_with(self, marker: str) -> int:
        """How many requests carried `marker` (a string unique to one test's prompt)."""
        with self._lock:
            return sum(1 for body in self._bodies if marker in body)
