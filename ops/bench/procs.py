"""Processes of a benchmark run: workers and orchestrators as subprocesses, measured from /proc.

Each process runs in its own session (process group) so that `stop()` takes its children with it and a
run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from ops.bench.plain_celery import build_worker_command
from workers import keys
from workers.connect import connect_redis

ROOT = Path(__file__).resolve().parents[2]
TOOLLOOP_BIN = Path(sys.executable).parent / "toolloop"
BENCH_TOOLS = "ops.bench.tools"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Proc:
    """One subprocess in its own process group, with its output in a temp log file."""

    def __init__(self, command: list[str], env: Mapping[str, str], name: str) -> None:
        self.name = name
        fd, path = tempfile.mkstemp(prefix=f"toolloop-bench-{name}-", suffix=".log")
        self.log_path = Path(path)
        with os.fdopen(fd, "wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                cwd=ROOT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The process id of the main process."""
        return self.process.pid

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        """True while the main process runs."""
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the main process (a warm shutdown), then SIGKILL the whole group; idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=5)
        self.log_path.unlink(missing_ok=True)


def start_worker(
    redis_url: str,
    *,
    queues: Iterable[str],
    concurrency: int,
    modules: str = BENCH_TOOLS,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Proc:
    """`toolloop worker` serving `queues`; returns once its catalogue entry is published."""
    proc, hostname = spawn_worker(redis_url, queues=queues, concurrency=concurrency, modules=modules, env=env)
    try:
        wait_catalogue(redis_url, hostname, proc, timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc


def spawn_worker(
    redis_url: str,
    *,
    queues: Iterable[str],
    concurrency: int,
    modules: str = BENCH_TOOLS,
    env: Mapping[str, str] | None = None,
) -> tuple[Proc, str]:
    """`toolloop worker` started, not yet ready (`wait_catalogue` with the node name returned says when)."""
    hostname = f"bench-{uuid.uuid4().hex[:8]}@localhost"
    command = [
        str(TOOLLOOP_BIN),
        "worker",
        f"--concurrency={concurrency}",
        f"--queues={','.join(queues)}",
        f"--hostname={hostname}",
        "--loglevel=WARNING",
    ]
    full_env = {"TOOLLOOP_REDIS_URL": redis_url, "TOOLLOOP_TOOL_MODULES": modules, **(env or {})}
    return Proc(command, full_env, "worker"), hostname


def spawn_plain_worker(redis_url: str, concurrency: int) -> Proc:
    """Plain Celery's own stock `celery worker -E` (`plain_celery`), started, not yet ready: its first task
    waits for it."""
    hostname = f"plain-{uuid.uuid4().hex[:8]}@localhost"
    command = build_worker_command(sys.executable, hostname, concurrency)
    return Proc(command, {"TOOLLOOP_REDIS_URL": redis_url}, "celery")


def wait_catalogue(redis_url: str, hostname: str, proc: Proc, timeout_s: float) -> None:
    """Block until worker `hostname` has published a catalogue entry (it consumes then)."""
    client = connect_redis(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"worker exited early:\n{proc.log_text()}")
            raw = client.hget(keys.CATALOGUE, hostname)
            if raw is not None and json.loads(raw)["tools"]:
                return
            time.sleep(0.05)
    finally:
        client.close()
    raise TimeoutError(f"worker {hostname} not ready after {timeout_s} s:\n{proc.log_text()}")


def start_orchestrator(
    redis_url: str, env: Mapping[str, str] | None = None, *, command: list[str] | None = None
) -> Proc:
    """An orchestrator subprocess (default: the benchmark's, instant model); registered in Redis on return.

    `command` runs another one, e.g. `[toolloop, "orchestrator"]`.
    """
    command = command or [sys.executable, "-m", "ops.bench.instant"]
    full_env = {"TOOLLOOP_REDIS_URL": redis_url, **(env or {})}
    proc = Proc(command, full_env, "orchestrator")
    client = connect_redis(redis_url)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"orchestrator exited early:\n{proc.log_text()}")
            members = client.zrange(keys.ORCHESTRATORS, 0, -1)
            if any(f"-{proc.pid}-" in m for m in members):
                return proc
            time.sleep(0.05)
    finally:
        client.close()
    proc.stop()
    raise TimeoutError("orchestrator did not register in 30 s")


def read_rss_mb(pid: int) -> float:
    """Resident set size of one process, in MiB (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def read_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based) of the whole line.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def measure_idle_cpu_pct(pid: int, seconds: float) -> float:
    """Percent of one core a process used over `seconds` of wall time."""
    cpu0, t0 = read_cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = read_cpu_s(pid), time.monotonic()
    return 100.0 * (cpu1 - cpu0) / (t1 - t0)
