"""The turn store on a real redis-server: submit, claim, leases, orphans, outcomes, inbox, control.

A test that needs a reader blocked before it writes waits until Redis lists that reader as blocked in its
command (CLIENT LIST); none measures how long a read took.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import redis.asyncio as aioredis

from orchestrator.errors import UnknownTurnError
from orchestrator.machine.state import dump_entries
from orchestrator.model import AssistantMessage, TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store.history import Appended
from orchestrator.store.turns import TurnStore
from tests.support.approvals import ahold_for_approval
from tests.support.store_db import store_db_url, wait_blocked
from tests.support.waiting import DEFAULT_TIMEOUT_S, async_wait_until
from workers import keys
from workers.contract import FailureKind, ToolOutcome, build_failure, dump_tool_outcome, parse_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def finished(turn_id: str, text: str = "done") -> TurnOutcome:
    return TurnOutcome(
        turn_id=turn_id,
        status="completed",
        text=text,
        messages=[UserMessage(content="hi"), AssistantMessage(content=text)],
    )


async def lease_owner(store: TurnStore, turn_id: str) -> str | None:
    owner = await store.redis.get(keys.turn_lease(turn_id))
    assert not isinstance(owner, bytes)  # the store's client decodes
    return owner


def ok_outcome(call_id: str, turn_id: str | None, result: str) -> ToolOutcome:
    return ToolOutcome(call_id=call_id, tool="add", turn_id=turn_id, ok=True, result=result, content=result)


async def test_submit_is_durable_before_it_returns(store: TurnStore, redis_url: str) -> None:
    turn_id = await store.submit(TurnRequest(prompt="hello"))
    assert turn_id.startswith("turn_") and len(turn_id) == len("turn_") + 32
    # A separate connection (another process, in effect) sees everything at once.
    other = redis.Redis.from_url(store_db_url(redis_url), decode_responses=True)
    try:
        assert other.get(keys.turn_status(turn_id)) == "queued"
        assert TurnRequest.model_validate_json(other.get(keys.turn_request(turn_id)) or "").prompt == "hello"
        assert other.lrange(keys.TURN_QUEUE, 0, -1) == [turn_id]
        assert other.zscore(keys.TURNS_ACTIVE, turn_id) is not None
    finally:
        other.close()
    events = await store.read_events(turn_id)
    assert [e.name for e in events] == ["turn_queued"]


async def test_submit_with_the_same_id_twice_stores_one_turn(store: TurnStore) -> None:
    first = await store.submit(TurnRequest(prompt="a"), turn_id="turn_fixed")
    second = await store.submit(TurnRequest(prompt="b"), turn_id="turn_fixed")
    assert first == second == "turn_fixed"
    assert await store.redis.llen(keys.TURN_QUEUE) == 1
    request = await store.load_request("turn_fixed")
    assert request is not None and request.prompt == "a"


async def test_submit_refuses_a_turn_with_nothing_to_answer(store: TurnStore) -> None:
    with pytest.raises(ValueError, match="prompt"):
        await store.submit(TurnRequest(prompt="  "))
    with pytest.raises(ValueError, match="invalid turn id"):
        await store.submit(TurnRequest(prompt="x"), turn_id="has space")
    assert await store.redis.llen(keys.TURN_QUEUE) == 0


async def test_claim_leases_the_turn_and_times_out_when_empty(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="hello"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    assert await lease_owner(store, turn_id) == "orch-a"
    assert await store.get_status(turn_id) == TurnStatus.RUNNING
    assert await store.redis.llen(keys.TURNS_CLAIMING) == 0
    assert await store.claim("orch-a", timeout_s=0.3) is None


async def test_a_claim_reads_the_request_with_the_lease(store: TurnStore) -> None:
    # The request adopting a new turn starts from comes with its lease: no round trip of its own.
    turn_id = await store.submit(TurnRequest(prompt="hello"))
    claimed = await store.claim_turn("orch-a", timeout_s=1.0)
    assert claimed is not None and claimed.turn_id == turn_id
    assert claimed.request is not None and claimed.request.prompt == "hello"
    assert not claimed.has_state


async def test_a_blocked_claimer_wakes_up_on_submit(store: TurnStore, redis_url: str) -> None:
    submitter = TurnStore.from_url(store_db_url(redis_url))
    try:
        # A claim that would block for far longer than the test: it returns the turn only if it woke on it.
        claiming = asyncio.create_task(store.claim("orch-a", timeout_s=DEFAULT_TIMEOUT_S))
        await wait_blocked(store.redis, "blpop", claiming)
        turn_id = await submitter.submit(TurnRequest(prompt="wake"))
        assert await claiming == turn_id
    finally:
        await submitter.aclose()


async def test_renew_reports_lost_leases_and_release_is_owner_only(store: TurnStore) -> None:
    mine = await store.submit(TurnRequest(prompt="1"))
    theirs = await store.submit(TurnRequest(prompt="2"))
    assert await store.claim("orch-a", timeout_s=1.0) == mine
    assert await store.claim("orch-b", timeout_s=1.0) == theirs
    assert await store.renew_leases("orch-a", [mine, theirs], ttl_s=30) == {theirs}
    assert 25_000 < await store.redis.pttl(keys.turn_lease(mine)) <= 30_000
    await store.release("orch-a", theirs)  # not the owner: nothing happens
    assert await lease_owner(store, theirs) == "orch-b"
    await store.release("orch-a", mine)
    assert await lease_owner(store, mine) is None
    assert await store.renew_leases("orch-a", [mine], ttl_s=30) == {mine}


async def test_expired_lease_makes_an_orphan_that_one_orchestrator_takes_over(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    queued = await store.submit(TurnRequest(prompt="still queued"))
    assert await store.claim("orch-dead", timeout_s=1.0, lease_ttl_s=30) == turn_id
    assert await store.find_orphans() == []
    # The dead owner renews nothing: its lease runs out (now, rather than in 30 s).
    await store.redis.pexpire(keys.turn_lease(turn_id), 1)

    async def lease_expired() -> bool:
        return await lease_owner(store, turn_id) is None

    await async_wait_until(lease_expired, "the lease to expire")
    assert await store.find_orphans() == [turn_id]  # the queued one is not an orphan
    results = await asyncio.gather(
        store.take_over("orch-b", turn_id, 10), store.take_over("orch-c", turn_id, 10)
    )
    assert sorted(results) == [False, True]
    assert await lease_owner(store, turn_id) in {"orch-b", "orch-c"}
    assert await store.find_orphans() == []
    assert not await store.take_over("orch-b", queued, 10)  # belongs to whoever pops it from the queue


async def test_a_claimer_dying_between_pop_and_lease_leaves_an_orphan(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    # What claim does first, without its second step: the process died in between.
    await store.redis.lmove(keys.TURN_QUEUE, keys.TURNS_CLAIMING, "LEFT", "RIGHT")
    assert await store.find_orphans() == [turn_id]
    assert await store.take_over("orch-b", turn_id, 10)
    assert await store.get_status(turn_id) == TurnStatus.RUNNING
    assert await store.redis.llen(keys.TURNS_CLAIMING) == 0


async def test_terminal_turns_are_neither_claimed_nor_orphans(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.save_outcome(turn_id, finished(turn_id))
    assert await store.claim("orch-a", timeout_s=0.2) is None
    assert await store.find_orphans() == []
    assert not await store.take_over("orch-a", turn_id, 10)
    assert await store.redis.zscore(keys.TURNS_ACTIVE, turn_id) is None
    assert 0 < await store.redis.ttl(keys.turn_request(turn_id)) <= keys.TURN_TTL_S
    # The first terminal write wins; a second is refused.
    assert not await store.save_outcome(turn_id, finished(turn_id, "other"))
    outcome = await store.get_outcome(turn_id)
    assert outcome is not None and outcome.text == "done"


async def test_save_step_is_fenced_by_the_lease_and_by_the_end(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    step = [("round_completed", {"round": 1})]
    assert await store.save_step(turn_id, '{"v": 1}', TurnStatus.WAITING, step, orchestrator_id="orch-a")
    assert await store.load_state(turn_id) == '{"v": 1}'
    assert await store.get_status(turn_id) == TurnStatus.WAITING
    assert not await store.save_step(turn_id, '{"v": 2}', TurnStatus.RUNNING, step, orchestrator_id="orch-b")
    await store.save_outcome(turn_id, finished(turn_id))
    assert not await store.save_step(turn_id, '{"v": 3}', TurnStatus.RUNNING, step, orchestrator_id="orch-a")
    assert await store.load_state(turn_id) == '{"v": 1}'
    assert await store.get_status(turn_id) == TurnStatus.COMPLETED
    # Only the kept step told of itself; the refused ones wrote no event.
    names = [e.name for e in await store.read_events(turn_id)]
    assert names == ["turn_queued", "round_completed", "turn_finished"]


async def test_first_writer_wins_and_notifies_the_owner_once(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    real = ok_outcome("call-1", turn_id, "3")
    synthetic = build_failure(("call-1", "add", turn_id), FailureKind.TIMEOUT, "timed out", synthetic=True)
    assert await store.write_outcome(real) == real
    winner = await store.write_outcome(synthetic)
    assert winner.ok and winner.result == "3"
    assert await store.read_outcomes(dict.fromkeys(["call-1", "call-missing"])) == {"call-1": real}
    late = await store.redis.lrange(keys.late_outcomes("call-1"), 0, -1)
    assert [parse_tool_outcome(x).failure_kind for x in late] == [FailureKind.TIMEOUT]
    inbox = await store.read_inbox("orch-a", "0", block_ms=100)
    # The notification carries the (small) winning outcome, so the owner need not read it back.
    assert [fields for _, fields in inbox] == [
        {"kind": "outcome", "turn": turn_id, "call": "call-1", "outcome": dump_tool_outcome(real)}
    ]
    await store.ack_inbox("orch-a", inbox[-1][0])
    assert await store.read_inbox("orch-a", "0", block_ms=50) == []


async def test_read_inbox_blocks_until_a_notification_arrives(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id

    async def read_until_some() -> list[tuple[str, dict[str, str]]]:
        # One read blocks at most `block_cap_ms`; the runtime reads again after an empty one, as here.
        while not (entries := await store.read_inbox("orch-a", "0", block_ms=5000)):
            pass
        return entries

    reading = asyncio.create_task(read_until_some())
    await wait_blocked(store.redis, "xread", reading)
    assert not reading.done()  # nothing came yet: the inbox was empty
    await store.write_outcome(ok_outcome("call-2", turn_id, "ok"))
    entries = await asyncio.wait_for(reading, DEFAULT_TIMEOUT_S)
    assert entries[0][1]["call"] == "call-2"


async def test_cancel_and_approval_reach_the_control_stream_and_the_owner(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.request_cancel(turn_id)  # queued, no owner yet: kept for whoever claims it
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    (waiting,) = await ahold_for_approval(store, turn_id, 1)
    assert await store.request_approval(turn_id, waiting, approved=False)
    control = await store.read_control(turn_id)
    assert [(c.kind, c.call_id, c.approved) for c in control] == [
        ("cancel", None, None),
        ("approval", waiting, False),
    ]
    inbox = await store.read_inbox("orch-a", "0", block_ms=100)
    assert [f["kind"] for _, f in inbox] == ["control"]
    assert inbox[0][1]["control"] == "approval" and inbox[0][1]["id"] == control[1].id
    assert await store.read_control(turn_id, after=control[0].id) == [control[1]]
    with pytest.raises(UnknownTurnError):
        await store.request_cancel("turn_unknown")
    await store.save_outcome(turn_id, finished(turn_id))
    assert not await store.request_cancel(turn_id)


async def test_turns_of_one_conversation_wait_their_turn(store: TurnStore) -> None:
    first = await store.submit(TurnRequest(prompt="one", conversation_id="conv-1"))
    second = await store.submit(TurnRequest(prompt="two", conversation_id="conv-1"))
    other = await store.submit(TurnRequest(prompt="elsewhere", conversation_id="conv-2"))
    assert await store.claim("orch-a", timeout_s=1.0) == first
    assert await store.claim("orch-a", timeout_s=1.0) == other
    assert await store.claim("orch-a", timeout_s=0.2) is None  # the second waits for the first
    assert await store.get_status(second) == TurnStatus.QUEUED
    waiting = asyncio.create_task(store.claim("orch-b", timeout_s=DEFAULT_TIMEOUT_S))
    await wait_blocked(store.redis, "blpop", waiting)
    # The outcome references the messages its steps appended to the conversation's list.
    done = finished(first, "answer one")
    append = Appended(keys.conversation_history("conv-1"), 0, tuple(dump_entries(done.messages)))
    assert await store.save_step(first, "{}", TurnStatus.RUNNING, append=append)
    await store.save_outcome(first, done)
    assert await asyncio.wait_for(waiting, DEFAULT_TIMEOUT_S) == second
    request = await store.load_request(second)
    assert request is not None and request.prompt == "two"
    history = (await store.conversation_history("conv-1")).messages
    assert [m.role for m in history] == ["user", "assistant"]
    assert [m.content for m in history] == ["hi", "answer one"]
    await store.save_outcome(second, finished(second))
    assert await store.redis.get(keys.conversation_lock("conv-1")) is None
    raw_head = await store.redis.get(keys.conversation_head("conv-1"))
    assert raw_head is not None
    head = json.loads(raw_head)
    assert head == {"history_key": keys.conversation_history("conv-1"), "history_len": 2, "turn_id": second}


async def test_a_batch_of_events_is_appended_in_order_and_redacted(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    batch = [
        ("tool_call_started", {"llm_call": 0, "call_id": "c1", "tool": "login"}),
        ("turn_finished", {"ignored": True}),
        ("text_delta", {"llm_call": 0, "text": "token=", "password": "s3cret"}),
    ]
    last = await store.append_events(turn_id, batch)
    assert await store.append_events(turn_id, [("turn_finished", {})]) is None
    events = await store.read_events(turn_id)
    assert [e.name for e in events] == ["turn_queued", "tool_call_started", "text_delta"]
    assert events[-1].id == last
    assert events[-1].data == {"llm_call": 0, "text": "token=", "password": "***"}


async def test_events_are_redacted_streamed_and_end_with_turn_finished(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    await store.append_event(
        turn_id, "tool_dispatched", {"call_id": "c1", "arguments": {"api_key": "s3cret"}}
    )
    assert await store.append_event(turn_id, "turn_finished", {"ignored": True}) is None
    seen: list[str] = []

    async def collect() -> None:
        async for event in store.iter_events(turn_id, block_ms=200):
            seen.append(event.name)

    collecting = asyncio.create_task(collect())
    # Streamed as they come: the reader has what is there and waits for more before the turn ends.
    await async_wait_until(lambda: len(seen) == 2, "the events so far")
    await wait_blocked(store.redis, "xread", collecting)
    await store.save_outcome(turn_id, finished(turn_id))
    await asyncio.wait_for(collecting, DEFAULT_TIMEOUT_S)
    assert seen == ["turn_queued", "tool_dispatched", "turn_finished"]
    events = await store.read_events(turn_id)
    assert events[1].data == {"call_id": "c1", "arguments": {"api_key": "***"}}
    assert events[2].data["status"] == "completed"


async def test_wait_outcome_wakes_on_the_outcome_and_times_out(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    with pytest.raises(TimeoutError):
        await store.wait_outcome(turn_id, 0.3)
    # A wait far longer than the test: it returns the outcome only if it woke on it.
    waiting = asyncio.create_task(store.wait_outcome(turn_id, DEFAULT_TIMEOUT_S))
    await wait_blocked(store.redis, "xread", waiting)
    assert not waiting.done()
    await store.save_outcome(turn_id, finished(turn_id))
    outcome = await waiting
    assert outcome.status == "completed"
    with pytest.raises(UnknownTurnError):
        await store.wait_outcome("turn_nope", 0.1)


async def test_view_shows_the_transcript_so_far(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(messages=[UserMessage(content="from messages")], prompt="p"))
    view = await store.get_view(turn_id)
    assert view is not None and view.status == TurnStatus.QUEUED
    assert [m.content for m in view.messages] == ["from messages", "p"]
    state = (
        '{"version": 1, "history": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "…"}]}'
    )
    assert await store.save_step(turn_id, state, TurnStatus.RUNNING)
    view = await store.get_view(turn_id)
    assert view is not None and [m.role for m in view.messages] == ["user", "assistant"]
    await store.save_outcome(turn_id, finished(turn_id))
    view = await store.get_view(turn_id)
    assert view is not None and view.outcome is not None and view.status == TurnStatus.COMPLETED
    assert await store.get_view("turn_unknown") is None


async def test_orchestrator_registry(store: TurnStore) -> None:
    await store.register_orchestrator("orch-a")
    await store.register_orchestrator("orch-b")
    await store.redis.xadd(keys.inbox("orch-a"), {"kind": "started"})
    before = time.time()
    await store.heartbeat("orch-b")
    seen_at = await store.redis.zscore(keys.ORCHESTRATORS, "orch-b")
    assert seen_at is not None and before <= seen_at <= time.time()
    await store.unregister("orch-a")
    assert await store.redis.zrange(keys.ORCHESTRATORS, 0, -1) == ["orch-b"]
    assert not await store.redis.exists(keys.inbox("orch-a"))
    assert await store.ping()


async def test_store_works_on_a_client_that_does_not_decode(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(store_db_url(redis_url))
    turn_store = TurnStore(raw)
    try:
        await raw.flushdb()
        turn_id = await turn_store.submit(TurnRequest(prompt="bytes"))
        assert await turn_store.claim("orch-a", timeout_s=1.0) == turn_id
        assert await turn_store.get_status(turn_id) == TurnStatus.RUNNING
        assert [e.name for e in await turn_store.read_events(turn_id)] == ["turn_queued"]
        await turn_store.write_outcome(ok_outcome("c", turn_id, "1"))
        assert (await turn_store.read_inbox("orch-a", "0", 100))[0][1]["kind"] == "outcome"
    finally:
        await raw.aclose()
