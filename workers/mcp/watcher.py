"""The lister of a worker's MCP servers: `python -m workers.mcp.watcher <parent pid>`, started by the worker.

It reads the servers (a JSON list of entries) from the first line of its stdin. For each server it keeps a
session that lists the tools, and lists them again whenever the server says they changed
(`notifications/tools/list_changed` on a handshake-era session; a `subscriptions/listen` stream on a 2026
one; a session with neither is pinged every `PING_INTERVAL_S`). A session that cannot be opened, fails or
ends is opened again after a capped backoff (`build_retry_delay_s`: 0.5 s doubling to 15 s). Each listing
and each failure is one JSON line on stdout:

    {"server": "fs", "tools": [{"name": "read_file", "description": "…", "inputSchema": {…}}, …]}
    {"server": "fs", "error": "ConnectError: All connection attempts failed"}

Why a process of its own: the worker's main process ends, as orphans of a pool process, the processes it
did not have before it began serving (`workers.descendants`); this one it has, so the stdio servers it
starts are its children and left alone. It ends with the worker: on SIGTERM (the worker's shutdown), when
its stdin closes, or when its parent dies (Linux: `PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
from typing import Any, TextIO

from mcp import Client
from mcp.client.session import IncomingMessage
from mcp_types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from workers.mcp.client import describe_error, list_tools, open_client
from workers.mcp.config import McpServer

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 15.0
# How long opening a session and listing its tools may take before the attempt counts as failed.
OPEN_TIMEOUT_S = 30.0
PING_INTERVAL_S = 15.0
PING_TIMEOUT_S = 10.0
# How long the stop waits for the sessions to close (a stdio server gets 2 s to exit, then a SIGTERM).
STOP_TIMEOUT_S = 8.0
PR_SET_PDEATHSIG = 1


def build_retry_delay_s(failures: int) -> float:
    """The pause after the `failures`-th failure in a row: 0.5 s, doubling, at most `RETRY_MAX_S`."""
    return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** max(failures - 1, 0)))


class Reports:
    """The JSON lines this process writes for the worker."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def tools(self, server: str, tools: list[dict[str, Any]]) -> None:
        self._write({"server": server, "tools": tools})

    def error(self, server: str, reason: str) -> None:
        self._write({"server": server, "error": reason})

    def _write(self, report: dict[str, Any]) -> None:
        self.out.write(json.dumps(report, ensure_ascii=False) + "\n")
        self.out.flush()


async def watch(server: McpServer, reports: Reports) -> None:
    """Keep `server`'s listing current for ever: a session, and a new one after each failure."""
    failures = 0
    while True:
        listed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session = asyncio.create_task(run_session(server, reports, listed))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(listed), OPEN_TIMEOUT_S)
            except TimeoutError:
                reason = f"no answer within {OPEN_TIMEOUT_S:g} s"
            else:
                failures = 0
                await session
                reason = "the session ended"
        except Exception as exc:
            reason = describe_error(exc)
        finally:
            await _stop(session)
        failures += 1
        reports.error(server.name, reason)
        await asyncio.sleep(build_retry_delay_s(failures))


async def _stop(session: asyncio.Task[None]) -> None:
    if not session.done():
        session.cancel()
        await asyncio.wait([session], timeout=STOP_TIMEOUT_S)
    if session.done() and not session.cancelled():
        session.exception()  # retrieved: its failure was reported already


async def run_session(server: McpServer, reports: Reports, listed: asyncio.Future[None]) -> None:
    """One session: list the tools (then `listed` is done), and again at each change, until it fails."""
    changed = asyncio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            changed.set()

    try:
        async with open_client(server, message_handler=on_message) as client:
            reports.tools(server.name, await list_tools(client))
            listed.set_result(None)
            await follow_changes(client, server, reports, changed)
    except BaseException as exc:
        if not listed.done():
            if isinstance(exc, Exception):
                listed.set_exception(exc)
            else:
                listed.cancel()
        raise


async def follow_changes(client: Client, server: McpServer, reports: Reports, changed: asyncio.Event) -> None:
    """List again at each change the server announces; return when its change stream ends."""
    capabilities = client.server_capabilities
    announces = capabilities.tools is not None and bool(capabilities.tools.list_changed)
    if announces and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
        async with client.listen(tools_list_changed=True) as subscription:
            async for _event in subscription:
                reports.tools(server.name, await list_tools(client))
        return
    while True:
        try:
            await asyncio.wait_for(changed.wait(), PING_INTERVAL_S)
        except TimeoutError:
            await asyncio.wait_for(client.send_ping(), PING_TIMEOUT_S)
            continue
        changed.clear()
        reports.tools(server.name, await list_tools(client))


async def watch_all(servers: list[McpServer], reports: Reports) -> None:
    """Watch every server until SIGTERM or the end of stdin, then close the sessions."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def wait_for_eof() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, name="toolloop-mcp-stdin", daemon=True).start()
    tasks = [asyncio.create_task(watch(server, reports), name=f"watch-{server.name}") for server in servers]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent dies (Linux); exit now if it died already."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        sys.exit(0)


def main() -> None:
    """Read the servers from stdin and watch them (see the module)."""
    if len(sys.argv) > 1:
        die_with_parent(int(sys.argv[1]))
    servers = [McpServer.model_validate(entry) for entry in json.loads(sys.stdin.readline() or "[]")]
    asyncio.run(watch_all(servers, Reports(sys.stdout)))


if __name__ == "__main__":
    main()
