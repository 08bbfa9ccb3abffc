"""`toolloop call` and `toolloop tools` as a user runs them, against the session's worker."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.processes import TOOLLOOP_BIN, WorkerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _run(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url}
    return subprocess.run(
        [str(TOOLLOOP_BIN), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_call_ok_prints_the_envelope(redis_url: str, worker: WorkerHandle) -> None:
    result = _run(redis_url, "call", "echo", "--args", '{"text": "hi"}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["result"] == "hi"


def test_call_failure_exits_1(redis_url: str, worker: WorkerHandle) -> None:
    result = _run(redis_url, "call", "nope", "--args", "{}")
    assert result.returncode == 1
    assert json.loads(result.stdout)["failure_kind"] == "not_found"


@pytest.mark.parametrize(
    ("args", "message"), [("{bad", "--args is not valid JSON"), ("[1]", "must be a JSON object")]
)
def test_call_bad_json_exits_2(redis_url: str, args: str, message: str) -> None:
    result = _run(redis_url, "call", "echo", "--args", args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unreachable_redis_exits_3() -> None:
    result = _run("redis://127.0.0.1:1/0", "call", "echo", "--args", "{}")
    assert result.returncode == 3 and "cannot reach Redis" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_refuses_other_pools(redis_url: str) -> None:
    result = _run(redis_url, "worker", "--pool", "threads")
    assert result.returncode == 2 and "only prefork enforces time limits" in result.stderr


def test_tools_json_hides_sensitive_unless_asked(redis_url: str, worker: WorkerHandle) -> None:
    public = [spec["name"] for spec in json.loads(_run(redis_url, "tools", "--json").stdout)]
    assert "echo" in public and "secret_tool" not in public
    everything = json.loads(_run(redis_url, "tools", "--json", "--include-sensitive").stdout)
    assert "secret_tool" in [spec["name"] for spec in everything]


def test_tools_table_never_cuts_a_name_on_a_narrow_terminal(redis_url: str, worker: WorkerHandle) -> None:
    names = [spec["name"] for spec in json.loads(_run(redis_url, "tools", "--json").stdout)]
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url, "COLUMNS": "60"}
    table = subprocess.run(
        [str(TOOLLOOP_BIN), "tools"], capture_output=True, text=True, env=env, timeout=30, check=False
    ).stdout
    # What `toolloop call` and `tools=[...]` take is copied from here: each name whole, on one line.
    assert all(any(name in line for line in table.splitlines()) for name in names), table
