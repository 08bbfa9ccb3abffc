"""Running the test MCP server (`tests/support/mcp_server.py`) for integration and e2e tests.

entry = stdio_entry("t", soft_time_limit=10)                  # a TOOLLOOP_MCP_SERVERS entry, over stdio
with HttpMcpServer(env) as server: entry = server.entry("t")  # the same server over streamable HTTP
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from orchestrator.redis_server import find_free_port
from tests.support.processes import ROOT
from tests.support.waiting import wait_until
from workers import keys

SERVER_SCRIPT = ROOT / "tests" / "support" / "mcp_server.py"
SERVER_COMMAND = [sys.executable, str(SERVER_SCRIPT)]


def stdio_entry(name: str, env: Mapping[str, str] | None = None, **settings: Any) -> dict[str, Any]:
    """A stdio entry running the test server, with `settings` (limits, include…)."""
    entry: dict[str, Any] = {"name": name, "command": SERVER_COMMAND, **settings}
    if env:
        entry["env"] = dict(env)
    return entry


class HttpMcpServer:
    """The test server over streamable HTTP on a free port, in a process group of its own."""

    def __init__(self, env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or find_free_port()
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="toolloop-mcp-http-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def entry(self, name: str, **settings: Any) -> dict[str, Any]:
        """An entry naming this server's URL."""
        return {"name": name, "url": self.url, **settings}

    def start(self, timeout_s: float = 30.0) -> HttpMcpServer:
        """Start it and wait until its port accepts connections."""
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                [*SERVER_COMMAND, "--http", str(self.port)],
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._accepts, f"the MCP server on port {self.port}", timeout_s)
        return self

    def _accepts(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the MCP server exited:\n{self.log_path.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
            return True
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> HttpMcpServer:
        return self.start()

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def catalogued(redis_url: str, worker: str) -> dict[str, dict[str, Any]]:
    """The specs a worker published, by name."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hget(keys.CATALOGUE, worker)
    finally:
        client.close()
    return {spec["name"]: spec for spec in json.loads(raw)["tools"]} if raw else {}


def is_gone(pid: int) -> bool:
    """True when process `pid` no longer runs (gone, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == "Z"
