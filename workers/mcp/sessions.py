"""The MCP client sessions of one pool process, on an event loop thread of its own.

A pool process runs one call at a time; each MCP call blocks it on a future while the call runs on the
process's event loop thread (the `mcp` SDK is async, on anyio). One session per server, opened by the first
call that needs it and kept for the next ones; it is dropped — and the next call opens a new one — when:

- a call fails in transport (`TransientToolError`: retried on a new session as the server's `retries`
  allow) or with an unexpected error;
- the call is abandoned at its soft time limit (the call is cancelled, the session closed in the
  background: a stdio server is stopped, an HTTP session deleted) so that a hung server cannot hold the
  next call;
- it has been idle for `IDLE_PING_S` and does not answer a ping (a server restarted meanwhile).

When the hard limit kills the pool process, its sessions go with it: a stdio server it started is ended by
the worker (`workers.descendants`), and the new pool process opens its own. At a pool process's clean exit
its sessions are closed (`close_sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any

from mcp import Client
from mcp.shared.exceptions import MCPError

from workers.errors import McpToolError, TransientToolError
from workers.mcp.client import describe_error, is_transport_failure, open_client
from workers.mcp.config import McpServer
from workers.mcp.results import build_result

logger = logging.getLogger(__name__)
# The SDK's HTTP client logs every request at INFO: a line per MCP message in the worker's log.
logging.getLogger("httpx2").setLevel(logging.WARNING)

IDLE_PING_S = 30.0
PING_TIMEOUT_S = 5.0
# How long a pool process's clean exit waits for its sessions to close.
CLOSE_TIMEOUT_S = 3.0


class HeldSession:
    """One server's session, held open by a task of the loop until `close`."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Client | None = None
        self.used_at = time.monotonic()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> Client:
        """Connect and negotiate; raises what the connection raised."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp-session-{self.server.name}")
        return await ready

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        # The SDK's client is entered and left in this one task (anyio's cancel scopes require it).
        try:
            async with open_client(self.server) as client:
                self.client = client
                ready.set_result(client)
                await self._closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.info("MCP session of '%s' ended: %s", self.server.name, describe_error(exc))
        finally:
            self.client = None

    @property
    def alive(self) -> bool:
        """Open and not ended."""
        return self.client is not None and self._task is not None and not self._task.done()

    def close(self) -> asyncio.Task[None] | None:
        """End the session: gracefully when open, by cancelling its opening otherwise."""
        if self.client is not None:
            self._closing.set()
        elif self._task is not None:
            self._task.cancel()
        return self._task


class PoolSessions:
    """The sessions of this pool process and the loop thread they run on."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.held: dict[str, HeldSession] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, name="toolloop-mcp", daemon=True)
        self._thread.start()

    def call(self, server: McpServer, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The `tools/call` answer (wire JSON), blocking this thread; see `_call` for what it raises.

        Whatever interrupts the wait (the soft time limit) cancels the call and drops the session."""
        future: Future[dict[str, Any]] = asyncio.run_coroutine_threadsafe(
            self._call(server, tool, arguments), self.loop
        )
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                self.loop.call_soon_threadsafe(self._drop, server.name)
            raise

    async def _call(self, server: McpServer, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        client = await self._session(server)
        try:
            answer = await client.call_tool(tool, arguments)
        except Exception as exc:
            self._drop(server.name)
            if is_transport_failure(exc):
                raise TransientToolError(
                    f"MCP server '{server.name}' failed during the call: {describe_error(exc)}"
                ) from None
            if isinstance(exc, MCPError):
                raise McpToolError(
                    f"MCP server '{server.name}' refused the call: {describe_error(exc)}"
                ) from None
            raise
        held = self.held.get(server.name)
        if held is not None:
            held.used_at = time.monotonic()
        return answer.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _session(self, server: McpServer) -> Client:
        """The server's open session: the held one while it lives (and answers a ping after a long idle
        time), else a new one. Raises `TransientToolError` when it cannot be opened."""
        held = self.held.get(server.name)
        client = held.client if held is not None and held.alive else None
        fresh = held is not None and time.monotonic() - held.used_at < IDLE_PING_S
        if client is not None and (fresh or await _answers_ping(client)):
            return client
        self._drop(server.name)
        held = self.held[server.name] = HeldSession(server)
        try:
            return await held.open()
        except Exception as exc:
            self._drop(server.name)
            raise TransientToolError(
                f"could not open a session with MCP server '{server.name}' ({server.describe()}): "
                f"{describe_error(exc)}"
            ) from None

    def _drop(self, name: str) -> None:
        held = self.held.pop(name, None)
        if held is not None:
            held.close()

    def close_all(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close every session, waiting `timeout_s` at most (a pool process that exits cleanly)."""

        async def close() -> None:
            tasks = [task for held in list(self.held.values()) if (task := held.close()) is not None]
            self.held.clear()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout_s)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout_s + 1)


async def _answers_ping(client: Client) -> bool:
    try:
        await asyncio.wait_for(client.send_ping(), PING_TIMEOUT_S)
    except Exception:
        return False
    return True


# This process's sessions by its pid: a forked process finds none of its parent's.
_by_pid: dict[int, PoolSessions] = {}
_lock = threading.Lock()


def get_pool_sessions() -> PoolSessions:
    """This process's sessions, created on first use."""
    with _lock:
        sessions = _by_pid.get(os.getpid())
        if sessions is None:
            _by_pid.clear()
            sessions = _by_pid[os.getpid()] = PoolSessions()
        return sessions


def call_tool(server: McpServer, tool: str, arguments: dict[str, Any]) -> Any:
    """Call tool `tool` of `server` from this pool process: the result as `build_result` maps the answer.

    Raises `McpToolError` (an `isError` answer, an MCP error response), `TransientToolError` (the session
    could not be opened, or broke during the call) or whatever interrupted the wait."""
    return build_result(get_pool_sessions().call(server, tool, arguments))


def close_sessions() -> None:
    """Close this process's sessions, if it has any (at a pool process's clean exit)."""
    sessions = _by_pid.get(os.getpid())
    if sessions is not None:
        sessions.close_all()
