"""A `toolloop` command as an operator runs it in the background, for the stop and startup tests.

    served = start_toolloop(["api", "--port", "8123"], env={"TOOLLOOP_REDIS_URL": url})
    served.wait_for(lambda: answers(f"{base}/healthz"), "the API answers")
    code, elapsed_s = served.stop_with(signal.SIGTERM, within_s=15)   # the main process only, as `kill` does
    served.kill()                                                     # the whole process group; idempotent

Each runs in its own session (process group), so that `kill()` leaves nothing behind whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from orchestrator.redis_server import find_free_port
from tests.support.process_groups import group_alive, signal_group, signal_process
from tests.support.processes import ROOT, TOOLLOOP_BIN, wait_while_running
from tests.support.waiting import DEFAULT_TIMEOUT_S


class Served:
    """A running `toolloop <command>` subprocess and its log (stdout and stderr)."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The main process id."""
        return self.process.pid

    def log_text(self) -> str:
        """What the process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(
        self, predicate: Callable[[], bool], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Poll `predicate()` until true; fail with the log if the process exits or time runs out."""
        wait_while_running(self.process, predicate, what, self.log_text, timeout_s)

    def stop_with(self, signum: int, within_s: float) -> tuple[int | None, float]:
        """Send `signum` to the main process and wait up to `within_s`: (exit code or None, seconds taken)."""
        started = time.monotonic()
        signal_process(self.process, signum)
        try:
            code: int | None = self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the whole process group (whatever is left of it) and reap the main process."""
        self.kill_group()
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    def kill_group(self) -> None:
        """SIGKILL the process group, while its id is still its own (`process_groups.signal_group`)."""
        signal_group(self.process, signal.SIGKILL)

    def group_alive(self) -> bool:
        """True while any process of its group (a pool child, a redis-server it started) is still there."""
        return group_alive(self.process)


def start_toolloop(
    args: Sequence[str], env: Mapping[str, str] | None = None, *, sigint_ignored: bool = False
) -> Served:
    """Start `toolloop *args` from the checkout in a session of its own, its output in a temp log.

    `sigint_ignored`: started with SIGINT ignored, as a background job of a shell script is."""
    command = [str(TOOLLOOP_BIN), *args]
    if sigint_ignored:
        # `trap '' INT` ignores SIGINT, and exec keeps that disposition for toolloop.
        command = ["/bin/sh", "-c", 'trap \'\' INT; exec "$0" "$@"', *command]
    return _start(command, env, name=args[0])


def start_python(args: Sequence[str], env: Mapping[str, str] | None = None) -> Served:
    """Start `python *args` (this interpreter) the same way: a team's own app, e.g. under uvicorn."""
    return _start([sys.executable, *args], env, name="python")


def _start(command: Sequence[str], env: Mapping[str, str] | None, *, name: str) -> Served:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    log = Path(tempfile.mkstemp(prefix=f"toolloop-{name}-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=ROOT,
            start_new_session=True,
        )
    return Served(process, log)


@contextlib.contextmanager
def serving_api(redis_url: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`toolloop api` on a free loopback port against `redis_url`; yields its base URL once `/healthz`
    answers, kills its process group after."""
    port = find_free_port()
    served = start_toolloop(
        ["api", "--host", "127.0.0.1", "--port", str(port)],
        env={"TOOLLOOP_REDIS_URL": redis_url, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        served.wait_for(lambda: answers(f"{url}/healthz"), "the API answers")
        yield url
    finally:
        served.kill()


def answers(url: str) -> bool:
    """Whether a GET of `url` answers 200 now (no connection yet, or an error: not yet)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
