"""Races around one tool call, through a real redis-server, real prefork workers and a real orchestrator.

- identical calls of an idempotent tool at the same moment run the tool once (the second waits for the
  first's stored success), or twice when the first failed, or the second gives up with a clear outcome;
- a direct call that times out revokes its task: the tool stops at once and frees its idempotency key;
- cancelling a turn mid-tool revokes the task the machine sent, by the machine's id: nothing keeps running.

Overlap is made, not hoped for: a gated tool holds until the test opens its gate (a Redis key), once both
identical calls have started. "Stopped" is the pool process that ran the tool dead, and the worker's own
`cancelled` answer to the revoke before any hard limit's — never how long something took.

The tools are defined here and served by a worker of this module's own Redis (`TOOLLOOP_TOOL_MODULES` names
this module), so that they never mix with the session worker's catalogue.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from orchestrator.client.direct import call_tool
from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for, wait_until
from workers import ToolContext, keys, tool
from workers.contract import FailureKind, ToolOutcome, parse_tool_outcome
from workers.settings import get_worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RUNS = "races:runs:"
TICKS = "races:ticks:"
GATES = "races:gates:"
RUNNERS = "races:runners:"
THIS_MODULE = __name__
# How long a gated tool holds at most if its test never opens the gate (it failed first).
HOLD_MAX_S = 25.0


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().redis_url)


def _work(seconds: float, *, tick_key: str | None = None, gate_key: str | None = None) -> None:
    """Work `seconds`, or until `gate_key` exists (the test's go). Deaf to its soft limit on purpose, so that
    only a revoke, the hard limit or the gate stops it early."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if tick_key is not None:
                _redis().incr(tick_key)
            if gate_key is not None and _redis().exists(gate_key):
                return
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            continue


@tool(idempotency="args", soft_time_limit=2, time_limit=30)
def races_idem(tag: str, seconds: float, fail_first: bool = False, gated: bool = False) -> dict[str, int]:
    """Idempotent by its arguments: counts its real runs, works `seconds` (or, `gated`, until its gate
    opens), optionally fails the first run. A short soft limit: an identical call gives up waiting soon."""
    runs = int(_redis().incr(RUNS + tag))
    _work(seconds, gate_key=GATES + tag if gated else None)
    if fail_first and runs == 1:
        raise ValueError("the first run fails")
    return {"runs": runs}


@tool(idempotency="args", soft_time_limit=40, time_limit=50)
def races_held(tag: str, fail_first: bool = False) -> dict[str, int]:
    """`races_idem`, gated, with a soft limit long enough that an identical call waits for it to the end."""
    runs = int(_redis().incr(RUNS + tag))
    _work(HOLD_MAX_S, gate_key=GATES + tag)
    if fail_first and runs == 1:
        raise ValueError("the first run fails")
    return {"runs": runs}


@tool(soft_time_limit=1, time_limit=30)
def races_ticker(tag: str, seconds: float, ctx: ToolContext) -> str:
    """Names the pool process it runs in and its call, then ticks in Redis every 50 ms for `seconds`;
    ignores its soft limit."""
    _redis().set(RUNNERS + tag, json.dumps({"pid": os.getpid(), "call_id": ctx.call_id}))
    _work(seconds, tick_key=TICKS + tag)
    return "done"


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def races_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, [THIS_MODULE], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def races_orchestrator(module_redis: RedisServer, races_worker: WorkerHandle) -> Iterator[OrchestratorHandle]:
    with RecordingModelServer() as model:
        handle = start_orchestrator(module_redis.url, model_base_url=model.base_url)
        yield handle
        handle.stop()


@pytest.fixture
def db(module_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(module_redis.url)
    yield client
    client.close()


def _tag() -> str:
    return uuid.uuid4().hex


def _started_calls(db: redis.Redis) -> set[bytes]:
    # The start script sets each started call's fence (`keys.fence(call_id)`); those keys outlive the test.
    return set(db.scan_iter(match=keys.fence("*")))


def _start_identical(
    pool: ThreadPoolExecutor, db: redis.Redis, url: str, tool_name: str, arguments: dict[str, Any]
) -> list[Future[ToolOutcome]]:
    """Two identical calls, both started (their executions counted) while the first run holds at its gate."""
    before = _started_calls(db)
    calls = [pool.submit(call_tool, url, tool_name, arguments, timeout_s=DEFAULT_TIMEOUT_S) for _ in range(2)]
    tag = arguments["tag"]
    wait_until(
        lambda: len(_started_calls(db) - before) == 2 and int(db.get(RUNS + tag) or 0) == 1,
        "both identical calls to start while the first run holds",
    )
    return calls


def _runner(db: redis.Redis, tag: str) -> dict[str, Any]:
    def named() -> bytes | None:
        raw = db.get(RUNNERS + tag)
        assert not isinstance(raw, str)  # a client that does not decode
        return raw

    raw = wait_for(named, "the ticker to start")
    runner: dict[str, Any] = json.loads(raw)
    return runner


def _answers(db: redis.Redis, call_id: str) -> list[ToolOutcome]:
    """The call's outcome and the ones that lost the race to it (kept for audit)."""
    raws = [db.get(keys.outcome(call_id)), *db.lrange(keys.late_outcomes(call_id), 0, -1)]
    return [parse_tool_outcome(raw) for raw in raws if raw is not None]


def _running(pid: int) -> bool:
    """Whether process `pid` still runs: a killed pool process stays a zombie until the worker reaps it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in {"Z", "X"}


def _assert_stopped_by_the_revoke(db: redis.Redis, tag: str, call_id: str) -> None:
    """The worker answered the revoke (`cancelled`, as its parent does for a terminated or discarded
    delivery) before any hard limit did, and the pool process that ran the tool, if it had started, died:
    nothing of it runs any more. (The parent may still answer the hard limit when it comes, the delivery
    being in its books until then: a late outcome, kept for audit.)"""
    wait_until(
        lambda: any(o.content.endswith("(task revoked)") for o in _answers(db, call_id)),
        "the worker's answer to the revoke",
    )
    contents = [o.content for o in _answers(db, call_id)]
    revoked_at = next(i for i, content in enumerate(contents) if content.endswith("(task revoked)"))
    assert not any("hard limit" in content for content in contents[:revoked_at]), contents
    runner = db.get(RUNNERS + tag)
    if runner is not None:  # a revoke may also have found the task still queued, never started
        pid = json.loads(runner)["pid"]
        wait_until(lambda: not _running(pid), "the tool's pool process to die")


def _collect(calls: list[Future[ToolOutcome]]) -> list[ToolOutcome]:
    return [call.result(timeout=DEFAULT_TIMEOUT_S) for call in calls]


# --- identical idempotent calls at the same moment -----------------------------------------------------


def test_identical_idempotent_calls_at_once_run_the_tool_once(
    module_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    with ThreadPoolExecutor(2) as pool:
        try:
            # They really overlap: the second started while the first run held, and waits for it.
            calls = _start_identical(pool, db, module_redis.url, "races_held", {"tag": tag})
        finally:
            db.set(GATES + tag, 1)
        outcomes = _collect(calls)
    assert all(o.ok for o in outcomes), outcomes
    assert int(db.get(RUNS + tag) or 0) == 1
    assert sorted(o.idempotent_replay for o in outcomes) == [False, True]
    assert outcomes[0].result == outcomes[1].result == {"runs": 1}


def test_after_a_failed_first_run_the_identical_call_runs(
    module_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    with ThreadPoolExecutor(2) as pool:
        try:
            calls = _start_identical(
                pool, db, module_redis.url, "races_held", {"tag": tag, "fail_first": True}
            )
        finally:
            db.set(GATES + tag, 1)
        outcomes = _collect(calls)
    failed = [o for o in outcomes if not o.ok]
    succeeded = [o for o in outcomes if o.ok]
    assert len(failed) == len(succeeded) == 1, outcomes
    assert failed[0].failure_kind is FailureKind.EXECUTION_ERROR
    assert failed[0].content == "Error: ValueError: the first run fails"
    assert succeeded[0].result == {"runs": 2} and not succeeded[0].idempotent_replay
    assert int(db.get(RUNS + tag) or 0) == 2


def test_a_waiting_identical_call_gives_up_before_its_soft_limit(
    module_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    # The first run holds until its gate opens (deaf to its 2 s soft limit); the second may wait for it
    # until just before its own soft limit, then answers for itself — while the first still holds.
    arguments = {"tag": tag, "seconds": HOLD_MAX_S, "gated": True}
    with ThreadPoolExecutor(2) as pool:
        try:
            calls = _start_identical(pool, db, module_redis.url, "races_idem", arguments)
            done, _ = wait_futures(calls, timeout=DEFAULT_TIMEOUT_S, return_when=FIRST_COMPLETED)
            assert len(done) == 1, "the waiting call never answered while the first run held"
            gave_up = done.pop().result()
        finally:
            db.set(GATES + tag, 1)
        outcomes = _collect(calls)
    assert gave_up.failure_kind is FailureKind.TIMEOUT and gave_up.retryable, gave_up
    assert "an identical call of 'races_idem' (same idempotency key) was still running" in gave_up.content
    assert [o.result for o in outcomes if o.ok] == [{"runs": 1}]
    assert int(db.get(RUNS + tag) or 0) == 1
    # The stored success now answers the same call at once.
    again = call_tool(module_redis.url, "races_idem", arguments, timeout_s=DEFAULT_TIMEOUT_S)
    assert again.ok and again.idempotent_replay and again.result == {"runs": 1}


# --- revocation ----------------------------------------------------------------------------------------


def test_a_timed_out_direct_call_is_revoked(
    module_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    outcome = call_tool(module_redis.url, "races_ticker", {"tag": tag, "seconds": 20}, timeout_s=1)
    assert outcome.failure_kind is FailureKind.TIMEOUT and outcome.synthetic
    assert outcome.content == "Error: no outcome within 1 s"
    # The worker answered the revoke: a `cancelled` outcome lost the race (kept for audit), and the tool
    # stopped long before its 20 s of work and its hard limit (2 s, capped from 30 s past the caller's 1 s).
    _assert_stopped_by_the_revoke(db, tag, outcome.call_id)
    late = [parse_tool_outcome(raw) for raw in db.lrange(keys.late_outcomes(outcome.call_id), 0, -1)]
    assert late[0].failure_kind is FailureKind.CANCELLED, [o.content for o in late]


def test_a_revoked_idempotent_call_frees_its_key_at_once(
    module_redis: RedisServer, races_worker: WorkerHandle, db: redis.Redis
) -> None:
    tag = _tag()
    arguments = {"tag": tag, "seconds": HOLD_MAX_S, "gated": True}
    # Held at its gate until the caller gives up (3 s: time enough for the worker to start it).
    first = call_tool(module_redis.url, "races_idem", arguments, timeout_s=3)
    assert first.failure_kind is FailureKind.TIMEOUT and first.synthetic
    wait_until(
        lambda: any(o.content.endswith("(task revoked)") for o in _answers(db, first.call_id)),
        "the worker's answer to the revoke",
    )
    assert int(db.get(RUNS + tag) or 0) == 1, "the first call never ran: nothing held the key"
    # The revoked execution's lock went with its answer (not left to its TTL, twice its hard limit + 5 s):
    # the next identical call runs the tool itself rather than waiting and giving up.
    db.set(GATES + tag, 1)
    second = call_tool(module_redis.url, "races_idem", arguments, timeout_s=DEFAULT_TIMEOUT_S)
    assert second.ok and not second.idempotent_replay and second.result == {"runs": 2}, second


@pytest.mark.usefixtures("races_orchestrator")
def test_cancelling_a_turn_mid_tool_stops_the_tool(module_redis: RedisServer, db: redis.Redis) -> None:
    tag = _tag()
    call = {"name": "races_ticker", "arguments": {"tag": tag, "seconds": 30}}
    prompt = f"races-{tag} " + json.dumps({"plan": [{"calls": [call]}]})
    client = Client(module_redis.url)
    try:
        turn_id = client.submit(prompt=prompt, model="scripted:plan")
        wait_until(lambda: int(db.get(TICKS + tag) or 0) > 3, "the tool to tick")
        assert client.cancel(turn_id)
        outcome = client.wait(turn_id, DEFAULT_TIMEOUT_S)
        assert (outcome.status, outcome.stop_reason) == ("cancelled", "cancelled")
        # The machine revoked the task by the id it was sent under: the tool (hard limit 30 s) stops now.
        _assert_stopped_by_the_revoke(db, tag, _runner(db, tag)["call_id"])
    finally:
        client.close()
