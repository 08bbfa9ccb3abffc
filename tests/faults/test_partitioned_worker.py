"""A worker cut off from Redis while its calls finish (issue 30, item 4), and one killed outright.

The worker reaches Redis through a TCP proxy (`tests.support.tcp_proxy`) that the test blackholes (bytes held,
calls hang) or refuses (connections closed, reconnects refused) past the calls' lost-call time, hard limit +
grace: the calls finish during the partition, their outcomes wait (a write held by the link, or the spool),
and the orchestrator, not hearing from the worker (`keys.worker_seen`), waits for it
(TOOLLOOP_LOST_CALL_WAIT_S) instead of answering `worker_lost`. The model gets every real result, and no
soft time limit fires at the worker's idle pool processes once the link is back.

A worker SIGKILLed whole still gets its call answered `worker_lost`, within the documented bound: hard
limit + grace + wait.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass

import pytest

from orchestrator.model import ToolMessage
from orchestrator.store import codec
from tests.faults.env import FaultEnv, call
from tests.support.processes import start_worker
from tests.support.tcp_proxy import TcpProxy
from tests.support.turns import event_data
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e]

MODULES = ["tests.faults.partition_tools"]
HARD_LIMIT_S = 5.0  # partition_work's
GRACE_S = 2.0
WAIT_S = 60.0
CALLS = 3


@dataclass(frozen=True)
class Partition:
    mode: str  # "blackhole" or "refuse"
    seconds: float


QUICK = [Partition("blackhole", 12.0), Partition("refuse", 12.0)]
LONG = [Partition("blackhole", 30.0), Partition("refuse", 30.0)]
PARTITIONS = [
    *(pytest.param(p, id=f"{p.mode}-{p.seconds:g}s", marks=pytest.mark.timeout(150)) for p in QUICK),
    *(
        pytest.param(p, id=f"{p.mode}-{p.seconds:g}s", marks=[pytest.mark.faults, pytest.mark.timeout(240)])
        for p in LONG
    ),
]


def _event_at(env: FaultEnv, turn_id: str, name: str) -> float | None:
    """When the turn's first event `name` happened (epoch seconds), or None."""
    for event in codec.parse_entries(turn_id, env.redis.xrange(keys.turn_events(turn_id))):
        if event.name == name:
            return event.at
    return None


def _soft_limits(log: str) -> list[str]:
    """The lines where a soft limit fired: Celery's warning in the main process, the pool process's error."""
    fired = ("Soft time limit (", "SoftTimeLimitExceeded")
    return [line for line in log.splitlines() if any(word in line for word in fired)]


@pytest.mark.parametrize("partition", PARTITIONS)
def test_a_partitioned_workers_finished_calls_reach_the_model(partition: Partition) -> None:
    assert partition.seconds > HARD_LIMIT_S + GRACE_S  # past the lost-call rule's first look
    with (
        FaultEnv(lost_grace_s=GRACE_S, lost_wait_s=WAIT_S) as env,
        TcpProxy(("127.0.0.1", env.server.port)) as proxy,
    ):
        worker = start_worker(proxy.url_of(env.url), MODULES, concurrency=CALLS, env=env.env)
        env.workers.append(worker)
        env.start_orchestrator()
        tags = [uuid.uuid4().hex[:8] for _ in range(CALLS)]
        turn_id = env.submit([call("partition_work", tag=tag, seconds=1.0) for tag in tags], deadline_s=120)
        wait_until(
            lambda: len(event_data(env.redis, turn_id, "tool_started")) == CALLS, "every call to start"
        )
        getattr(proxy, partition.mode)()
        cut_at = time.monotonic()
        # The rule looks at hard limit + grace, does not hear from the worker, and waits for it.
        wait_until(
            lambda: len(event_data(env.redis, turn_id, "tool_worker_unreachable")) == CALLS,
            "the orchestrator to wait for the unreachable worker",
            timeout_s=partition.seconds,
        )
        time.sleep(max(0.0, partition.seconds - (time.monotonic() - cut_at)))
        proxy.heal()
        outcome = env.wait_all([turn_id], 60)[0]
        assert outcome.status == "completed", outcome
        answers = [m for m in outcome.messages if isinstance(m, ToolMessage)]
        assert sorted(m.content for m in answers) == sorted(f"done {tag}" for tag in tags), answers
        assert not any(m.synthetic for m in answers)
        assert event_data(env.redis, turn_id, "tool_synthesis_requested") == []
        # Heard from again; then, a while on, no stale soft limit has fired at an idle pool process.
        wait_until(lambda: env.redis.exists(keys.worker_seen(worker.hostname)), "the worker's heartbeat")
        env.wait_idle()
        time.sleep(HARD_LIMIT_S)
        assert _soft_limits(worker.log_text()) == []


def test_a_worker_killed_whole_is_answered_worker_lost_within_the_bound() -> None:
    wait_s = 6.0
    with FaultEnv(lost_grace_s=GRACE_S, lost_wait_s=wait_s) as env:
        worker = start_worker(env.url, MODULES, concurrency=1, env=env.env)
        env.workers.append(worker)
        env.start_orchestrator()
        turn_id = env.submit([call("partition_work", tag="killed", seconds=60.0)], deadline_s=120)
        started_at = wait_for(lambda: _event_at(env, turn_id, "tool_started"), "the call to start")
        os.killpg(worker.pid, signal.SIGKILL)
        outcome = env.wait_all([turn_id], 60)[0]
        [answer] = [m for m in outcome.messages if isinstance(m, ToolMessage)]
        assert (answer.failure_kind, answer.synthetic) == (FailureKind.WORKER_LOST, True), answer
        waited_s = (_event_at(env, turn_id, "tool_synthesis_requested") or 0.0) - started_at
        bound_s = HARD_LIMIT_S + GRACE_S + wait_s
        assert bound_s - 0.5 <= waited_s <= bound_s + 2.0, waited_s
