"""A real MCP server for the tests, written with the `mcp` SDK: run it over stdio or streamable HTTP.

    python tests/support/mcp_server.py                   # stdio (what a worker's `command` runs)
    python tests/support/mcp_server.py --http PORT       # streamable HTTP at http://127.0.0.1:PORT/mcp

Its tools: `echo` (fast, text), `book` (arguments with a nested schema: $defs and $ref), `meet` (waits until
`count` calls of a group run at once, in `MCP_TEST_MARK_DIR`: calls that meet ran in parallel), `hang`
(sleeps for an hour: a hung call), `fail` (an `isError` result), `weather` (structured content and a text of
its own), `crash` (the server process exits: the session breaks under the call).

When `MCP_TEST_REQUIRE_FILE` names a file that does not exist, the server exits at once with status 1 (a
server that is down). When `MCP_TEST_MARK_DIR` names a folder, `hang` writes `hang-<pid>` there as it starts,
holding the pid of its parent (over stdio: the process that started the server).

When `MCP_TEST_EXTRA_FILE` names a file, the server reads it at start, before each call and every 0.1 s:
each line is the name of one more tool to serve (`extra_<line>`, returning its name); when the lines
change, it serves them and says the list changed (`subscriptions/listen` streams; with `MCP_TEST_LEGACY`
set, the server speaks only the `initialize` handshake of servers before 2026 and sends
`notifications/tools/list_changed` to each session that listed its tools).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp.shared.message import SessionMessage
from mcp_types import METHOD_NOT_FOUND, CallToolResult, ErrorData, JSONRPCError, JSONRPCRequest, TextContent
from pydantic import BaseModel, Field

EXTRA_FILE_ENV = "MCP_TEST_EXTRA_FILE"
LEGACY_ENV = "MCP_TEST_LEGACY"
REQUIRE_FILE_ENV = "MCP_TEST_REQUIRE_FILE"
MARK_DIR_ENV = "MCP_TEST_MARK_DIR"

bus = InMemorySubscriptionBus()
# Sessions of handshake-era clients that listed the tools, told of list changes directly (they have no
# `subscriptions/listen`).
legacy_sessions: set[Any] = set()


class KeepListingSessions:
    """Middleware keeping the sessions that list the tools (of a handshake-era server: `MCP_TEST_LEGACY`)."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/list":
            legacy_sessions.add(ctx.session)
        return await call_next(ctx)


class ReadExtrasFirst:
    """Middleware reading the extras file before a call: each server process (the lister's, each pool
    process's) polls it on its own, so without this a call could reach one that has not seen the change
    its peer already announced."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        path = os.environ.get(EXTRA_FILE_ENV)
        if path and ctx.method == "tools/call":
            sync_extra_tools(server, Path(path))
        return await call_next(ctx)


class Traveller(BaseModel):
    name: str = Field(description="The traveller's full name.")
    age: int = Field(ge=0, description="Age in years.")


class Trip(BaseModel):
    destination: str
    travellers: list[Traveller] = Field(min_length=1)
    nights: int = Field(default=1, ge=1)


class Weather(BaseModel):
    city: str
    temperature_c: float
    conditions: str


class Met(BaseModel):
    label: str
    met: bool


@contextlib.asynccontextmanager
async def lifespan(server: MCPServer) -> AsyncIterator[None]:
    path = os.environ.get(EXTRA_FILE_ENV)
    if not path:
        yield
        return
    sync_extra_tools(server, Path(path))
    task = asyncio.create_task(watch_extra_tools(server, Path(path)))
    try:
        yield
    finally:
        task.cancel()


server: MCPServer = MCPServer(
    "toolloop-test",
    lifespan=lifespan,
    subscriptions=bus,
    middleware=[ReadExtrasFirst(), *([KeepListingSessions()] if os.environ.get(LEGACY_ENV) else [])],
)


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool(structured_output=False)
def book(trip: Trip) -> str:
    """Book a trip for some travellers."""
    names = ", ".join(f"{t.name} ({t.age})" for t in trip.travellers)
    return f"booked {trip.nights} night(s) in {trip.destination} for {names}"


@server.tool()
async def meet(label: str, group: str, count: int = 2, seconds: float = 20.0) -> Met:
    """Wait until `count` calls of one group are running at once (at most `seconds`): met or not."""
    folder = Path(os.environ.get(MARK_DIR_ENV) or ".")
    await asyncio.to_thread((folder / f"meet-{group}-{label}").touch)
    deadline = time.monotonic() + seconds
    met = False
    while not met and time.monotonic() < deadline:
        met = len(await asyncio.to_thread(arrived, folder, group)) >= count
        await asyncio.sleep(0 if met else 0.05)
    return Met(label=label, met=met)


def arrived(folder: Path, group: str) -> list[Path]:
    return list(folder.glob(f"meet-{group}-*"))


@server.tool(structured_output=False)
async def hang(seconds: float = 3600.0) -> str:
    """Never answer (an hour)."""
    marks = os.environ.get(MARK_DIR_ENV)
    if marks:
        await asyncio.to_thread(Path(marks, f"hang-{os.getpid()}").write_text, str(os.getppid()))
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool(structured_output=False)
def crash() -> str:
    """Exit the server process in the middle of the call."""
    os._exit(3)


@server.tool(structured_output=False)
def fail(message: str) -> str:
    """Report an error."""
    raise ToolError(message)


@server.tool()
def weather(city: str) -> CallToolResult:
    """The weather in a city: structured, with a sentence for people."""
    data = Weather(city=city, temperature_c=21.5, conditions="sunny")
    return CallToolResult(
        content=[
            TextContent(type="text", text=f"It is {data.temperature_c} °C and {data.conditions} in {city}.")
        ],
        structured_content=data.model_dump(),
    )


def make_extra(name: str) -> Callable[[], str]:
    def extra() -> str:
        return name

    return extra


# The extra tools this process serves now (names from `MCP_TEST_EXTRA_FILE`).
served_extras: list[str] = []


def sync_extra_tools(server: MCPServer, path: Path) -> bool:
    """Serve the extra tools the file names now: True when they changed."""
    try:
        text = path.read_text()
    except OSError:
        return False
    wanted = [line.strip() for line in text.splitlines() if line.strip()]
    if wanted == served_extras:
        return False
    for name in served_extras:
        with contextlib.suppress(Exception):
            server.remove_tool(f"extra_{name}")
    for name in wanted:
        server.add_tool(
            make_extra(name),
            name=f"extra_{name}",
            description=f"Extra tool {name}.",
            structured_output=False,
        )
    served_extras[:] = wanted
    return True


async def watch_extra_tools(server: MCPServer, path: Path) -> None:
    while True:
        await asyncio.sleep(0.1)
        if not await asyncio.to_thread(sync_extra_tools, server, path):
            continue
        await bus.publish(ToolsListChanged())
        for session in list(legacy_sessions):
            with contextlib.suppress(Exception):
                await session.send_tool_list_changed()


async def run_handshake_era_stdio() -> None:
    """Serve stdio as a server from before 2026 does: `server/discover` is answered "method not found"
    before the SDK sees it (the SDK would serve the 2026 protocol on it), so clients fall back to the
    `initialize` handshake."""
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read_stream, write_stream):
        relay_send, relay_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            async with relay_send:
                async for item in read_stream:
                    message = getattr(item, "message", None)
                    if isinstance(message, JSONRPCRequest) and message.method == "server/discover":
                        refusal = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                        await write_stream.send(
                            SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=refusal))
                        )
                        continue
                    await relay_send.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(relay)
            await lowlevel.run(relay_receive, write_stream, lowlevel.create_initialization_options())
            group.cancel_scope.cancel()


def main() -> None:
    required = os.environ.get(REQUIRE_FILE_ENV)
    if required and not Path(required).exists():
        raise SystemExit(f"mcp test server: {required} does not exist")
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http is None and os.environ.get(LEGACY_ENV):
        anyio.run(run_handshake_era_stdio)
    elif args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
