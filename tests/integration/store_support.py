"""Helpers of the store, client and API tests: their own Redis database, so flushing it never touches the
catalogue or queues that session-wide workers keep in database 0."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import uvicorn

STORE_TEST_DB = 3


def store_db_url(redis_url: str, db: int = STORE_TEST_DB) -> str:
    """`redis_url` pointed at database `db`."""
    parts = urlsplit(redis_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def empty_db_url(redis_url: str, db: int = STORE_TEST_DB) -> str:
    """`store_db_url`, that database emptied first: what a test of the API or the clients starts from."""
    url = store_db_url(redis_url, db)
    flusher = redis.Redis.from_url(url)
    try:
        flusher.flushdb()
    finally:
        flusher.close()
    return url


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
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
