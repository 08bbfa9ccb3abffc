"""Races around one tool call, through a real redis-server, real prefork workers and a real orchestrator.

- identical calls of an idempotent tool at the same moment run the tool once (the second waits for the
  first's stored success), or twice when the first failed, or the second gives up with a clear outcome;
- a direct call that times out revokes its task: the tool stops at once and frees its idempotency key;
- cancelling a turn mid-tool revokes the task the machine sent, by the machine's id: nothing keeps running.

The tools are defined here and served by a worker of this module's own Redis (`TOOLLOOP_TOOL_MODULES` names
this module), so that they never mix with the session worker's catalogue.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from ops.redis_server import RedisServer
from orchestrator.client import Client
from orchestrator.direct import call_tool
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from workers import keys, tool
from workers.contract import FailureKind, ToolOutcome, parse_tool_outcome
from workers.settings import get_worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RUNS = "races:runs:"
TICKS = "races:ticks:"
THIS_MODULE = __name__


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def _sleep_through_soft_limit(seconds: float, tick_key: str | None = None) -> None:
    # Deaf to its soft limit on purpose, so that only a revoke (or the hard limit) stops it early.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if tick_key is not None:
                _redis().incr(tick_key)
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            continue


@tool(idempotency="args", soft_time_limit=2, time_limit=5)
def races_idem(tag: str, seconds: float, fail_first: bool = False) -> dict[str, int]:
    """Idempotent by its arguments: counts its real runs, works `seconds`, optionally fails the first run."""
    runs = int(_redis().incr(RUNS + tag))
    _sleep_through_soft_limit(seconds)
    if fail_first and runs == 1:
        raise ValueError("the first run fails")
    return {"runs": runs}


@tool(soft_time_limit=1, time_limit=30)
def races_ticker(tag: str, seconds: float) -> str:
    """Ticks in Redis every 50 ms for `seconds`; ignores its soft limit."""
    _sleep_through_soft_limit(seconds, TICKS + tag)
    return "done"


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def races_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def races_worker(races_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(races_redis.url, [THIS_MODULE], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def races_orchestrator(races_redis: RedisServer, races_worker: WorkerHandle) -> Iterator[OrchestratorHandle]:
    with RecordingModelServer() as model:
        handle = start_orchestrator(races_redis.url, model_base_url=model.base_url)
        yield handle
        handle.stop()


@pytest.fixture
def db(races_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(races_redis.url)
    yield client
    client.close()


def _tag() -> str:
    return uuid.uuid4().hex


def _at_once(calls: list[Callable[[], ToolOutcome]]) -> list[ToolOutcome]:
    """Run the calls in threads released together; their outcomes in call order."""
    barrier = threading.Barrier(len(calls))
    results: list[ToolOutcome | BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except BaseException as exc:  # re-raised below, in the test's thread
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    outcomes = []
    for result in results:
        if not isinstance(result, ToolOutcome):
            raise AssertionError(f"a call did not return an outcome: {result!r}")
        outcomes.append(result)
    return outcomes


def _identical_calls(url: str, arguments: dict[str, Any], n: int = 2) -> list[ToolOutcome]:
    return _at_once([lambda: call_tool(url, "races_idem", arguments, timeout_s=15) for _ in range(n)])


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _assert_ticks_stop(db: redis.Redis, tag: str, within_s: float) -> None:
    """The ticker stops ticking within `within_s` (and then stays still)."""
    last = -1
    deadline = time.monotonic() + within_s
    while True:
        now = int(db.get(TICKS + tag) or 0)
        if now == last:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the tool still ticks {within_s} s after it should have stopped ({now})")
        last = now
        time.sleep(0.3)  # several tick periods
    time.sleep(0.5)
    assert int(db.get(TICKS + tag) or 0) == last, "the tool started ticking again"


# --- identical idempotent calls at the same moment -----------------------------------------------------


def test_identical_idempotent_calls_at_once_run_the_tool_once(
    races_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    outcomes = _identical_calls(races_redis.url, {"tag": tag, "seconds": 0.8})
    assert all(o.ok for o in outcomes), outcomes
    assert int(db.get(RUNS + tag) or 0) == 1
    assert sorted(o.idempotent_replay for o in outcomes) == [False, True]
    assert outcomes[0].result == outcomes[1].result == {"runs": 1}
    # They really overlapped: the replay was started while the first run worked, and waited for it.
    replay = next(o for o in outcomes if o.idempotent_replay)
    assert replay.duration_ms > 300, replay


def test_after_a_failed_first_run_the_identical_call_runs(
    races_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    outcomes = _identical_calls(races_redis.url, {"tag": tag, "seconds": 0.5, "fail_first": True})
    failed = [o for o in outcomes if not o.ok]
    succeeded = [o for o in outcomes if o.ok]
    assert len(failed) == len(succeeded) == 1, outcomes
    assert failed[0].failure_kind is FailureKind.EXECUTION_ERROR
    assert failed[0].content == "Error: ValueError: the first run fails"
    assert succeeded[0].result == {"runs": 2} and not succeeded[0].idempotent_replay
    assert int(db.get(RUNS + tag) or 0) == 2


def test_a_waiting_identical_call_gives_up_before_its_soft_limit(
    races_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    # The first run takes 3 s (deaf to its 2 s soft limit); the second may wait for it until just before
    # its own soft limit, then answers for itself.
    outcomes = _identical_calls(races_redis.url, {"tag": tag, "seconds": 3.0})
    waited = [o for o in outcomes if not o.ok]
    assert len(waited) == 1, outcomes
    assert waited[0].failure_kind is FailureKind.TIMEOUT and waited[0].retryable
    assert "an identical call of 'races_idem' (same idempotency key) was still running" in waited[0].content
    assert 1.0 < waited[0].duration_ms / 1000 < 2.0
    assert [o.result for o in outcomes if o.ok] == [{"runs": 1}]
    assert int(db.get(RUNS + tag) or 0) == 1
    # The stored success now answers the same call at once.
    again = call_tool(races_redis.url, "races_idem", {"tag": tag, "seconds": 3.0}, timeout_s=15)
    assert again.ok and again.idempotent_replay and again.result == {"runs": 1}


# --- revocation ----------------------------------------------------------------------------------------


def test_a_timed_out_direct_call_is_revoked(
    races_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    started = time.monotonic()
    outcome = call_tool(races_redis.url, "races_ticker", {"tag": tag, "seconds": 20}, timeout_s=1)
    assert time.monotonic() - started < 2.0
    assert outcome.failure_kind is FailureKind.TIMEOUT and outcome.synthetic
    assert outcome.content == "Error: no outcome within 1 s"
    # The worker answered the revoke: a `cancelled` outcome lost the race (kept for audit), and the tool
    # stopped long before its hard limit (2 s, capped from 30 s past the caller's timeout of 1 s).
    late_key = keys.late_outcomes(outcome.call_id)
    _wait_until(lambda: db.llen(late_key) > 0, 5, "the revoked task's outcome")
    late = [parse_tool_outcome(raw) for raw in db.lrange(late_key, 0, -1)]
    assert [o.failure_kind for o in late] == [FailureKind.CANCELLED], late
    _assert_ticks_stop(db, tag, within_s=2)


def test_a_revoked_idempotent_call_frees_its_key_at_once(
    races_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    arguments = {"tag": tag, "seconds": 1.5}
    first = call_tool(races_redis.url, "races_idem", arguments, timeout_s=0.5)
    assert first.failure_kind is FailureKind.TIMEOUT and first.synthetic
    # The revoked child's lock is dropped (not left to its TTL of hard limit + 5 s): the next identical
    # call runs the tool itself rather than giving up waiting.
    second = call_tool(races_redis.url, "races_idem", arguments, timeout_s=15)
    assert second.ok and not second.idempotent_replay and second.result == {"runs": 2}


@pytest.mark.usefixtures("races_orchestrator")
def test_cancelling_a_turn_mid_tool_stops_the_tool(races_redis: RedisServer, db: redis.Redis) -> None:
    tag = _tag()
    call = {"name": "races_ticker", "arguments": {"tag": tag, "seconds": 30}}
    prompt = f"races-{tag} " + json.dumps({"plan": [{"calls": [call]}]})
    client = Client(races_redis.url)
    try:
        turn_id = client.submit(prompt=prompt, model="scripted:plan")
        _wait_until(lambda: int(db.get(TICKS + tag) or 0) > 3, 20, "the tool to tick")
        assert client.cancel(turn_id)
        outcome = client.wait(turn_id, 10)
        assert (outcome.status, outcome.stop_reason) == ("cancelled", "cancelled")
        # The machine revoked the task by the id it was sent under: the tool (hard limit 30 s) stops now.
        _assert_ticks_stop(db, tag, within_s=3)
    finally:
        client.close()
