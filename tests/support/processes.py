"""Starting real processes for integration and e2e tests: a Celery prefork worker, as users run it.

    handle = start_worker(redis_url, ["tests.support.tools"])   # returns once its catalogue is published
    handle.child_pids()                                         # the prefork pool's children
    handle.stop()                                               # SIGTERM, then SIGKILL, whole process group

Each worker runs `toolloop worker` in its own session (process group), so `stop()` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import redis

from tests.support.process_groups import signal_group, signal_process
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_until
from workers import keys

TOOLLOOP_BIN = Path(sys.executable).parent / "toolloop"
ROOT = Path(__file__).resolve().parents[2]


class WorkerHandle:
    """A running `toolloop worker` subprocess."""

    def __init__(
        self, process: subprocess.Popen[bytes], hostname: str, redis_url: str, log_path: Path
    ) -> None:
        self.process = process
        self.hostname = hostname
        self.redis_url = redis_url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The worker's main (parent) process id."""
        return self.process.pid

    def child_pids(self) -> list[int]:
        """Process ids of the pool's children (direct children of the main process)."""
        children: list[int] = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                children.append(int(stat.parent.name))
        return sorted(children)

    def log_text(self) -> str:
        """What the worker wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Block until the worker has published its catalogue entry (it is consuming then); failing, the
        worker is stopped."""
        client = redis.Redis.from_url(self.redis_url)

        def published() -> bool:
            raw = client.hget(keys.CATALOGUE, self.hostname)
            return raw is not None and bool(json.loads(raw)["tools"])

        try:
            wait_while_running(
                self.process, published, f"worker {self.hostname} ready", self.log_text, timeout_s
            )
        except AssertionError:
            self.stop()
            raise
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the whole process group; idempotent."""
        if self.process.poll() is None:
            # The main process only: it stops its pool children itself (a warm shutdown).
            signal_process(self.process, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        signal_group(self.process, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=5)


def wait_while_running(
    process: subprocess.Popen[bytes],
    check: Callable[[], object],
    what: str,
    log_text: Callable[[], str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Poll `check()` until true; fail with the process's log if it exits first or time runs out."""

    def still_running_check() -> object:
        if found := check():
            return found
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {what}:\n{log_text()}")
        return False

    wait_until(still_running_check, what, timeout_s, detail=log_text)


def start_worker(
    redis_url: str,
    modules: Iterable[str],
    *,
    queues: Iterable[str] | None = None,
    concurrency: int = 2,
    hostname: str | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> WorkerHandle:
    """Start `toolloop worker` serving `modules` on `redis_url`; by default wait until it is ready."""
    name = hostname or f"test-{uuid.uuid4().hex[:8]}@localhost"
    command = [
        str(TOOLLOOP_BIN),
        "worker",
        f"--concurrency={concurrency}",
        f"--hostname={name}",
        "--loglevel=INFO",
    ]
    if queues is not None:
        command.append(f"--queues={','.join(queues)}")
    full_env = {
        **os.environ,
        "TOOLLOOP_REDIS_URL": redis_url,
        "TOOLLOOP_TOOL_MODULES": ",".join(modules),
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    log = Path(tempfile.mkstemp(prefix="toolloop-worker-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT, start_new_session=True
        )
    handle = WorkerHandle(process, name, redis_url, log)
    if wait:
        handle.wait_ready()
    return handle
