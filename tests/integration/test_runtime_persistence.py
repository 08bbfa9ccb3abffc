"""The orchestrator's hot path on a real redis-server: one round trip per step, outcomes in notifications."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.runtime.inbox import parse_inbox, parse_payloads
from orchestrator.store.codec import parse_stream_id
from orchestrator.store.history import Prior, StoredState
from orchestrator.store.scripts import SaveResult
from orchestrator.store.turns import TurnStore
from workers import keys
from workers.contract import ToolOutcome, dump_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_a_step_saves_its_state_and_events_together(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    events = [
        ("tool_dispatched", {"call_id": "c1", "api_key": "s3cret"}),
        ("tool_started", {"call_id": "c1"}),
    ]
    assert await store.save_step(turn_id, '{"v": 1}', TurnStatus.WAITING, events, orchestrator_id="orch-a")
    assert await store.load_state(turn_id) == '{"v": 1}'
    assert await store.get_status(turn_id) == TurnStatus.WAITING
    stored = await store.read_events(turn_id)
    assert [e.name for e in stored] == ["turn_queued", "tool_dispatched", "tool_started"]
    assert stored[1].data == {"call_id": "c1", "api_key": "***"}
    # One timestamp per step: its events were written together.
    assert stored[1].at == stored[2].at


async def test_a_steps_events_are_one_entry_each_with_an_id_to_resume_after(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    stream = keys.turn_events(turn_id)
    first = [("tool_dispatched", {"call_id": f"c{n}"}) for n in range(4)]
    assert await store.save_step(turn_id, '{"v": 1}', TurnStatus.RUNNING, first)
    assert await store.save_step(
        turn_id, '{"v": 2}', TurnStatus.RUNNING, [("tool_started", {"call_id": "c0"})]
    )
    assert await store.save_step(turn_id, '{"v": 3}', TurnStatus.RUNNING, [("a", {}), ("b", {"n": 1})])
    # One XADD a step: turn_queued, the four dispatches, the start, the pair.
    assert await store.redis.xlen(stream) == 4
    events = await store.read_events(turn_id)
    assert [e.name for e in events] == ["turn_queued", *(["tool_dispatched"] * 4), "tool_started", "a", "b"]
    assert [e.data.get("call_id") for e in events[1:5]] == ["c0", "c1", "c2", "c3"]
    ids = [parse_stream_id(e.id) for e in events]
    assert ids == sorted(set(ids)), "each event has an id of its own, in the stream's order"
    # Resuming after any of them, in the middle of an entry too, gives exactly the events after it.
    for n, event in enumerate(events):
        assert await store.read_events(turn_id, after=event.id) == events[n + 1 :]
    # A lone event is stored as it always was: name, at, data.
    [(_, lone)] = await store.redis.xrange(stream, min=events[5].id, max=events[5].id)
    assert set(lone) == {"name", "at", "data"}


async def test_a_refused_step_writes_neither_state_nor_events(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    assert await store.save_step(turn_id, '{"v": 1}', TurnStatus.RUNNING, orchestrator_id="orch-a")
    # Another orchestrator (the lease is not its own) is refused, and leaves no trace.
    refused = await store.save_step(
        turn_id, '{"v": 2}', TurnStatus.RUNNING, [("tool_started", {})], orchestrator_id="orch-b"
    )
    assert not refused
    assert await store.load_state(turn_id) == '{"v": 1}'
    assert [e.name for e in await store.read_events(turn_id)] == ["turn_queued"]


async def test_turn_finished_is_left_to_the_outcome_write(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    events = [("round_completed", {}), ("turn_finished", {"status": "completed"})]
    assert await store.save_step(turn_id, "{}", TurnStatus.RUNNING, events)
    assert [e.name for e in await store.read_events(turn_id)] == ["turn_queued", "round_completed"]


async def script_calls(store: TurnStore) -> int:
    """Script calls Redis ran (an EVALSHA refused for a script it had not loaded yet is not one)."""
    stats = await store.redis.info("commandstats")
    ran = 0
    for name in ("evalsha", "eval"):
        stat = stats.get(f"cmdstat_{name}", {})
        refused = int(stat.get("failed_calls", 0)) + int(stat.get("rejected_calls", 0))
        ran += int(stat.get("calls", 0)) - refused
    return ran


async def test_a_turns_last_step_and_its_outcome_are_one_round_trip(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    done = TurnOutcome(turn_id=turn_id, status="completed", text="ok")
    calls = await script_calls(store)
    saved = await store.finish_step(
        turn_id,
        '{"v": 9}',
        TurnStatus.RUNNING,
        [("model_responded", {})],
        outcome=done,
        conversation_id=None,
        orchestrator_id="orch-a",
    )
    assert saved is SaveResult.SAVED and await script_calls(store) - calls == 1
    assert await store.load_state(turn_id) == '{"v": 9}'
    assert await store.get_status(turn_id) == TurnStatus.COMPLETED
    assert (await store.get_outcome(turn_id)) == done
    names = [e.name for e in await store.read_events(turn_id)]
    assert names == ["turn_queued", "model_responded", "turn_finished"]
    # The lease went with it; the turn left the active index.
    assert await store.redis.get(keys.turn_lease(turn_id)) is None
    assert await store.redis.zscore(keys.TURNS_ACTIVE, turn_id) is None


async def gets(store: TurnStore) -> int:
    stats = await store.redis.info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def test_an_owner_that_knows_the_tenant_ends_the_turn_without_reading_its_request(
    store: TurnStore,
) -> None:
    ends = []
    for tenant in ("acme", None):
        turn_id = await store.submit(TurnRequest(prompt="x", tenant="acme"))
        assert await store.claim("orch-a", timeout_s=1.0) == turn_id
        assert await store.redis.sismember(keys.tenant_running("acme"), turn_id)
        before = await gets(store)
        done = TurnOutcome(turn_id=turn_id, status="completed", text="ok")
        saved = await store.finish_step(
            turn_id,
            "{}",
            TurnStatus.RUNNING,
            (),
            outcome=done,
            conversation_id=None,
            orchestrator_id="orch-a",
            tenant=tenant,
        )
        assert saved is SaveResult.SAVED
        ends.append(await gets(store) - before)
        # Out of its tenant's running set either way: the place it held is free.
        assert not await store.redis.sismember(keys.tenant_running("acme"), turn_id)
    # The request (the whole of it, decoded by the script) is read only by an end that does not know.
    assert ends[1] - ends[0] == 1


async def test_a_refused_last_step_stores_no_outcome_either(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    done = TurnOutcome(turn_id=turn_id, status="completed", text="ok")
    refused = await store.finish_step(
        turn_id,
        '{"v": 9}',
        TurnStatus.RUNNING,
        [("model_responded", {})],
        outcome=done,
        conversation_id=None,
        orchestrator_id="orch-b",
    )
    assert refused is SaveResult.LEASE_LOST
    assert await store.get_outcome(turn_id) is None
    assert await store.get_status(turn_id) == TurnStatus.RUNNING
    assert [e.name for e in await store.read_events(turn_id)] == ["turn_queued"]
    # Ended already: the step is refused, and the first terminal write stands.
    assert await store.save_outcome(turn_id, done.model_copy(update={"text": "first"}))
    again = await store.finish_step(
        turn_id, "{}", TurnStatus.RUNNING, (), outcome=done, conversation_id=None, orchestrator_id="orch-a"
    )
    assert again is SaveResult.TERMINAL
    stored = await store.get_outcome(turn_id)
    assert stored is not None and stored.text == "first"


def outcome(call_id: str, turn_id: str, result: str) -> ToolOutcome:
    return ToolOutcome(call_id=call_id, tool="echo", turn_id=turn_id, ok=True, result=result, content=result)


async def test_notifications_carry_small_outcomes_and_name_large_ones(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="x"))
    assert await store.claim("orch-a", timeout_s=1.0) == turn_id
    small = outcome(f"{turn_id}/c1", turn_id, "ok")
    # Past the inline limit even compressed (random hex digits shrink to 58 %).
    large = outcome(f"{turn_id}/c2", turn_id, random.Random(0).randbytes(10_000).hex())
    await store.write_outcome(small)
    await store.write_outcome(large)
    batch = parse_inbox(await store.read_inbox("orch-a", "0", block_ms=100))
    assert batch.outcomes == {turn_id: [small.call_id, large.call_id]}
    assert parse_payloads(batch.payloads) == {small.call_id: small}
    # The large one is read from its key, which is the record either way.
    assert await store.read_outcomes({large.call_id: large.turn_id}) == {large.call_id: large}
    # Stored with its result once: `content` is what the result gives, and is derived again on read.
    assert await store.redis.get(keys.outcome(small.call_id)) == dump_tool_outcome(small)
    assert "content" not in json.loads(dump_tool_outcome(small))


async def test_adopting_reads_state_and_request_in_one_go(store: TurnStore) -> None:
    assert await store.load_state_and_request("turn_unknown") == (None, None)
    turn_id = await store.submit(TurnRequest(prompt="x", conversation_id="conv-1"))
    state, request = await store.load_state_and_request(turn_id)
    assert state is None and request is not None and request.conversation_id == "conv-1"
    await store.save_step(turn_id, '{"v": 1}', TurnStatus.RUNNING)
    state, request = await store.load_state_and_request(turn_id)
    assert state == StoredState('{"v": 1}', [], []) and request is not None and request.prompt == "x"


async def test_finishing_with_a_known_conversation_queues_its_next_turn(store: TurnStore) -> None:
    first = await store.submit(TurnRequest(prompt="one", conversation_id="conv-2"))
    second = await store.submit(TurnRequest(prompt="two", conversation_id="conv-2"))
    assert await store.claim("orch-a", timeout_s=1.0) == first
    assert await store.claim("orch-a", timeout_s=0.2) is None  # waits behind the first
    done = TurnOutcome(turn_id=first, status="completed", text="ok", messages=[])
    assert await store.save_outcome(first, done, conversation_id="conv-2")
    assert await store.claim("orch-a", timeout_s=1.0) == second
    assert await store.conversation_history("conv-2") == Prior([], [])
