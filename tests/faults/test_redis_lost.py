"""Redis restarted without persistence mid-turn (issue 12, item 7): the loss is logged, counted and shown.

A Redis with no append-only file is SIGKILLed while turns have slow tool calls in flight and comes back empty
on the same port. The orchestrator must say so in one ERROR line naming the turns, count them in
`toolloop_turns_lost_total`, record each as `failed` so that `toolloop show` and a waiting client tell the
user it was lost (and `show` of an unknown id mentions the loss), never let a late tool result bring a lost
turn back, and go on serving new turns — with no process exiting.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

from orchestrator.model import ToolMessage
from orchestrator.redis_server import find_free_port
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.store import losses
from orchestrator.store.codec import parse_tool_outcome
from tests.faults.env import FaultEnv, call, check_turn, is_running
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.processes import TOOLLOOP_BIN
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e]


@dataclass(frozen=True)
class Size:
    turns: int
    restarts: int
    # Long enough that the calls started are still running when Redis goes: the wait for a lease renewal
    # (`_wait_in_flight`) comes first.
    tool_s: float
    timeout_s: float


QUICK = Size(turns=3, restarts=1, tool_s=4.0, timeout_s=60)
LONG = Size(turns=12, restarts=3, tool_s=5.0, timeout_s=120)
SIZES = [
    pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(120)),
    pytest.param(LONG, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(600)]),
]


def _tag() -> str:
    return uuid.uuid4().hex[:12]


def _start_orchestrator(env: FaultEnv) -> tuple[OrchestratorHandle, int]:
    """`toolloop orchestrator` serving its Prometheus metrics (TOOLLOOP_METRICS_PORT); (it, the port)."""
    port = find_free_port()
    return env.start_orchestrator(env={"TOOLLOOP_METRICS_PORT": str(port)}), port


def _turns_lost_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r"^toolloop_turns_lost_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _show(env: FaultEnv, turn_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLLOOP_BIN), "show", turn_id],
        env={"PATH": "/usr/bin:/bin", "TOOLLOOP_REDIS_URL": env.url},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _wait_in_flight(env: FaultEnv, ids: list[str], tags: list[str]) -> None:
    """Until every turn is adopted (its first state saved), a tool call has started on a worker, and the
    orchestrator has held every turn for a while.

    Its durability watcher notes the turns held every `TRACK_S` (0.1 s), in memory: a turn adopted in the
    last instant before Redis goes, and dropped by the driver before the watcher looks, is a window this test
    stays out of. A lease renewed after the test first saw it (its expiry moved on) shows that the
    orchestrator's loop has run a renewal period — many of the watcher's looks — with the turn held."""

    def in_flight() -> bool:
        adopted = all(env.redis.exists(keys.turn_state(t)) for t in ids)
        return adopted and sum(env.runs(tag)[0] for tag in tags) >= 1

    def expiry_s(turn_id: str) -> float:
        return time.monotonic() + env.redis.pttl(keys.turn_lease(turn_id)) / 1000

    wait_until(in_flight, "every turn adopted and a tool call started")
    first = {t: expiry_s(t) for t in ids}
    # Renewals come every third of the lease's life (1 s here): far more than this margin of error.
    wait_until(
        lambda: all(expiry_s(t) > first[t] + 0.2 for t in ids),
        "every turn's lease renewed by its orchestrator",
    )


def _wait_recorded(env: FaultEnv, ids: list[str], orchestrator: OrchestratorHandle) -> None:

    def statuses_and_log() -> str:
        return f"{[env.redis.get(keys.turn_status(t)) for t in ids]}\n{orchestrator.log_text()}"

    wait_until(
        lambda: all(env.redis.get(keys.turn_status(t)) == "failed" for t in ids),
        f"the lost turns {ids} recorded as failed",
        detail=statuses_and_log,
    )


def _check_lost(env: FaultEnv, turn_id: str) -> None:
    """`show` says lost; a waiting client gets the failed outcome; a late tool result changed nothing."""
    shown = _show(env, turn_id)
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["status"] == "failed"
    assert view["outcome"]["error"]["code"] == losses.LOST_CODE
    assert "without its data" in view["outcome"]["error"]["message"]
    assert f"turn {turn_id} was lost" in shown.stderr
    outcome = env.client.wait(turn_id, 30)
    assert outcome.status == "failed" and losses.is_lost_outcome(outcome)
    check_turn(outcome)  # its round closed: no call left unanswered in the transcript
    for message in outcome.messages:
        if isinstance(message, ToolMessage) and message.synthetic:
            wire_id = build_wire_call_id(turn_id, message.tool_call_id)
            stored = parse_tool_outcome(env.redis.get(keys.outcome(wire_id)))
            assert stored is not None, "a lost call's outcome is written, so no worker starts it"


def _wait_catalogue(env: FaultEnv) -> None:
    """Until the worker's tools are published: after Redis came back empty, at its next catalogue refresh."""
    wait_until(
        lambda: env.redis.hlen(keys.CATALOGUE),
        "the worker to publish its catalogue again",
        timeout_s=max(60.0, 3 * keys.CATALOGUE_REFRESH_S),
    )


def _lose_turns(env: FaultEnv, size: Size, orchestrator: OrchestratorHandle) -> list[str]:
    _wait_catalogue(env)
    tags = [_tag() for _ in range(size.turns)]
    ids = [env.submit([call("fault_work", tag=t, seconds=size.tool_s)]) for t in tags]
    _wait_in_flight(env, ids, tags)
    env.server.kill()  # a crash; with no append-only file, it comes back empty
    env.server.start()
    _wait_recorded(env, ids, orchestrator)
    return ids


@pytest.mark.parametrize("size", SIZES)
def test_redis_restarted_empty_loses_turns_loudly(size: Size) -> None:
    with FaultEnv(persistent=False) as env:
        worker = env.start_worker(concurrency=2)
        orchestrator, metrics_port = _start_orchestrator(env)
        lost_total = 0
        for restart in range(1, size.restarts + 1):
            ids = _lose_turns(env, size, orchestrator)
            lost_total += len(ids)
            lines = [ln for ln in orchestrator.log_text().splitlines() if "DATA LOST" in ln]
            assert len(lines) == restart, lines
            assert f"{len(ids)} turn(s) lost" in lines[-1] and "ERROR" in lines[-1], lines[-1]
            assert all(turn_id in lines[-1] for turn_id in ids), lines[-1]
            assert "without its data" in lines[-1]
            assert _turns_lost_total(metrics_port) == lost_total
            for turn_id in ids:
                _check_lost(env, turn_id)
            # Once every tool call still running has ended and written its late result (kept for audit),
            # no lost turn came back to life.
            env.wait_idle()
            assert all(env.redis.get(keys.turn_status(t)) == "failed" for t in ids)
            assert all(losses.is_lost_outcome(env.client.outcome(t)) for t in ids)

        unknown = _show(env, f"turn_{uuid.uuid4().hex}")
        assert unknown.returncode == 1
        assert "lost with Redis's data" in unknown.stderr and "without its data" in unknown.stderr

        # Still serving: a fresh turn with a tool call completes.
        _wait_catalogue(env)
        tag = _tag()
        (outcome,) = env.wait_all([env.submit([call("fault_work", tag=tag, seconds=0.0)])], size.timeout_s)
        assert outcome.status == "completed", outcome
        answers = [m for m in outcome.messages if isinstance(m, ToolMessage)]
        assert [m.content for m in answers] == [f"done {tag}"], answers
        assert is_running(orchestrator), orchestrator.log_text()
        assert is_running(worker), worker.log_text()
