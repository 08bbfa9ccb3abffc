"""A real prefork worker serving an MCP server's tools through the Python API (`mcp_server` in a tool
module, `tests/support/mcp_tools.py`), over stdio: the guardrails of `@tool`, a session broken under a call,
a pool process stuck in a call killed at the hard limit (its stdio server ending with it), bad entries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.direct import call_tool
from tests.support.mcp_support import catalogued, is_gone
from tests.support.processes import TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.waiting import wait_until
from workers.contract import ToolOutcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-marks")


@pytest.fixture(scope="module")
def mcp_worker(redis_url: str, marks: Path) -> Iterator[WorkerHandle]:
    handle = start_worker(
        redis_url, ["tests.support.mcp_tools"], concurrency=2, env={"MCP_TEST_MARK_DIR": str(marks)}
    )
    yield handle
    handle.stop()


def call(redis_url: str, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
    return call_tool(redis_url, tool, arguments, timeout_s=60)


def test_a_tool_module_serves_an_mcp_server_beside_its_tools(
    redis_url: str, mcp_worker: WorkerHandle
) -> None:
    specs = catalogued(redis_url, mcp_worker.hostname)
    assert sorted(specs) == ["local_double", "py__crash", "py__echo", "py__hang"]
    echo = specs["py__echo"]
    assert (echo["queue"], echo["soft_time_limit_s"], echo["time_limit_s"]) == ("mcp.py", 10, 12)
    assert (echo["idempotency"], echo["max_result_bytes"], echo["retries"]) == ("args", 64, 1)
    assert call(redis_url, "local_double", {"x": 4}).result == 8


def test_the_guardrails_of_tool_apply(redis_url: str, mcp_worker: WorkerHandle) -> None:
    text = f"once {uuid.uuid4().hex}"
    first, again = call(redis_url, "py__echo", {"text": text}), call(redis_url, "py__echo", {"text": text})
    assert (first.result, first.idempotent_replay) == (text, False)
    assert (again.result, again.idempotent_replay) == (text, True)
    long = "x" * 100 + uuid.uuid4().hex
    capped = call(redis_url, "py__echo", {"text": long})
    assert capped.ok and capped.truncated and capped.result is None and capped.full_result_key
    assert capped.content.startswith("x" * 64 + "\n[truncated: result was 132 bytes")


def test_a_session_broken_under_a_call_is_retried_on_a_new_one(
    redis_url: str, mcp_worker: WorkerHandle
) -> None:
    crashed = call(redis_url, "py__crash", {})
    assert (crashed.ok, crashed.failure_kind, crashed.retryable, crashed.attempts) == (
        False,
        "execution_error",
        True,
        2,
    )
    assert crashed.error is not None
    assert "MCP server 'py' failed during the call" in crashed.error and "(after 2 attempts)" in crashed.error
    text = uuid.uuid4().hex
    assert call(redis_url, "py__echo", {"text": text}).result == text


def hang_once(redis_url: str, marks: Path, *, stop_pool: bool) -> tuple[ToolOutcome, int, int]:
    """One call of `py__hang`: its outcome, the pid of its stdio server and of the pool process that started
    it; with `stop_pool`, that pool process is stopped (SIGSTOP) once the call reached the server."""
    for old in marks.glob("hang-*"):
        old.unlink()
    outcomes: list[ToolOutcome] = []
    caller = threading.Thread(target=lambda: outcomes.append(call(redis_url, "py__hang", {})))
    caller.start()
    wait_until(lambda: bool(list(marks.glob("hang-*"))), "the hung call to reach the server", 60)
    mark = next(marks.glob("hang-*"))
    server_pid, pool_pid = int(mark.name.removeprefix("hang-")), int(mark.read_text())
    if stop_pool:
        # A pool process that can no longer answer its soft limit: only the hard limit ends it.
        os.kill(pool_pid, signal.SIGSTOP)
    caller.join(timeout=60)
    (outcome,) = outcomes
    return outcome, server_pid, pool_pid


ROUNDS = [
    pytest.param(1, id="quick"),
    pytest.param(6, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(600)]),
]


@pytest.mark.parametrize("rounds", ROUNDS)
def test_a_hung_call_is_answered_timeout_and_its_stdio_server_ends(
    redis_url: str, mcp_worker: WorkerHandle, marks: Path, rounds: int
) -> None:
    # Even rounds: the pool process is stuck, killed at the hard limit; odd ones: the soft limit abandons the
    # call and closes its session. Either way the server it started ends and the next call runs.
    for index in range(rounds):
        stop_pool = index % 2 == 0
        outcome, server_pid, pool_pid = hang_once(redis_url, marks, stop_pool=stop_pool)
        assert pool_pid in mcp_worker.child_pids()
        assert (outcome.ok, outcome.failure_kind) == (False, "timeout")
        if stop_pool:
            assert outcome.error == "timed out after 12 s (hard limit; the worker process was killed)"
        else:
            assert outcome.error == "timed out after 10 s"
        wait_until(
            lambda pid=server_pid: is_gone(pid), f"the MCP server {server_pid} of the hung call to end", 60
        )
        assert is_gone(pool_pid) is stop_pool
        text = uuid.uuid4().hex
        assert call(redis_url, "py__echo", {"text": text}).result == text


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLLOOP_BIN), "worker"],
        capture_output=True,
        text=True,
        env={**os.environ, "TOOLLOOP_REDIS_URL": "redis://127.0.0.1:1/0", **env},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TOOLLOOP_MCP_SERVERS": json.dumps([{"name": "fs", "command": []}])},
            "error: TOOLLOOP_MCP_SERVERS[0] ('fs'): \"command\" must be a non-empty list",
        ),
        (
            {"TOOLLOOP_MCP_SERVERS": "[{"},
            "error: TOOLLOOP_MCP_SERVERS is not valid JSON",
        ),
        (
            {"TOOLLOOP_TOOL_MODULES": "tests.support.mcp_bad_tools"},
            "error: tool module 'tests.support.mcp_bad_tools' defines a bad tool: mcp_server ('a__b'): name",
        ),
    ],
)
def test_a_bad_entry_stops_the_worker_in_one_line(env: dict[str, str], message: str) -> None:
    result = run_worker(env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr
