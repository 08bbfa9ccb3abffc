"""Per-tool concurrency limits on real prefork workers and a real redis-server (`workers.concurrency`).

Each tool notes its start and end with a timestamp in a file (`tests.support.concurrency_tools`), so the
test counts how many calls of it ran at once across every pool process of every worker:

- `max_concurrency=2`, 8 calls at once on two workers of 3 processes each: never more than 2 at once, 2 at
  once indeed (the limit is used, not a queue of one), every call its real result; the calls that waited
  told their turn once each (`tool_waiting_for_slot`) and showed in Flower as retries ("waiting for a slot");
- `max_concurrency_per_tenant=1` with two tenants: one per tenant at once, both tenants at once;
- a call that waits past its turn's deadline is answered `deadline_exceeded` without running;
- a slot held by a pool process killed under it is given back by the worker's parent at once, and one held
  by a whole worker SIGKILLed expires with its execution's hard limit and margin: the next calls complete.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.catalogue import read_catalogue
from tests.support.calls import wait_tool_outcome
from tests.support.concurrency_tools import read_notes
from tests.support.processes import WorkerHandle, start_worker
from tests.support.task_events import TaskEvents
from tests.support.turns import event_data
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.concurrency import WAIT_COUNTDOWN_MAX_S
from workers.contract import FailureKind, ToolCallRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOOLS = "tests.support.concurrency_tools"


@pytest.fixture(scope="module")
def url(module_redis: RedisServer) -> str:
    return module_redis.url


@pytest.fixture(scope="module")
def workers(url: str) -> Iterator[list[WorkerHandle]]:
    handles = [start_worker(url, [TOOLS], concurrency=3, wait=False) for _ in range(2)]
    try:
        for handle in handles:
            handle.wait_ready()
        yield handles
    finally:
        for handle in handles:
            handle.stop()


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    db = redis.Redis.from_url(url)
    yield db
    db.close()


def _open_turn(db: redis.Redis) -> str:
    """A turn as a worker sees it running: its request, and its stream with `turn_queued`."""
    turn_id = f"turn_slots_{uuid.uuid4().hex[:12]}"
    db.set(keys.turn_request(turn_id), "{}")
    db.xadd(keys.turn_events(turn_id), codec.build_event_fields(codec.TURN_QUEUED, {}, time.time()))  # type: ignore[arg-type]
    return turn_id


def _dispatch(
    url: str,
    db: redis.Redis,
    tool: str,
    arguments: dict[str, Any],
    *,
    turn_id: str | None = None,
    tenant: str = "default",
    deadline_at: float | None = None,
) -> str:
    model_id = f"call_{uuid.uuid4().hex[:10]}"
    call_id = build_wire_call_id(turn_id, model_id) if turn_id else f"slots-{model_id}"
    request = ToolCallRequest.model_validate(
        {
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "turn_id": turn_id,
            "tenant": tenant,
            "deadline_at": deadline_at,
            "dispatched_at": time.time(),
        }
    )
    dispatch_call(get_producer_app(Settings(redis_url=url)), read_catalogue(db)[tool], request)
    return call_id


def max_overlap(
    notes: list[tuple[str, float, str]], group: Callable[[str], str] = lambda _: ""
) -> dict[str, int]:
    """The most runs of each group (of labels) at once: +1 at a start, -1 at an end, ends first on a tie."""
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for event, _at, label in sorted(notes, key=lambda note: (note[1], note[0] == "start")):
        key = group(label)
        running[key] = running.get(key, 0) + (1 if event == "start" else -1)
        most[key] = max(most.get(key, 0), running[key])
    return most


def test_max_concurrency_2_runs_8_calls_two_at_a_time_across_two_workers(
    url: str, client: redis.Redis, workers: list[WorkerHandle], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    turn_id = _open_turn(client)
    with TaskEvents(url) as celery_events:
        call_ids = [
            _dispatch(
                url, client, "limited_pair", {"runs_file": str(runs), "n": n, "seconds": 0.6}, turn_id=turn_id
            )
            for n in range(8)
        ]
        outcomes = [wait_tool_outcome(client, call_id, 60) for call_id in call_ids]
        retried = celery_events.of_type("task-retried")
    assert [(o.ok, o.result) for o in outcomes] == [(True, n * 10) for n in range(8)], outcomes
    notes = read_notes(runs)
    assert len(notes) == 16
    assert max_overlap(notes) == {"": 2}, sorted(notes, key=lambda note: note[1])
    assert len({o.worker for o in outcomes}) == 2  # both workers ran some
    waiting = event_data(client, turn_id, "tool_waiting_for_slot")
    told = [event["call_id"] for event in waiting]
    assert waiting and len(told) == len(set(told)), waiting
    assert {(e["tool"], e["limit"], e["max_concurrency"]) for e in waiting} == {
        ("limited_pair", "max_concurrency", 2)
    }
    assert any("waiting for a slot" in str(event.get("exception")) for event in retried), retried
    assert client.zcard(keys.tool_slots("limited_pair")) == 0


def test_max_concurrency_per_tenant_1_runs_one_per_tenant_at_once(
    url: str, client: redis.Redis, workers: list[WorkerHandle], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    calls = [
        (
            tenant,
            _dispatch(
                url, client, "one_per_tenant", {"runs_file": str(runs), "n": n, "seconds": 0.5}, tenant=tenant
            ),
        )
        for n in range(3)
        for tenant in ("acme", "globex")
    ]
    for tenant, call_id in calls:
        outcome = wait_tool_outcome(client, call_id, 60)
        assert outcome.ok and str(outcome.result).startswith(f"{tenant}:"), outcome
    notes = read_notes(runs)
    assert max_overlap(notes, lambda label: label.split(":")[0]) == {"acme": 1, "globex": 1}, notes
    assert max_overlap(notes) == {"": 2}, notes  # the two tenants ran side by side


def test_a_call_waiting_past_its_deadline_is_answered_deadline_exceeded(
    url: str, client: redis.Redis, workers: list[WorkerHandle], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    holder = _dispatch(url, client, "single_slot", {"runs_file": str(runs), "n": 1, "seconds": 1.8})
    wait_until(lambda: read_notes(runs), "the first call to start")
    late = _dispatch(
        url,
        client,
        "single_slot",
        {"runs_file": str(runs), "n": 2, "seconds": 0},
        deadline_at=time.time() + 0.8,
    )
    outcome = wait_tool_outcome(client, late, 30)
    assert outcome.failure_kind is FailureKind.DEADLINE_EXCEEDED, outcome
    assert wait_tool_outcome(client, holder, 30).ok
    assert [label for _event, _at, label in read_notes(runs)] == ["1", "1"]


def test_a_pool_process_killed_under_its_slot_gives_it_back_at_once(
    url: str, client: redis.Redis, workers: list[WorkerHandle], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    pids = tmp_path / "pids"
    killed = _dispatch(
        url, client, "single_slot", {"runs_file": str(runs), "n": 1, "seconds": 1.8, "pid_file": str(pids)}
    )
    pid = wait_for(lambda: int(pids.read_text()) if pids.exists() and pids.read_text() else None, "its pid")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    outcome = wait_tool_outcome(client, killed, 30)
    assert outcome.failure_kind is FailureKind.WORKER_LOST, outcome
    following = _dispatch(url, client, "single_slot", {"runs_file": str(runs), "n": 2, "seconds": 0})
    assert wait_tool_outcome(client, following, 30).ok
    started = [at for event, at, label in read_notes(runs) if event == "start" and label == "2"]
    # Well before the dead process's slot would have expired (3 s hard limit + margin after it was taken).
    assert started[0] - killed_at < 3.0, (started, killed_at)


def test_a_worker_sigkilled_while_holding_a_slot_does_not_leak_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    pids = tmp_path / "pids"
    with RedisServer() as server:
        db = redis.Redis.from_url(server.url)
        doomed = start_worker(server.url, [TOOLS], concurrency=1)
        try:
            _dispatch(
                server.url,
                db,
                "single_slot",
                {"runs_file": str(runs), "n": 1, "seconds": 1.8, "pid_file": str(pids)},
            )
            wait_until(lambda: pids.exists() and pids.read_text(), "the first call to start")
            os.killpg(doomed.pid, signal.SIGKILL)  # the whole worker: nobody gives its slot back
        finally:
            doomed.stop()
        [(_token, expires_ms)] = db.zrange(keys.tool_slots("single_slot"), 0, -1, withscores=True)
        survivor = start_worker(server.url, [TOOLS], concurrency=2)
        try:
            dispatched_at = time.time()
            following = [
                _dispatch(server.url, db, "single_slot", {"runs_file": str(runs), "n": n, "seconds": 0.2})
                for n in (2, 3)
            ]
            outcomes = [wait_tool_outcome(db, call_id, 40) for call_id in following]
        finally:
            survivor.stop()
            db.close()
    assert [(o.ok, o.result) for o in outcomes] == [(True, 2), (True, 3)], outcomes
    notes = [note for note in read_notes(runs) if note[2] != "1"]
    # They waited for the dead execution's slot to expire (its hard limit, 3 s, and the running guard's
    # margin after it was taken), then took it within a poll's countdown.
    first_start = min(at for event, at, _label in notes if event == "start")
    assert first_start >= expires_ms / 1000 - 0.05
    assert first_start - max(expires_ms / 1000, dispatched_at) < WAIT_COUNTDOWN_MAX_S + 1.0, notes
    assert max_overlap(notes) == {"": 1}
