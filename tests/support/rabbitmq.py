"""A real `rabbitmq-server` of the test session's own, as the suite starts its own `redis-server`s.

    with RabbitServer() as rabbit:      # free ports, a temp dir for its data, logs and config
        use(rabbit.url)                 # amqp://toolloop:<password>@127.0.0.1:<port>//
        rabbit.stop(); rabbit.start()   # the broker "down for a moment": durable queues survive it

The node is Debian's `rabbitmq-server` (`make setup-rabbitmq` installs it), run as the test's user from its
own scripts, never the system service: its node name, ports (AMQP, distribution, and an `epmd` of its own),
`RABBITMQ_MNESIA_BASE`, `RABBITMQ_LOG_BASE` and config all live in the temp dir or on free ports, so two
sessions side by side never meet. `rabbitmq_server` is the session fixture; a module that needs a broker
to stop (a restart, an outage) takes `own_rabbitmq` instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from orchestrator.redis_server import find_free_port
from tests.support.process_groups import signal_group

# Debian's package puts the server's own scripts here; /usr/sbin/rabbitmq-server would `su` to the
# rabbitmq user, who cannot write the test's temp dir.
SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = "epmd"
# A cold node boots in about 4 s on an idle laptop; a loaded 2-core CI machine is many times slower.
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
USER = "toolloop"
MISSING = (
    f"no {SERVER_SCRIPT}: the RabbitMQ tests need Debian's rabbitmq-server; run `make setup` "
    "(as root it installs it with apt), or: apt-get install -y rabbitmq-server"
)


def find_server_script() -> Path:
    """The node's start script; fails the test (never skips it) naming what to install."""
    if not SERVER_SCRIPT.is_file():
        pytest.fail(MISSING)
    return SERVER_SCRIPT


class RabbitServer:
    """One RabbitMQ node on free ports with its data in a temp dir; a context manager."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="toolloop-rabbitmq-"))
        self.port = find_free_port()
        self.dist_port = find_free_port()
        self.epmd_port = find_free_port()
        self.password = f"pw-{uuid.uuid4().hex[:12]}"
        self.nodename = f"toolloop-{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self._write_config()

    @property
    def url(self) -> str:
        """The AMQP URL of the node's default virtual host, password included."""
        return f"amqp://{USER}:{self.password}@127.0.0.1:{self.port}//"

    @property
    def log_path(self) -> Path:
        """What the node's start script and the node wrote on stdout and stderr."""
        return self.dir / "server.log"

    def log_text(self) -> str:
        """The node's output so far, and its own log file."""
        parts = [p.read_text(errors="replace") for p in (self.log_path, *self.dir.glob("log/*.log"))]
        return "\n".join(parts)

    def _write_config(self) -> None:
        (self.dir / "mnesia").mkdir()
        (self.dir / "log").mkdir()
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"default_user = {USER}\n"
            f"default_pass = {self.password}\n"
            "log.file.level = info\n"
            # The node's disk check would refuse publishes on a nearly full CI disk: not what is tested.
            "disk_free_limit.absolute = 1MB\n"
        )

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.dir),  # the Erlang cookie
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
        }

    def start(self) -> RabbitServer:
        """Start the node (again, after `stop`: same ports, same data) and wait until it takes connections."""
        script = find_server_script()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [str(script)],
                env=self._env(),
                cwd=self.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"rabbitmq-server exited with {code}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"rabbitmq-server not up in {BOOT_TIMEOUT_S:g} s:\n{self.log_text()}")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        # The AMQP listener opens once the node has booted (its queues recovered): the node is ready then.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """A graceful stop (SIGTERM: the node closes its connections and syncs its queues); idempotent."""
        process = self.process
        if process is None:
            return
        signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the node's whole process group, as a crash; idempotent."""
        process = self.process
        if process is None:
            return
        signal_group(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        """Stop the node and its `epmd`, and remove the temp dir."""
        self.stop()
        # epmd daemonises out of the node's process group: stopped by its port.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [EPMD, "-kill"],
                env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)},
                capture_output=True,
                timeout=10,
                check=False,
            )
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitServer]:
    """One RabbitMQ node for the test session (stopped, its data removed, at the end)."""
    with RabbitServer() as server:
        yield server


@pytest.fixture
def own_rabbitmq() -> Iterator[RabbitServer]:
    """A RabbitMQ node of the test's own: to stop and start again."""
    with RabbitServer() as server:
        yield server
