"""A worker serving the tools of its MCP servers: the worker's side (issue 18).

`start_mcp_serving(app, settings)`, from `create_worker_app`, reads the servers (`TOOLLOOP_MCP_SERVERS` and
`mcp_server(...)` calls of the tool modules; a bad entry raises `McpConfigError`) and starts the lister
(`workers.mcp.watcher`, a process of its own). It waits up to `START_WAIT_S` for each server's first
answer, so that the tools listed then are registered before the pool processes are forked; a server that
is down is said in one WARNING line and retried in the background, the worker serving its other tools.

Each listing replaces the server's tools in the registry (`<name>__<tool>`, `workers.mcp.tool`): new ones
get their Celery task (the registry's listener), the consumer learns them (`update_strategies`), vanished
ones are dropped, and the catalogue is published again at once. A pool process forked before a tool was
listed builds its task when the first call arrives (`workers.mcp.registry`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task, signals

from workers.catalogue import republish_catalogues
from workers.contract import TASK_NAME_PREFIX
from workers.errors import ToolDefinitionError
from workers.mcp.config import McpServer, merge_servers, parse_servers, registered_servers
from workers.mcp.registry import add_task_resolver
from workers.mcp.tool import McpTool, build_spec, build_tools, split_tool_name
from workers.settings import WorkerSettings
from workers.tools import registry

logger = logging.getLogger(__name__)

START_WAIT_S = 10.0
STOP_TIMEOUT_S = 10.0
_LISTED_NAMES = 10


@dataclass
class ServerState:
    """What the worker knows of one server: whether it answered, and the tools it published for it."""

    server: McpServer
    answered: threading.Event = field(default_factory=threading.Event)
    up: bool | None = None
    names: set[str] = field(default_factory=set)


class McpServing:
    """The lister process of a worker's MCP servers, and what its reports change in the worker."""

    def __init__(self, app: Celery, servers: list[McpServer]) -> None:
        self.app = app
        self.states = {server.name: ServerState(server) for server in servers}
        self.consumer: Any = None
        self.stopping = False
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = START_WAIT_S) -> None:
        """Start the lister, then wait (at most `wait_s`) until every server answered once."""
        with _startup_logging():
            self._start(wait_s)

    def _start(self, wait_s: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "workers.mcp.watcher", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdin is not None
        servers = [state.server.model_dump(mode="json") for state in self.states.values()]
        self.process.stdin.write(json.dumps(servers).encode() + b"\n")
        self.process.stdin.flush()
        threading.Thread(target=self._read, name="toolloop-mcp-reports", daemon=True).start()
        # The pool processes are forks of this one: the SDK imported now is imported there too.
        import workers.mcp.sessions  # noqa: F401

        for state in self.states.values():
            if not state.answered.wait(timeout=wait_s):
                logger.warning(
                    "MCP server '%s' (%s) has not answered yet; its tools are published once it does",
                    state.server.name,
                    state.server.describe(),
                )
                wait_s = 0.0

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                report = json.loads(line)
                state = self.states[report["server"]]
            except (ValueError, KeyError, TypeError):
                continue  # not a report (a stray line): the lister writes nothing else
            try:
                self._apply(state, report)
            except Exception:  # a report must never stop the reader: later ones still count
                logger.exception("could not apply the listing of MCP server '%s'", state.server.name)
            state.answered.set()
        for state in self.states.values():
            state.answered.set()  # nothing more will come: the start waits no longer
        if not self.stopping:
            logger.error(
                "the MCP tool lister stopped (exit code %s): MCP tool lists are no longer refreshed",
                self.process.wait(),
            )

    def _apply(self, state: ServerState, report: dict[str, Any]) -> None:
        server = state.server
        if "error" in report:
            self._report_down(state, str(report["error"]))
            return
        tools, skipped = build_tools(server, report.get("tools") or [])
        for reason in skipped:
            logger.warning("MCP server '%s': tool %s; not published", server.name, reason)
        published: set[str] = set()
        for tool in tools:
            try:
                registry.add(tool)
            except ToolDefinitionError as exc:
                logger.error("MCP server '%s': %s; not published", server.name, exc)
                continue
            published.add(tool.name)
        for name in state.names - published:
            registry.remove(name)
        state.names, state.up = published, True
        self._refresh_consumer()
        republish_catalogues()
        shown = ", ".join(sorted(published)[:_LISTED_NAMES]) + (
            ", …" if len(published) > _LISTED_NAMES else ""
        )
        logger.info("MCP server '%s': %d tool(s) published: %s", server.name, len(published), shown or "none")

    def _report_down(self, state: ServerState, reason: str) -> None:
        server = state.server
        if state.up is None:
            logger.warning(
                "MCP server '%s' (%s) is down: %s; retrying in the background, its tools are published "
                "once it answers",
                server.name,
                server.describe(),
                reason,
            )
        elif state.up:
            logger.warning(
                "MCP server '%s' (%s) stopped answering: %s; its tools stay published, reconnecting",
                server.name,
                server.describe(),
                reason,
            )
        else:
            logger.debug("MCP server '%s' still down: %s", server.name, reason)
        state.up = False

    def _refresh_consumer(self) -> None:
        # Celery's consumer maps task names to handlers once, at its start: a tool listed later needs one.
        if self.consumer is not None:
            self.consumer.update_strategies()

    def on_ready(self, consumer: Any) -> None:
        """The worker's consumer runs: it learns the tools listed while it started, and later ones."""
        self.consumer = consumer
        self._refresh_consumer()

    def stop(self) -> None:
        """Stop the lister (it closes its sessions: its stdio servers end)."""
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def resolve_task(self, name: str, hostname: str) -> Task[Any, Any] | None:
        """In a pool process: the task of an MCP tool listed after it was forked (None: not one)."""
        from celery.app.trace import build_tracer

        from workers.tasks import register_tool_task

        parts = (
            split_tool_name(name.removeprefix(TASK_NAME_PREFIX))
            if name.startswith(TASK_NAME_PREFIX)
            else None
        )
        state = self.states.get(parts[0]) if parts is not None else None
        if parts is None or state is None or not state.server.serves(parts[1]):
            return None
        tool = McpTool(state.server, parts[1], build_spec(state.server, parts[1]))
        registry.add(tool)
        task = self.app.tasks.get(name) or register_tool_task(self.app, tool)
        # What Celery's pool process setup does for the tasks it had (`process_initializer`).
        task.__trace__ = build_tracer(name, task, self.app.loader, hostname, app=self.app)
        return task


@contextlib.contextmanager
def _startup_logging() -> Iterator[None]:
    """Until Celery sets logging up, this module's lines (a server down at the start) go to stderr as
    Celery writes its own."""
    if logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/MainProcess] %(message)s"))
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = True


# The worker's serving, once started (one per worker process).
_started: list[McpServing] = []


def served_queues() -> list[str]:
    """The queues of this worker's MCP servers (consumed whether or not a server has answered yet)."""
    return sorted({state.server.queue_name for serving in _started for state in serving.states.values()})


def start_mcp_serving(app: Celery, settings: WorkerSettings) -> McpServing | None:
    """Serve the tools of the worker's MCP servers (none configured: nothing). Raises `McpConfigError`."""
    servers = merge_servers(parse_servers(settings.mcp_servers), registered_servers())
    if not servers:
        return None
    serving = McpServing(app, servers)
    _started.append(serving)
    serving.start()

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            serving.on_ready(sender)

    def on_shutdown(**_: Any) -> None:
        serving.stop()

    def on_pool_process_init(sender: Any = None, **_: Any) -> None:
        hostname = str(sender or "")
        add_task_resolver(lambda name: serving.resolve_task(name, hostname))

    def on_pool_process_shutdown(**_: Any) -> None:
        from workers.mcp.sessions import close_sessions

        close_sessions()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
    signals.worker_process_init.connect(on_pool_process_init, weak=False)
    signals.worker_process_shutdown.connect(on_pool_process_shutdown, weak=False)
    return serving
