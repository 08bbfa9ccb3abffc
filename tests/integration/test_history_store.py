"""The history stored once, on a real Redis: append-only lists, references instead of copies, stubs, TTLs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.model import AssistantMessage, Message, TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store.history import Appended
from orchestrator.store.scripts import SaveResult
from orchestrator.store.turns import TurnStore
from tests.unit.machine.harness import Driver, answer, calls, ok
from workers import keys, packing
from workers.contract import ToolOutcome, dump_tool_outcome

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).parent.parent / "fixtures"
RETENTION = keys.Retention(turn_ttl_s=1000, conversation_ttl_s=5000, outcome_ttl_s=300, audit_ttl_s=200)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[TurnStore]:
    turn_store = TurnStore.from_url(db_url, retention=RETENTION)
    yield turn_store
    await turn_store.aclose()


def texts(*contents: str) -> list[Message]:
    return [
        UserMessage(content=c) if i % 2 == 0 else AssistantMessage(content=c) for i, c in enumerate(contents)
    ]


def appended(key: str, start: int, messages: list[Message], *consumed: ToolOutcome) -> Appended:
    return Appended(key, start, tuple(dump_entries(messages)), consumed)


async def entries(store: TurnStore, key: str) -> list[str]:
    return [m["content"] for m in map(json.loads, await store.redis.lrange(key, 0, -1))]


async def test_a_step_appends_only_its_new_messages_and_a_retry_never_twice(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="a"))
    key = keys.turn_history(turn_id)
    first, second = texts("a", "b", "c"), texts("d", "e")
    assert await store.save_step(turn_id, "{}", TurnStatus.RUNNING, append=appended(key, 0, first))
    assert await store.save_step(turn_id, "{}", TurnStatus.RUNNING, append=appended(key, 3, second))
    assert await entries(store, key) == ["a", "b", "c", "d", "e"]
    # A step without messages writes none; a retried step (its first try landed) appends after the same 3.
    assert await store.save_step(turn_id, '{"n": 1}', TurnStatus.RUNNING, [("x", {})])
    assert await store.save_step(turn_id, "{}", TurnStatus.RUNNING, append=appended(key, 3, second))
    assert await store.redis.llen(key) == 5
    # The proof by the stored state: nothing written again, not even the events.
    events = await store.redis.xlen(keys.turn_events(turn_id))
    again = await store.resave_step(
        turn_id, "{}", TurnStatus.RUNNING, [("y", {})], append=appended(key, 3, second)
    )
    assert again is SaveResult.SAVED and await store.redis.xlen(keys.turn_events(turn_id)) == events
    # A list that lost messages the state had: nothing written, the writer must send the whole history.
    gap = await store.write_step(turn_id, '{"n": 2}', TurnStatus.RUNNING, append=appended(key, 9, second))
    assert gap is SaveResult.HISTORY_GAP and await store.load_state(turn_id) == "{}"


async def test_resuming_reads_the_state_with_its_history_and_log_in_one_round_trip(store: TurnStore) -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add", "3", turn_id="turn1"))
    turn_id = await store.submit(TurnRequest(prompt="do it"), turn_id="turn_resume1")
    key, log_key = keys.turn_history(turn_id), keys.turn_log(turn_id)
    state = driver.state
    text = dump_state(state, history_key=key, log_key=log_key)
    assert "do it" not in text and "finish_reason" not in text  # the prompt and the records are in the lists
    log = tuple(dump_log(state))
    append = Appended(key, 0, tuple(dump_entries(state.history)), log_key=log_key, log=log)
    assert await store.save_step(turn_id, text, TurnStatus.RUNNING, append=append)
    await store.redis.rpush(key, json.dumps({"role": "user", "content": "a later turn's"}))
    stored, request = await store.load_state_and_request(turn_id)
    assert stored is not None and request is not None
    assert len(stored.history) == len(state.history)  # the state's own first entries, not the later one
    assert stored.log == list(log)
    assert load_state(stored.text, stored.history, stored.log) == state


async def finish_turn(
    store: TurnStore, turn_id: str, key: str, start: int, messages: list[Message]
) -> TurnOutcome:
    assert await store.save_step(
        turn_id, "{}", TurnStatus.RUNNING, append=appended(key, start, messages[start:])
    )
    outcome = TurnOutcome(turn_id=turn_id, status="completed", text=messages[-1].content, messages=messages)  # type: ignore[union-attr]
    assert await store.save_outcome(turn_id, outcome)
    return outcome


async def test_outcomes_reference_the_shared_conversation_list(store: TurnStore) -> None:
    one = await store.submit(TurnRequest(prompt="a", conversation_id="conv"))
    assert await store.claim("o", timeout_s=1.0) == one
    key = keys.conversation_history("conv")
    first = await finish_turn(store, one, key, 0, texts("a", "b"))
    two = await store.submit(TurnRequest(prompt="c", conversation_id="conv"))
    prior = await store.conversation_history("conv")
    assert prior.messages == first.messages and len(prior.entries) == 2
    second = await finish_turn(store, two, key, 2, [*prior.messages, *texts("c", "d")])
    # One list for the conversation; each outcome key holds no message, only where they are.
    assert await entries(store, key) == ["a", "b", "c", "d"]
    stored = json.loads(await store.redis.get(keys.turn_outcome(two)))
    assert "messages" not in stored and (stored["history_key"], stored["history_len"]) == (key, 4)
    assert await store.get_outcome(one) == first and await store.get_outcome(two) == second
    view = await store.get_view(two)
    assert view is not None and view.messages == second.messages and view.outcome == second
    assert await store.wait_outcome(two, 1.0) == second
    # Retention: the conversation's list and head for the conversation's TTL, the turn's keys for the turn's.
    assert 1000 < await store.redis.ttl(key) <= 5000
    assert 1000 < await store.redis.ttl(keys.conversation_head("conv")) <= 5000
    assert 0 < await store.redis.ttl(keys.turn_outcome(two)) <= 1000


async def test_a_running_turn_shows_its_history_and_a_lone_turn_has_its_own_list(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="a"))
    key = keys.turn_history(turn_id)
    driver = Driver(prompt="a")
    text = dump_state(driver.state, history_key=key)
    assert await store.save_step(
        turn_id, text, TurnStatus.RUNNING, append=appended(key, 0, list(driver.state.history))
    )
    view = await store.get_view(turn_id)
    assert view is not None and [m.content for m in view.messages] == ["a"]
    assert await store.redis.ttl(key) == -1  # a running turn's history never expires
    driver.respond(answer("done"))
    await finish_turn(store, turn_id, key, 1, list(driver.state.history))
    assert 0 < await store.redis.ttl(key) <= 1000


async def test_a_conversation_written_by_the_previous_layout_is_continued(store: TurnStore) -> None:
    fixture = json.loads((FIXTURES / "v2_conversation_turn.json").read_text())
    old = fixture["turn_id"]
    for name, value in (
        ("request", fixture["request"]),
        ("status", fixture["status"]),
        ("outcome", fixture["outcome"]),
    ):
        await store.redis.set(keys.PREFIX + f"turn:{old}:{name}", value)
    await store.redis.set(keys.conversation_head(fixture["conversation_id"]), fixture["head"])
    prior = await store.conversation_history(fixture["conversation_id"])
    # The old head names a turn whose outcome holds the messages; none is in the list yet.
    assert [m.role for m in prior.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ] and prior.entries == []
    assert await store.get_outcome(old) == TurnOutcome.model_validate_json(fixture["outcome"])


async def test_consumed_outcomes_keep_a_stub_and_late_ones_stay(store: TurnStore) -> None:
    turn_id = await store.submit(TurnRequest(prompt="a"))
    call = f"{turn_id}/call_0"
    real = ToolOutcome(
        call_id=call, tool="add", turn_id=turn_id, ok=True, result="x" * 5000, content="x" * 5000
    )
    late = real.model_copy(update={"result": "late", "content": "late"})
    await store.write_outcome(real)
    await store.write_outcome(late)
    stored = await store.redis.get(keys.outcome(call))
    # The result once, and large: compressed (`workers.packing`).
    assert packing.unpack(stored) == dump_tool_outcome(real) and packing.stored_size(stored) < 500
    assert "content" not in json.loads(packing.unpack(stored))
    assert await store.read_outcomes({call: turn_id}) == {call: real}
    key = keys.turn_history(turn_id)
    assert await store.save_step(turn_id, "{}", TurnStatus.RUNNING, append=appended(key, 0, texts("a"), real))
    stub = json.loads(await store.redis.get(keys.outcome(call)))
    assert stub["consumed"] is True and "result" not in stub and "content" not in stub and stub["ok"] is True
    assert 0 < await store.redis.ttl(keys.outcome(call)) <= 200
    assert len(await store.redis.lrange(keys.late_outcomes(call), 0, -1)) == 1


async def command_calls(store: TurnStore) -> dict[str, int]:
    stats = await store.redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}


async def commands_of(store: TurnStore, save: Any) -> dict[str, int]:
    """The commands Redis ran for one save (inside its script included), by name."""
    before = await command_calls(store)
    assert await save
    after = await command_calls(store)
    return {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}


async def test_a_step_costs_one_push_per_list_and_rewrites_nothing_unchanged(store: TurnStore) -> None:
    # What a step costs Redis is what a tool call costs it (`make bench`): no command a step can spare.
    turn_id = await store.submit(TurnRequest(prompt="a", conversation_id="talk"))
    key = keys.conversation_history("talk")
    # The conversation's list as a previous turn left it: entries, and the TTL its end gave them.
    await store.redis.rpush(key, *dump_entries(texts("x", "y")))
    await store.redis.expire(key, 500)
    first = store.write_step(turn_id, "{}", TurnStatus.RUNNING, append=appended(key, 2, texts("a", "b", "c")))
    used = await commands_of(store, first)
    # The owner's first save takes the TTL off; its three messages go in one push; the status is new.
    assert used["rpush"] == 1 and used["llen"] == 1 and used["persist"] == 1 and used["set"] == 2
    assert await store.redis.ttl(key) == -1
    later = store.write_step(
        turn_id, '{"n": 1}', TurnStatus.RUNNING, append=appended(key, 5, texts("d", "e")), lists_kept=True
    )
    used = await commands_of(store, later)
    # Its later saves: the list has no TTL to take off, and the status "running" is already stored.
    assert used["rpush"] == 1 and "persist" not in used and used["set"] == 1
    assert await entries(store, key) == ["x", "y", "a", "b", "c", "d", "e"]
