"""A Redis Cluster configured wrong, as a person meets it on the command line: one line saying what to set,
and the exit code of its kind, from every command (never a traceback): no broker (2), a database other than 0
for the API too (2), no node answering (3). A forgotten TOOLLOOP_REDIS_CLUSTER against a cluster's node is in
`test_redis_cluster.py`, beside a real cluster."""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.processes import ROOT, TOOLLOOP_BIN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """`toolloop <args>` with TOOLLOOP_REDIS_CLUSTER on and `env` (nothing else of the test's TOOLLOOP_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLOOP_")}
    full = {**base, "PYTHONPATH": str(ROOT), "TOOLLOOP_REDIS_CLUSTER": "true", **env}
    command = [str(TOOLLOOP_BIN), *args]
    return subprocess.run(command, env=full, capture_output=True, text=True, timeout=60, check=False)


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "command", [["pending"], ["tools"], ["submit", "--prompt", "hi"], ["api"], ["worker"]]
)
def test_a_cluster_without_its_broker_is_one_line_and_exit_2(command: list[str]) -> None:
    result = run(command, TOOLLOOP_REDIS_URL=f"redis://127.0.0.1:{find_free_port()}/0")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "TOOLLOOP_BROKER_URL" in _one_line(result)


@pytest.mark.parametrize("command", [["pending"], ["api"]])
def test_a_clusters_database_other_than_0_is_one_line_and_exit_2(command: list[str]) -> None:
    port = find_free_port()
    result = run(
        command,
        TOOLLOOP_REDIS_URL=f"redis://127.0.0.1:{port}/3",
        TOOLLOOP_BROKER_URL=f"redis://127.0.0.1:{port}/1",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "only database 0" in _one_line(result)


@pytest.mark.parametrize("command", [["pending"], ["tools"], ["show", "turn_x"]])
def test_a_cluster_no_node_of_which_answers_is_one_line_and_exit_3(command: list[str]) -> None:
    port = find_free_port()
    result = run(
        command,
        TOOLLOOP_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        TOOLLOOP_BROKER_URL=f"redis://127.0.0.1:{port}/1",
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Redis Cluster" in _one_line(result)


def test_an_orchestrator_taking_one_redis_for_a_cluster_stops_in_one_line() -> None:
    with RedisServer() as server:
        result = run(["orchestrator"], TOOLLOOP_REDIS_URL=server.url, TOOLLOOP_BROKER_URL=server.url)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "is not a node of a Redis Cluster" in _one_line(result)
