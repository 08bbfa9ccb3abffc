"""Orchestrator processes for end-to-end tests: `toolloop orchestrator` as an operator runs it.

Each runs in its own session (process group) so that `stop()` and `kill()` leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import redis

from tests.support.process_groups import signal_process
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.served import Served
from workers import keys

# The tool module of the end-to-end tests' workers.
E2E_TOOLS = "tests.support.e2e_tools"


class OrchestratorHandle(Served):
    """A running `toolloop orchestrator` subprocess (its pid and log as for any `Served` process)."""

    def __init__(
        self, process: subprocess.Popen[bytes], orchestrator_id: str, log_path: Path, env: Mapping[str, str]
    ) -> None:
        super().__init__(process, log_path)
        self.env = dict(env)
        self.orchestrator_id = orchestrator_id

    def wait_registered(self, redis_url: str, timeout_s: float = 20.0) -> None:
        """Block until the process announced itself in Redis (it is claiming turns then); failing, the
        process is stopped."""
        client = redis.Redis.from_url(redis_url)
        try:
            self.wait_for(
                lambda: client.zscore(keys.ORCHESTRATORS, self.orchestrator_id) is not None,
                f"orchestrator {self.orchestrator_id} registered",
                timeout_s,
            )
        except AssertionError:
            self.stop()
            raise
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash: no lease released, nothing persisted beyond the last step."""
        self.kill_group()
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (graceful), then SIGKILL of the group; returns the exit code of the graceful stop."""
        code = self.process.poll()
        if code is None:
            signal_process(self.process, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(timeout=timeout_s)
        self.kill_group()
        if self.process.poll() is None:
            self.process.wait(timeout=5)
        return code


def start_orchestrator(
    redis_url: str,
    *,
    model_base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    orchestrator_id: str | None = None,
    wait: bool = True,
) -> OrchestratorHandle:
    """Start `toolloop orchestrator` against `redis_url` with short leases, for fast take-over in tests."""
    oid = orchestrator_id or f"e2e-orch-{os.urandom(4).hex()}"
    full_env = {
        **os.environ,
        "TOOLLOOP_REDIS_URL": redis_url,
        "TOOLLOOP_LEASE_TTL_S": "3",
        "TOOLLOOP_LOST_CALL_GRACE_S": "1",
        "TOOLLOOP_LOST_CALL_WAIT_S": "2",
        "PYTHONPATH": str(ROOT),
        **({"TOOLLOOP_SCRIPTED_BASE_URL": model_base_url} if model_base_url else {}),
        **(env or {}),
    }
    log = Path(tempfile.mkstemp(prefix="toolloop-orchestrator-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(TOOLLOOP_BIN), "orchestrator", "--id", oid],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=ROOT,
            start_new_session=True,
        )
    handle = OrchestratorHandle(process, oid, log, env or {})
    if wait:
        handle.wait_registered(redis_url)
    return handle
