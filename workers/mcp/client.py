"""Opening an MCP client session with the `mcp` SDK, and telling its failures apart.

`open_client` connects to a server entry — a stdio command (started in a process group of its own, stderr
to the worker's log) or a streamable HTTP URL (with its headers) — and negotiates the protocol version
(`mode="auto"`: the 2026 `server/discover`, else the `initialize` handshake of earlier servers). No response
cache: every `tools/list` reaches the server.

A failure is a transport failure (`is_transport_failure`: the session could not be opened, broke, or the
connection closed under a call — another attempt on a new session may work) or the server's own answer
(an MCP error response: unknown tool, invalid parameters, an internal error).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, REQUEST_TIMEOUT, Implementation

from workers.mcp.config import McpServer

CLIENT_INFO = Implementation(name="toolloop", version="0.1.0")
# The SDK's own defaults for HTTP: a server may hold a response stream open for a long call.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
# MCP errors that say the connection, not the server, failed: another session may get through.
_TRANSPORT_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})
_SESSION_GONE = "Session terminated"  # the SDK's error for a 404 on a known session (server restarted)
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    httpx2.TransportError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
# The first page of a listing and this many more, at most: a server that pages for ever cannot hang us.
MAX_LIST_PAGES = 100


@asynccontextmanager
async def open_client(
    server: McpServer, message_handler: MessageHandlerFnT | None = None
) -> AsyncIterator[Client]:
    """An open, negotiated client session with `server` (its command over stdio, or its URL)."""
    options: dict[str, Any] = {"cache": None, "client_info": CLIENT_INFO, "message_handler": message_handler}
    if server.command is not None:
        command = server.command
        params = StdioServerParameters(command=command[0], args=list(command[1:]), env=server.env)
        # The real stderr: a pool process's sys.stderr is Celery's logging proxy, which has no file.
        errlog: TextIO = sys.__stderr__ or sys.stderr
        async with Client(stdio_client(params, errlog=errlog), **options) as client:
            yield client
        return
    assert server.url is not None
    async with (
        httpx2.AsyncClient(headers=server.headers or {}, timeout=HTTP_TIMEOUT) as http,
        Client(streamable_http_client(server.url, http_client=http), **options) as client,
    ):
        yield client


async def list_tools(client: Client) -> list[dict[str, Any]]:
    """Every tool the server lists, page by page, as wire JSON (`name`, `description`, `inputSchema`…)."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions in `exc`, through the groups anyio's task groups wrap them in."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def is_transport_failure(exc: BaseException) -> bool:
    """True when `exc` says the session or connection failed, not the server's handling of a request."""
    return any(_is_transport_leaf(leaf) for leaf in leaves(exc))


def _is_transport_leaf(exc: BaseException) -> bool:
    if isinstance(exc, MCPError):
        return exc.code in _TRANSPORT_CODES or (exc.code == INVALID_REQUEST and exc.message == _SESSION_GONE)
    return isinstance(exc, (*_TRANSPORT_ERRORS, TimeoutError))


def describe_error(exc: BaseException) -> str:
    """One line on what went wrong: the innermost error of a group, `Type: message` (MCP errors: message)."""
    leaf = next(leaves(exc), exc)
    if isinstance(leaf, MCPError):
        return f"MCP error {leaf.code}: {leaf.message}"
    text = str(leaf).strip().splitlines()
    return f"{type(leaf).__name__}: {text[0]}" if text else type(leaf).__name__
