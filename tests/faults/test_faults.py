"""Fault injection against the whole system (issue 6): each scenario has a quick variant that `make test`
runs and a long one marked `faults` (`make test-faults`).

After each: every submitted turn is terminal, every tool call in every history is answered exactly once,
idempotent tools ran to completion at most once, and no process is left behind (`FaultEnv.close`).
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from dataclasses import dataclass

import pytest

from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.publishing.publisher import build_send_options, get_producer_app
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from orchestrator.store.codec import parse_tool_outcome
from tests.faults.env import FaultEnv, call, is_running
from tests.support.task_events import TaskEvents
from tests.support.turns import event_data
from tests.support.waiting import wait_until
from workers import keys
from workers.contract import FailureKind, ToolCallRequest

pytestmark = [pytest.mark.e2e]


@dataclass(frozen=True)
class Size:
    turns: int
    calls: int
    repeats: int
    seconds: float
    timeout_s: float


QUICK = Size(turns=4, calls=2, repeats=2, seconds=0.3, timeout_s=60)
LONG = Size(turns=30, calls=3, repeats=12, seconds=0.5, timeout_s=300)
# How long Redis stays away each time it is stopped mid-turn.
OUTAGE_S = 1.5
SIZES = [
    pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(90)),
    pytest.param(LONG, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(600)]),
]


def _tag() -> str:
    return uuid.uuid4().hex[:12]


def _submit_work(env: FaultEnv, size: Size, *, rounds: int = 1) -> tuple[list[str], list[str]]:
    ids, tags = [], []
    for _ in range(size.turns):
        batch = [_tag() for _ in range(size.calls)]
        tags += batch
        # Each round repeats the same arguments: an idempotent replay after the first.
        ids.append(
            env.submit([call("fault_work", tag=t, seconds=size.seconds) for t in batch], rounds=rounds)
        )
    return ids, tags


def _check_idempotent(
    env: FaultEnv, tags: list[str], outcomes: list[TurnOutcome], killed: frozenset[int] = frozenset()
) -> None:
    for tag in tags:
        _, done = env.runs(tag)
        # A completion may repeat only when the process that got there first was SIGKILLed before it could
        # write the outcome: the tool's side effect happened, its record did not. Any other repeat is a bug.
        survivors = [pid for pid in env.completed_by(tag) if pid not in killed]
        assert len(survivors) <= 1, f"idempotent call {tag} ran to completion {done} times ({survivors})"
    answered_ok = {
        m.content.removeprefix("done ")
        for o in outcomes
        for m in o.messages
        if isinstance(m, ToolMessage) and not m.is_error
    }
    for tag in answered_ok & set(tags):
        assert env.runs(tag)[1] >= 1, f"call {tag} was answered ok but never completed"


def _tool_messages(outcome: TurnOutcome) -> list[ToolMessage]:
    return [m for m in outcome.messages if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("size", SIZES)
def test_worker_children_sigkilled_under_load(size: Size) -> None:
    with FaultEnv() as env:
        worker = env.start_worker(concurrency=2)
        env.start_orchestrator()
        ids, tags = _submit_work(env, size)
        killed: set[int] = set()
        started = 0
        for _ in range(size.repeats):
            # A kill lands while work runs: once a run has started since the last one.
            started = env.wait_new_start(tags, started)
            children = worker.child_pids()
            if children:
                victim = random.choice(children)
                os.kill(victim, signal.SIGKILL)
                killed.add(victim)
        outcomes = env.wait_all(ids, size.timeout_s)
        _check_idempotent(env, tags, outcomes, frozenset(killed))
        assert worker.process.poll() is None, "the worker itself must survive its children's deaths"
        # Still serving: a fresh turn completes.
        env.wait_all([env.submit([call("fault_work", tag=_tag(), seconds=0.0)])], 60)


@pytest.mark.parametrize("size", SIZES)
def test_one_of_two_orchestrators_sigkilled(size: Size) -> None:
    with FaultEnv(lease_ttl_s=2.0) as env:
        env.start_worker(concurrency=2)
        victim = env.start_orchestrator()
        env.start_orchestrator()
        ids, tags = _submit_work(env, size, rounds=2)
        wait_until(
            lambda: victim.orchestrator_id in env.redis.mget([keys.turn_lease(t) for t in ids]),
            "the victim to own a turn",
        )
        victim.kill()
        outcomes = env.wait_all(ids, size.timeout_s)
        assert all(o.status == "completed" for o in outcomes), [o.stop_reason for o in outcomes]
        _check_idempotent(env, tags, outcomes)


@pytest.mark.parametrize("size", SIZES)
def test_redis_stopped_and_restarted_mid_turn(size: Size) -> None:
    with FaultEnv() as env:
        env.start_worker(concurrency=2)
        env.start_orchestrator()
        ids, tags = _submit_work(env, size, rounds=2)
        started = 0
        for _ in range(1 if size is QUICK else 3):
            started = env.wait_new_start(tags, started)  # mid-turn: tools are running
            env.server.stop(keep_data=True)  # SIGTERM: Redis flushes its append-only file
            time.sleep(OUTAGE_S)  # the fault itself: how long Redis stays away
            env.server.start()
        outcomes = env.wait_all(ids, size.timeout_s)
        _check_idempotent(env, tags, outcomes)
        assert all(is_running(p) for p in env.orchestrators)
        assert all(is_running(w) for w in env.workers)
        env.wait_all([env.submit([call("fault_work", tag=_tag(), seconds=0.0)])], 60)


@pytest.mark.parametrize("size", SIZES)
def test_broker_redelivers_a_finished_task(size: Size) -> None:
    with FaultEnv() as env:
        env.start_worker(concurrency=2)
        env.start_orchestrator()
        settings = Settings(redis_url=env.url)
        app = get_producer_app(settings)
        spec = read_catalogue(env.redis)["fault_work"]
        with TaskEvents(env.url) as task_events:
            for _ in range(size.repeats):
                tag = _tag()
                turn_id = env.submit([call("fault_work", tag=tag, seconds=0.05)])
                (outcome,) = env.wait_all([turn_id], 60)
                (answer,) = _tool_messages(outcome)
                wire_id = build_wire_call_id(turn_id, answer.tool_call_id)
                stored = env.redis.get(keys.outcome(wire_id))
                assert stored is not None
                (dispatched,) = event_data(env.redis, turn_id, "tool_dispatched")
                task_id = dispatched["task_id"]
                task_events.wait_ended(task_id)
                # The very message the orchestrator published (same task id), delivered once more.
                request = ToolCallRequest(
                    call_id=wire_id,
                    tool="fault_work",
                    arguments={"tag": tag, "seconds": 0.05},
                    turn_id=turn_id,
                    attempt=dispatched["attempt"],
                )
                app.send_task(**build_send_options(spec, request, time.time(), task_id=task_id))
                # The second delivery has ended (Flower's events say so): it ran nothing, wrote nothing.
                task_events.wait_ended(task_id, times=2)
                assert env.runs(tag) == (1, 1)
                assert env.redis.get(keys.outcome(wire_id)) == stored
                assert env.redis.llen(keys.late_outcomes(wire_id)) == 0
                assert env.client.outcome(turn_id) == outcome


@pytest.mark.parametrize("size", SIZES)
def test_tool_that_never_returns(size: Size) -> None:
    with FaultEnv() as env:
        worker = env.start_worker(concurrency=2)
        env.start_orchestrator()
        count = 1 if size is QUICK else 4
        hang_tags = [_tag() for _ in range(count)]
        ids = [
            env.submit([call("fault_hang", tag=t), call("fault_work", tag=_tag(), seconds=0.05)])
            for t in hang_tags
        ]
        outcomes = env.wait_all(ids, size.timeout_s)
        for outcome in outcomes:
            hang, work = _tool_messages(outcome)
            assert hang.is_error and hang.failure_kind == FailureKind.TIMEOUT, hang.content
            assert not work.is_error
            assert outcome.status == "completed"
        for tag in hang_tags:
            assert env.runs(tag)[0] == 1  # killed at the hard limit, never retried
        assert worker.process.poll() is None
        env.wait_all([env.submit([call("fault_work", tag=_tag(), seconds=0.0)])], 60)


@pytest.mark.parametrize("size", SIZES)
def test_tool_that_returns_50_mb(size: Size) -> None:
    with FaultEnv() as env:
        env.start_worker(concurrency=2)
        orchestrator = env.start_orchestrator()
        count = 1 if size is QUICK else 3
        ids = [env.submit([call("fault_huge", megabytes=50)]) for _ in range(count)]
        outcomes = env.wait_all(ids, size.timeout_s)
        for turn_id, outcome in zip(ids, outcomes, strict=True):
            assert outcome.status == "completed"
            (answer,) = _tool_messages(outcome)
            assert not answer.is_error
            assert len(answer.content.encode()) < 128 * 1024, "the model must see a truncated result"
            wire_id = build_wire_call_id(turn_id, answer.tool_call_id)
            stored = parse_tool_outcome(env.redis.get(keys.outcome(wire_id)))
            assert stored is not None and stored.truncated and stored.full_result_key
            assert stored.result_bytes is not None and stored.result_bytes >= 50 * 1024 * 1024
            assert int(env.redis.strlen(stored.full_result_key)) >= 50 * 1024 * 1024
        assert is_running(orchestrator)
