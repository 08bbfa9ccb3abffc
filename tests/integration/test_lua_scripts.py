"""Every `.lua` file loads and answers with each value of its typed result, on a real redis-server.

The turn scripts run as the stores run them (operations performed by a runner, on a decoding client and on
one that does not); the workers' through `CallStore`. `RUN_BY` says which test runs which file, and a test
checks that it names every script file there is.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from importlib import resources

import pytest
import redis

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import operations
from orchestrator.store import scripts as lua
from orchestrator.store.codec import ClaimedTurn
from orchestrator.store.runner import SyncRunner
from orchestrator.store.task_queue import BrokerCommand, write_tasks
from tests.support.store_db import store_db_url
from workers import keys, packing, scripts
from workers.call_store import CallStore, OutcomeWrite
from workers.connect import connect_redis
from workers.contract import ToolCallRequest, ToolOutcome, dump_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

SCRIPTS_DB = 4


@pytest.fixture(params=[True, False], ids=["decoded", "bytes"])
def runner(redis_url: str, request: pytest.FixtureRequest) -> Iterator[SyncRunner]:
    client = connect_redis(store_db_url(redis_url, SCRIPTS_DB), decode_responses=request.param)
    client.flushdb()
    yield SyncRunner(client)
    client.close()


@pytest.fixture
def call_store(redis_url: str) -> Iterator[CallStore]:
    client = connect_redis(store_db_url(redis_url, SCRIPTS_DB), decode_responses=False)
    client.flushdb()
    yield CallStore(client)
    client.close()


def claim_one(runner: SyncRunner, ttl_ms: int = 10_000) -> str | None:
    claimed = runner.run(operations.claim("orch-a", ttl_ms))
    return claimed.turn_id if isinstance(claimed, ClaimedTurn) else None


def done(turn_id: str) -> TurnOutcome:
    return TurnOutcome(turn_id=turn_id, status="completed", text="ok")


def test_submit_claim_take_over_and_find_orphans(runner: SyncRunner) -> None:
    run = runner.run
    assert (
        run(operations.submit(TurnRequest(prompt="a", conversation_id="c"), "t1", 1.0))
        is lua.SubmitResult.QUEUED
    )
    assert run(operations.submit(TurnRequest(prompt="a"), "t1", 1.0)) is lua.SubmitResult.EXISTS
    assert (
        run(operations.submit(TurnRequest(prompt="b", conversation_id="c"), "t2", 2.0))
        is lua.SubmitResult.WAITING
    )
    claimed = run(operations.claim("orch-a", 100))
    assert isinstance(claimed, ClaimedTurn) and claimed.turn_id == "t1"
    assert claimed.request is not None and not claimed.has_state and claimed.request.prompt == "a"
    assert run(operations.claim("orch-b", 100)) is None  # t2 waits behind t1
    assert run(operations.take_over("orch-b", "t2", 10_000)) is lua.TakeOverResult.REFUSED  # waiting its turn
    runner.client.delete(keys.turn_lease("t1"))
    assert run(operations.find_orphans(10)) == ["t1"]
    assert run(operations.take_over("orch-b", "t1", 10_000)) is lua.TakeOverResult.TAKEN
    assert run(operations.find_orphans(10)) == []
    assert run(operations.renew_leases("orch-b", ["t1", "t2"], 20_000)) == {"t2"}


def test_save_step_save_outcome_release_and_control(runner: SyncRunner) -> None:
    run = runner.run
    run(operations.submit(TurnRequest(prompt="a"), "t1", 1.0))
    assert claim_one(runner) == "t1"
    events = [("round_completed", {"n": 1})]
    step = operations.save_step("t1", "{}", TurnStatus.WAITING, events, orchestrator_id="orch-a", now=2.0)
    assert run(step) is lua.SaveResult.SAVED
    fenced = operations.save_step("t1", "{}", TurnStatus.RUNNING, events, orchestrator_id="orch-b", now=3.0)
    assert run(fenced) is lua.SaveResult.LEASE_LOST
    assert run(operations.control("t1", "cancel", None, None, 4.0)) is lua.ControlResult.RECORDED
    [(_, notified)] = run(operations.read_inbox("orch-a", "0", 10, 10))
    assert notified == {"kind": "control", "turn": "t1", "control": "cancel", "call": "", "approved": ""} | {
        "id": notified["id"]
    }
    assert run(operations.release("orch-b", "t1")) is scripts.ReleaseResult.NOT_HELD
    assert run(operations.release("orch-a", "t1")) is scripts.ReleaseResult.RELEASED
    assert run(operations.save_outcome("t1", done("t1"), None, 5.0)) is lua.FinishResult.FINISHED
    assert run(operations.save_outcome("t1", done("t1"), None, 6.0)) is lua.FinishResult.ALREADY_TERMINAL
    late_step = operations.save_step("t1", "{}", TurnStatus.RUNNING, (), orchestrator_id=None, now=7.0)
    assert run(late_step) is lua.SaveResult.TERMINAL
    assert run(operations.control("t1", "cancel", None, None, 8.0)) is lua.ControlResult.TERMINAL
    assert run(operations.control("t_none", "cancel", None, None, 8.0)) is lua.ControlResult.UNKNOWN
    names = [e.name for e in run(operations.read_events("t1", "0"))]
    assert names == ["turn_queued", "round_completed", "turn_finished"]


def test_save_outcome_releases_the_finishing_owners_lease_and_no_one_elses(runner: SyncRunner) -> None:
    run = runner.run
    for turn_id in ("t2", "t3"):
        run(operations.submit(TurnRequest(prompt="a"), turn_id, 1.0))
        assert claim_one(runner) == turn_id
    # A stale copy finishing t2 leaves the owner's lease alone; the owner finishing t3 releases its own —
    # and so does its retry after a lost reply, which finds the turn terminal already.
    assert run(operations.save_outcome("t2", done("t2"), None, 2.0, orchestrator_id="orch-b")) is (
        lua.FinishResult.FINISHED
    )
    assert runner.client.get(keys.turn_lease("t2")) in ("orch-a", b"orch-a")
    assert run(operations.save_outcome("t3", done("t3"), None, 2.0, orchestrator_id="orch-a")) is (
        lua.FinishResult.FINISHED
    )
    assert runner.client.get(keys.turn_lease("t3")) is None
    run(operations.take_over("orch-a", "t2", 10_000))
    assert run(operations.save_outcome("t2", done("t2"), None, 3.0, orchestrator_id="orch-a")) is (
        lua.FinishResult.ALREADY_TERMINAL
    )
    assert runner.client.get(keys.turn_lease("t2")) is None


def test_write_outcome_notifies_with_the_outcome_up_to_the_inline_limit(runner: SyncRunner) -> None:
    run = runner.run
    run(operations.submit(TurnRequest(prompt="a"), "t1", 1.0))
    assert claim_one(runner) == "t1"
    small = ToolOutcome(call_id="c1", tool="echo", turn_id="t1", ok=True, result="x", content="x")
    # Past the limit even compressed (random hex digits shrink to 58 %), and past it only uncompressed.
    noise = random.Random(0).randbytes(keys.INBOX_OUTCOME_MAX_BYTES).hex()
    big = small.model_copy(update={"call_id": "c2", "content": noise})
    repeated = small.model_copy(update={"call_id": "c3", "content": "y" * keys.INBOX_OUTCOME_MAX_BYTES})
    assert run(operations.write_outcome(small)) == (scripts.WriteResult.WON, None)
    assert run(operations.write_outcome(small)) == (scripts.WriteResult.LOST, None)
    assert run(operations.write_outcome(big)) == (scripts.WriteResult.WON, None)
    assert run(operations.write_outcome(repeated)) == (scripts.WriteResult.WON, None)
    inbox = [fields for _, fields in run(operations.read_inbox("orch-a", "0", 10, 10))]
    assert [(f["call"], packing.unpack(f["outcome"])) for f in inbox] == [
        ("c1", dump_tool_outcome(small)),
        ("c2", ""),
        ("c3", dump_tool_outcome(repeated)),
    ]
    assert runner.client.llen(keys.late_outcomes("c1")) == 1


def test_the_workers_start_idempotency_and_release_scripts(call_store: CallStore) -> None:
    request = ToolCallRequest(call_id="c1", tool="echo", arguments={})
    assert call_store.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    assert call_store.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)  # a lost reply
    attempt, held_ms = call_store.start(request, token="1|w:2:b", running_ttl_s=10, worker="w")
    assert attempt is scripts.StartResult.HELD and 0 < held_ms <= 10_000
    call_store.release("c1", None, "1|w:1:a")
    outcome = ToolOutcome(call_id="c1", tool="echo", ok=True, result="x", content="x")
    assert call_store.finish(OutcomeWrite.of(outcome, None)) is scripts.WriteResult.WON
    assert call_store.start(request, token="1|w:3:c", running_ttl_s=10, worker="w") == (
        scripts.StartResult.FINISHED,
        0,
    )
    key = keys.idempotency("echo", "digest", "default")
    claim = call_store.claim_idempotency
    assert claim(key, holder="1|w:1:a", lock_ttl_s=5) == (scripts.IdempotencyClaim.CLAIMED, None)
    assert claim(key, holder="1|w:1:a", lock_ttl_s=5) == (scripts.IdempotencyClaim.CLAIMED, None)
    # Another execution of the same call waits like an identical call does: the lock is per execution.
    assert claim(key, holder="2|w:2:b", lock_ttl_s=5) == (scripts.IdempotencyClaim.BUSY, None)
    call_store.release_idempotency_lock(key, "1|w:9:", prefix=True)  # another process: not released
    assert claim(key, holder="2|w:2:b", lock_ttl_s=5) == (scripts.IdempotencyClaim.BUSY, None)
    call_store.release_idempotency_lock(key, "1|w:1:", prefix=True)  # the parent, for its dead process
    assert claim(key, holder="2|w:2:b", lock_ttl_s=5) == (scripts.IdempotencyClaim.CLAIMED, None)
    call_store.client.set(key, '{"result": 1}')
    assert claim(key, holder="3|w:3:c", lock_ttl_s=5) == (scripts.IdempotencyClaim.STORED, '{"result": 1}')


def test_a_calls_count_of_executions_is_kept_in_its_fence(call_store: CallStore) -> None:
    db = call_store.client
    request = ToolCallRequest(call_id="c7", tool="echo")
    assert call_store.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    assert db.get(keys.fence("c7")) == b"1|w:1:a#1"
    call_store.release("c7", None, "1|w:1:a")  # its process died: the parent retries the call
    assert call_store.start(request, token="1|w:1:b", running_ttl_s=10, worker="w") == (2, 0)
    assert call_store.start(request, token="1|w:1:b", running_ttl_s=10, worker="w") == (2, 0)  # a lost reply
    assert db.get(keys.fence("c7")) == b"1|w:1:b#2"
    assert call_store.read_attempts("c7", None) == 2
    assert call_store.is_current("c7", None, "1|w:1:b") and not call_store.is_current("c7", None, "1|w:1:a")
    assert db.exists(keys.attempts("c7")) == 0, "no key of its own"
    # A call an older worker started: its fence holds the token alone, its count the attempts key.
    db.set(keys.fence("c8"), "1|v:1:a")
    db.set(keys.attempts("c8"), "3")
    assert call_store.read_attempts("c8", None) == 3
    older = ToolCallRequest(call_id="c8", tool="echo")
    assert call_store.start(older, token="1|w:1:c", running_ttl_s=10, worker="w") == (4, 0)
    assert call_store.read_attempts("c8", None) == 4


def test_the_fence_refuses_a_superseded_execution_and_a_gone_turn(call_store: CallStore) -> None:
    db = call_store.client
    first = ToolCallRequest(call_id="c2", tool="echo", turn_id="t2", attempt=1)
    assert call_store.start(first, token="1|w:1:a", running_ttl_s=10, worker="w") == (
        scripts.StartResult.TURN_GONE,
        0,
    )
    assert db.exists(keys.running("c2"), keys.attempts("c2"), keys.fence("c2")) == 0, "nothing was started"
    db.set(keys.turn_request("t2"), "{}")
    assert call_store.start(first, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    assert call_store.is_current("c2", "t2", "1|w:1:a")
    db.delete(keys.running("c2"))  # the frozen worker's guard expired; the orchestrator dispatched attempt 2
    second = first.model_copy(update={"attempt": 2})
    assert call_store.start(second, token="2|w:2:b", running_ttl_s=10, worker="w") == (2, 0)
    assert not call_store.is_current("c2", "t2", "1|w:1:a") and call_store.is_current("c2", "t2", "2|w:2:b")
    # A delivery of the older dispatch (a redelivery, a retry) is refused before it takes anything.
    db.delete(keys.running("c2"))
    assert call_store.start(first, token="1|w:1:z", running_ttl_s=10, worker="w") == (
        scripts.StartResult.SUPERSEDED,
        2,
    )
    late = ToolOutcome(call_id="c2", tool="echo", turn_id="t2", ok=True, result="late", content="late")
    fenced = OutcomeWrite.of(
        late,
        scripts.Fence(1, "1|w:1:a"),
        holder="1|w:1:a",
        idempotency_key="idem:c2",
        idempotency_record='{"result": "late"}',
    )
    assert call_store.finish(fenced) is scripts.WriteResult.FENCED
    # The superseded execution's success is still stored, so that a waiting execution replays it.
    assert db.get("idem:c2") == b'{"result": "late"}'
    # The parent naming its dead process by prefix, and a revoke of the old dispatch: fenced too.
    for fence in (scripts.Fence(1, "1|w:1:"), scripts.Fence(1, "")):
        assert call_store.finish(OutcomeWrite.of(late, fence)) is scripts.WriteResult.FENCED
    assert db.exists(keys.outcome("c2"), keys.late_outcomes("c2")) == 0, "no write of a superseded attempt"
    current = late.model_copy(update={"result": "current", "content": "current"})
    assert call_store.finish(OutcomeWrite.of(current, scripts.Fence(2, "2|w:2:"))) is scripts.WriteResult.WON
    # No fence at all (the orchestrator's synthetic outcomes): first writer wins as ever.
    assert call_store.finish(OutcomeWrite.of(late, None)) is scripts.WriteResult.LOST


def test_the_outcome_write_drops_its_writers_running_guard_whatever_it_comes_to(
    call_store: CallStore,
) -> None:
    db = call_store.client

    def write(call_id: str, fence: scripts.Fence, holder: str, prefix: bool = False) -> scripts.WriteResult:
        outcome = ToolOutcome(call_id=call_id, tool="echo", ok=True, result=holder, content=holder)
        return call_store.finish(OutcomeWrite.of(outcome, fence, holder=holder, holder_is_prefix=prefix))

    def start(call_id: str, token: str, attempt: int = 1) -> tuple[int, int]:
        request = ToolCallRequest(call_id=call_id, tool="echo", attempt=attempt)
        return call_store.start(request, token=token, running_ttl_s=10, worker="w")

    def guard(call_id: str) -> bytes | None:
        return db.get(keys.running(call_id))  # type: ignore[return-value]  # bytes: not decoded

    # WON: the guard goes with the outcome.
    assert start("r1", "1|w:1:a") == (1, 0)
    assert write("r1", scripts.Fence(1, "1|w:1:a"), "1|w:1:a") is scripts.WriteResult.WON
    assert guard("r1") is None
    # LOST (another writer answered first): the guard goes too.
    assert start("r2", "1|w:1:b") == (1, 0)
    synthetic = ToolOutcome(call_id="r2", tool="echo", ok=False, content="Error: lost")
    assert call_store.finish(OutcomeWrite.of(synthetic, None)) is scripts.WriteResult.WON
    assert guard("r2") == b"1|w:1:b", "a writer naming no holder drops no guard"
    assert write("r2", scripts.Fence(1, "1|w:1:b"), "1|w:1:b") is scripts.WriteResult.LOST
    assert guard("r2") is None
    # FENCED: the superseded writer's guard is gone already, and the current execution's stays.
    assert start("r3", "1|w:1:c") == (1, 0)
    db.delete(keys.running("r3"))
    assert start("r3", "2|w:2:d", attempt=2) == (2, 0)
    assert write("r3", scripts.Fence(1, "1|w:1:c"), "1|w:1:c") is scripts.WriteResult.FENCED
    assert write("r3", scripts.Fence(1, "1|w:1:"), "1|w:1:", prefix=True) is scripts.WriteResult.FENCED
    assert guard("r3") == b"2|w:2:d"
    # The parent, for its dead pool process: by the prefix, and only its own process's.
    assert write("r3", scripts.Fence(2, "2|w:9:"), "2|w:9:", prefix=True) is scripts.WriteResult.FENCED
    assert guard("r3") == b"2|w:2:d"
    assert write("r3", scripts.Fence(2, "2|w:2:"), "2|w:2:", prefix=True) is scripts.WriteResult.WON
    assert guard("r3") is None
    # Redis lost the fence: the guard is read, and dropped only for its holder.
    assert start("r4", "1|w:1:e") == (1, 0)
    db.delete(keys.fence("r4"))
    assert write("r4", scripts.Fence(1, "1|w:1:x"), "1|w:1:x") is scripts.WriteResult.WON
    assert guard("r4") == b"1|w:1:e"
    assert write("r4", scripts.Fence(1, "1|w:1:e"), "1|w:1:e") is scripts.WriteResult.LOST
    assert guard("r4") is None


def test_a_turn_with_a_lease_exists_for_the_start_script(call_store: CallStore) -> None:
    db = call_store.client
    request = ToolCallRequest(call_id="c5", tool="echo", turn_id="t5")
    db.set(keys.turn_lease("t5"), "orch-a")  # leased: its request is not looked for
    assert call_store.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    assert db.xlen(keys.inbox("orch-a")) == 1, "the owner was told"
    assert call_store.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)  # a lost reply
    assert db.xlen(keys.inbox("orch-a")) == 1, "a repeat tells no one again"
    db.delete(keys.turn_lease("t5"))
    other = ToolCallRequest(call_id="c6", tool="echo", turn_id="t5")
    assert call_store.start(other, token="1|w:1:b", running_ttl_s=10, worker="w") == (
        scripts.StartResult.TURN_GONE,
        0,
    )


def test_write_tasks_runs_kombus_commands_in_order(runner: SyncRunner) -> None:
    client = runner.client
    assert isinstance(client, redis.Redis)
    pubsub = client.pubsub()
    pubsub.subscribe("/4.celeryev/task.sent")
    assert pubsub.get_message(timeout=5) is not None  # the subscription's confirmation
    commands = [
        BrokerCommand("lpush", ("q1", "m1")),
        BrokerCommand("publish", ("/4.celeryev/task.sent", "e1")),
        BrokerCommand("lpush", ("q1", "m2")),
        BrokerCommand("pexpire", ("q1", "60000")),
        BrokerCommand("lpush", ("q2", "m3")),
    ]
    assert runner.run(write_tasks(commands)) == 5
    assert client.lrange("q1", 0, -1) in ([b"m2", b"m1"], ["m2", "m1"])
    assert client.lrange("q2", 0, -1) in ([b"m3"], ["m3"])
    assert 0 < client.pttl("q1") <= 60000 and client.pttl("q2") == -1
    message = pubsub.get_message(timeout=5)
    assert message is not None and message["data"] in (b"e1", "e1")
    pubsub.close()
    # An opcode the script does not know ends it with an error, never a guess (the builder makes none).
    with pytest.raises(redis.ResponseError, match="unknown opcode"):
        client.evalsha(client.script_load(lua.WRITE_TASKS.source), 0, "X", "q3")
    assert client.exists("q3") == 0


def test_park_wake_and_an_answer_that_wakes_a_parked_turn(runner: SyncRunner) -> None:
    run, client = runner.run, runner.client
    for turn_id in ("p1", "p2"):
        run(operations.submit(TurnRequest(prompt="a"), turn_id, 1.0))
        assert claim_one(runner, ttl_ms=100_000) == turn_id
        client.set(keys.turn_status(turn_id), TurnStatus.WAITING.value)
    assert run(operations.park("orch-b", "p1", 50.0, "0")) is lua.ParkResult.LEASE_LOST
    # A request its owner has not read keeps the turn with it; once read past, the turn parks.
    assert run(operations.control("p1", "cancel", None, None, 2.0)) is lua.ControlResult.RECORDED
    assert run(operations.park("orch-a", "p1", 50.0, "0")) is lua.ParkResult.UNREAD
    (request,) = run(operations.read_control("p1", "0"))
    assert run(operations.park("orch-a", "p1", 50.0, request.id)) is lua.ParkResult.PARKED
    assert run(operations.park("orch-a", "p2", 90.0, "0")) is lua.ParkResult.PARKED
    assert not client.exists(keys.turn_lease("p1"), keys.turn_lease("p2"))
    assert run(operations.list_parked()) == [("p1", 50.0), ("p2", 90.0)]
    # Parked turns hold no lease, and no orphan scan takes them over.
    assert run(operations.find_orphans(10)) == []
    client.delete(keys.TURN_QUEUE, keys.TURNS_READY)
    # An answer queues a parked turn at once (at the front) with a ready token for a blocked claimer; the
    # next answer finds it queued, not parked.
    run(operations.control("p2", "approval", "c1", True, 3.0, decided_by="ana"))
    assert run(operations.control("p2", "approval", "c2", True, 3.0)) is lua.ControlResult.RECORDED
    assert [codec_text(t) for t in client.lrange(keys.TURN_QUEUE, 0, -1)] == ["p2"]
    assert client.llen(keys.TURNS_READY) == 1
    requests = run(operations.read_control("p2", "0"))
    assert [(r.call_id, r.decided_by) for r in requests] == [("c1", "ana"), ("c2", None)]
    # A wait that ends unanswered: woken by whoever scans first, once.
    assert run(operations.wake_parked(49.0, 10)) == []
    assert run(operations.wake_parked(51.0, 10)) == ["p1"]
    assert run(operations.wake_parked(99.0, 10)) == []
    assert [codec_text(t) for t in client.lrange(keys.TURN_QUEUE, 0, -1)] == ["p1", "p2"]
    assert client.llen(keys.TURNS_READY) == 2
    assert run(operations.list_parked()) == []


def codec_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Which test above runs each script file (with each value of its result).
RUN_BY: dict[str, object] = {
    "submit": test_submit_claim_take_over_and_find_orphans,
    # Lanes, tenants in turn, caps, parked and ended turns, the previous releases' queue.
    "claim": "tests/integration/test_claim_order.py",
    "take_over": test_submit_claim_take_over_and_find_orphans,
    "find_orphans": test_submit_claim_take_over_and_find_orphans,
    "renew": test_submit_claim_take_over_and_find_orphans,
    "save_step": test_save_step_save_outcome_release_and_control,
    "save_outcome": test_save_step_save_outcome_release_and_control,
    "control": test_save_step_save_outcome_release_and_control,
    "park": test_park_wake_and_an_answer_that_wakes_a_parked_turn,
    "wake": test_park_wake_and_an_answer_that_wakes_a_parked_turn,
    "release": test_save_step_save_outcome_release_and_control,
    "write_outcome": test_write_outcome_notifies_with_the_outcome_up_to_the_inline_limit,
    "start": test_the_fence_refuses_a_superseded_execution_and_a_gone_turn,
    "claim_idempotency": test_the_workers_start_idempotency_and_release_scripts,
    # Run against a whole lost turn (its request, state and calls) where the watcher that uses it is tested.
    "record_lost": "tests/integration/test_durability_watch.py",
    # Run against histories appended by steps, outcomes, views and conversation heads.
    "read_history": "tests/integration/test_history_store.py",
    # Run against live, finished and gone turns, from a real worker's tool.
    "progress": "tests/integration/test_tool_progress.py",
    # Run with a batch that holds `turn_finished` and a redacted value, read back in order.
    "append_events": "tests/integration/test_store.py",
    "write_tasks": test_write_tasks_runs_kombus_commands_in_order,
    # Acquired, refused, expired and released by token and by prefix; the waiting event told once.
    "slots": "tests/unit/test_tool_slots.py",
    "slot_waiting": "tests/unit/test_tool_slots.py",
    # Run by a live orchestrator's registration and renewals, and against a dead one's inbox left to expire.
    "keep_inbox": "tests/integration/test_process_keys.py",
    # Reserve, settle, refund, the waiting line and a pause, on a real Redis.
    "rate_limit": "tests/integration/test_rate_limit_script.py",
    # Read by the API's backlog gauges against queued, running and finished turns of real processes.
    "read_statuses": "tests/integration/test_backlog_metrics.py",
    # A Redis Cluster's halves of submit, claim and a turn's end, run by real processes on a real cluster:
    # bursts, a killed orchestrator's turns taken over, masters failed over; parked turns woken.
    "enqueue": "tests/e2e/test_redis_cluster.py",
    "pick": "tests/e2e/test_redis_cluster.py",
    "lease": "tests/e2e/test_redis_cluster.py",
    "unpick": "tests/e2e/test_redis_cluster.py",
    "leave": "tests/e2e/test_redis_cluster.py",
    "unpark": "tests/e2e/test_redis_cluster.py",
    "read_queue": "tests/e2e/test_redis_cluster.py",
}


def test_every_script_file_is_run_here() -> None:
    files = {
        entry.name.removesuffix(".lua")
        for package in ("orchestrator.store", "workers")
        for entry in resources.files(package).joinpath("lua").iterdir()
        if entry.name.endswith(".lua")
    }
    assert files == set(RUN_BY)


def test_a_script_redis_forgot_is_loaded_again(runner: SyncRunner) -> None:
    assert runner.run(operations.control("t_none", "cancel", None, None, 1.0)) is lua.ControlResult.UNKNOWN
    client = runner.client
    assert isinstance(client, redis.Redis)
    client.script_flush()
    assert runner.run(operations.control("t_none", "cancel", None, None, 1.0)) is lua.ControlResult.UNKNOWN


def test_a_worker_finishing_after_redis_forgot_its_scripts_writes_once(call_store: CallStore) -> None:
    # The outcome's pipeline sends EVALSHA straight (no SCRIPT EXISTS round trip): a NOSCRIPT reply loads the
    # scripts, and the write is tried again only if it did not land — one outcome, and the guard released.
    request = ToolCallRequest(call_id="c9", tool="echo", arguments={})
    token = "1|w:1:a"
    assert call_store.start(request, token=token, running_ttl_s=10, worker="w") == (1, 0)
    call_store.client.script_flush()
    outcome = ToolOutcome(call_id="c9", tool="echo", ok=True, result="x", content="x")
    write = OutcomeWrite.of(outcome, scripts.Fence(1, token), holder=token)
    assert call_store.finish(write) is scripts.WriteResult.WON
    assert call_store.read_outcome("c9", None) == outcome
    assert call_store.client.exists(keys.running("c9"), keys.late_outcomes("c9")) == 0
