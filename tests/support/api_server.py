"""An ASGI app on a real uvicorn server in a thread of the test process, for the API's and pages' tests.

    with serve_app(create_app(settings)) as base_url: ...   # any ASGI app, lifespan included
    with api_client(settings) as http: ...                 # the toolloop API and an httpx client of it
    async with serving_in_loop(server, "the replay server") as base_url: ...   # in the test's own loop

The shipped `toolloop api` process is `tests.support.served.serving_api`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import uvicorn

from orchestrator.api.app import create_app
from orchestrator.settings import Settings
from tests.support.waiting import async_wait_until, wait_until


@contextmanager
def serve_app(app: Any, *, start_timeout_s: float = 10.0) -> Iterator[str]:
    """Run an ASGI app on a real uvicorn server in a thread (lifespan included); yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    wait_until(
        lambda: server.started or not thread.is_alive(), f"uvicorn to start on port {port}", start_timeout_s
    )
    if not server.started:
        raise RuntimeError(f"uvicorn did not start on port {port}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def api_client(settings: Settings, *, timeout_s: float = 5.0) -> Iterator[httpx.Client]:
    """The API app of `settings` served as by `serve_app`, and an httpx client of it (`timeout_s` per
    request: httpx's default)."""
    with (
        serve_app(create_app(settings)) as base_url,
        httpx.Client(base_url=base_url, timeout=timeout_s) as http,
    ):
        yield http


@asynccontextmanager
async def serving_in_loop(server: uvicorn.Server, what: str) -> AsyncIterator[str]:
    """Run `server` (configured on port 0) as a task of the running event loop, so that a test's coroutines
    and the server's handlers share it; yields its base URL once it listens, and shuts it down after."""
    task = asyncio.create_task(server.serve())
    await async_wait_until(lambda: server.started or task.done(), f"{what} to start")
    assert not task.done(), f"{what} did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
