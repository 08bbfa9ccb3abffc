"""Outcomes are stepped and saved in batches (issue 16): those that arrive while a turn's step holds its
lock join one step, and those that leave a call of the round unanswered wait for the round's last.

A real `Runtime` (the instant scripted model, real Redis) runs a turn whose round of three calls goes to a
tool no worker serves. With the turn's lock held, as a step saving or a model answer being stepped holds
it, the three outcomes are written (first writer wins, as a worker writes them) and delivered one by one, as
three inbox reads would deliver them. Once the lock is released they must cost one step and one save — not
three — and the turn must still end with all three answered. Delivered through the inbox path one read at a
time, with the turn idle in between, the first two are held back and the third steps all three at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from ops.bench.instant import INSTANT_BASE_URL, INSTANT_MODEL, build_instant_http
from orchestrator.machine.events import ToolFinished
from orchestrator.model import TurnRequest
from orchestrator.publishing.publisher import get_producer_app
from orchestrator.runtime import driver
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome
from orchestrator.runtime.process import Runtime
from orchestrator.settings import Settings
from orchestrator.store.scripts import SaveResult
from orchestrator.store.turns import TurnStore
from tests.support.waiting import async_wait_for, async_wait_until
from workers import keys
from workers.contract import ToolOutcome, ToolSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Served by no worker: its calls stay queued until this test answers them.
SPEC = ToolSpec(name="batch_probe", description="A tool nobody runs.", soft_time_limit_s=30, time_limit_s=60)
CALLS = 3


class CountingStore(TurnStore):
    """The real store, counting the steps it saves, and the outcomes it stores apart from a step."""

    saves = 0
    ends_apart = 0

    async def write_step(self, *args: Any, **kwargs: Any) -> SaveResult:
        self.saves += 1
        return await super().write_step(*args, **kwargs)

    async def finish_step(self, *args: Any, **kwargs: Any) -> SaveResult:
        self.saves += 1
        return await super().finish_step(*args, **kwargs)

    async def save_outcome(self, *args: Any, **kwargs: Any) -> bool:
        self.ends_apart += 1
        return await super().save_outcome(*args, **kwargs)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[CountingStore]:
    store = CountingStore.from_url(redis_url)
    entry = {"seen_at": time.time() + 3600, "tools": [SPEC.model_dump(mode="json")]}
    await store.redis.hset(keys.CATALOGUE, "batch@test", json.dumps(entry))
    yield store
    # The round's messages no worker took: the next test counts its own.
    await store.redis.delete(SPEC.queue)
    await store.redis.hdel(keys.CATALOGUE, "batch@test")
    await store.aclose()


@contextlib.asynccontextmanager
async def waiting_turn(redis_url: str, store: CountingStore) -> AsyncIterator[tuple[Runtime, TurnHandle]]:
    """A running `Runtime` and its turn, idle, its round of CALLS calls published and unanswered."""
    settings = Settings(redis_url=redis_url, scripted_base_url=INSTANT_BASE_URL, model=INSTANT_MODEL)
    plan = {"plan": [{"calls": [{"name": SPEC.name, "arguments": {"n": n}} for n in range(CALLS)]}]}
    queue = redis.asyncio.Redis.from_url(redis_url)
    async with build_instant_http() as http:
        runtime = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        running = asyncio.create_task(runtime.run())
        try:
            turn_id = await store.submit(TurnRequest(prompt=json.dumps(plan), tools=[SPEC.name]))

            async def published() -> bool:
                return bool(await queue.llen(SPEC.queue) == CALLS)

            await async_wait_until(published, "the round's calls published")
            handle = runtime.turns[turn_id]
            await async_wait_until(lambda: not handle.lock.locked() and not handle.tasks, "the turn idle")
            yield runtime, handle
        finally:
            runtime.request_stop()
            await running
            await queue.aclose()


async def answer(store: TurnStore, handle: TurnHandle, call_id: str) -> ToolOutcome:
    """Write the call's outcome as a worker does (first writer wins); the outcome, under its wire id."""
    wire_id = build_wire_call_id(handle.turn_id, call_id)
    outcome = ToolOutcome(call_id=wire_id, tool=SPEC.name, turn_id=handle.turn_id, ok=True, content="ok")
    return await store.write_outcome(outcome)


def call_ids(handle: TurnHandle) -> list[str]:
    assert handle.state.current is not None
    return [call.call_id for call in handle.state.current.calls]


async def test_outcomes_delivered_while_a_step_runs_are_stepped_and_saved_once(
    redis_url: str, store: CountingStore
) -> None:
    async with waiting_turn(redis_url, store) as (runtime, handle):
        async with handle.lock:
            saves_before = store.saves
            for call_id in call_ids(handle):
                outcome = await answer(store, handle, call_id)
                finished = ToolFinished(outcome=to_local_outcome(outcome), at=time.time())
                runtime.driver.deliver(handle, [finished])
            await asyncio.sleep(0)  # the step waiting for the lock is scheduled, and waits
        outcome = await async_wait_for(lambda: store.get_outcome(handle.turn_id), "the turn's outcome")
    assert outcome.status == "completed"
    assert outcome.tool_executions == CALLS
    # One save for the three outcomes, one for the model's final answer, which stores the turn's outcome
    # with it (one round trip for the turn's end); a step per delivery would have saved four times.
    assert store.saves - saves_before == 2
    assert store.ends_apart == 0


async def test_outcomes_that_leave_the_round_waiting_are_held_for_its_last(
    redis_url: str, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held far longer than the test takes: only the round's last outcome can step them.
    monkeypatch.setattr(driver, "STARTED_DELAY_S", 600.0)
    async with waiting_turn(redis_url, store) as (runtime, handle):
        saves_before = store.saves
        for number, call_id in enumerate(call_ids(handle)):
            outcome = await answer(store, handle, call_id)
            entry = {"kind": "outcome", "turn": handle.turn_id, "call": outcome.call_id}
            # Each in an inbox read of its own, as the inbox loop hands them over, the turn idle in between.
            entry["outcome"] = outcome.model_dump_json()
            await runtime._handle_inbox([(f"{number + 1}-0", entry)])
            await async_wait_until(lambda: not handle.lock.locked() and not handle.tasks, "the turn idle")
            if number < CALLS - 1:
                assert store.saves == saves_before, "an outcome that moves nothing on is held back"
        outcome = await async_wait_for(lambda: store.get_outcome(handle.turn_id), "the turn's outcome")
    assert outcome.status == "completed"
    assert outcome.tool_executions == CALLS
    # The three outcomes in one save with the round's last, then the model's final answer.
    assert store.saves - saves_before == 2


class RefusingOnceStore(CountingStore):
    """Refuses the first try of a turn's last step as a restarting Redis refuses a connection: nothing was
    sent, though the error does not say so (redis-py raises the same ConnectionError for a lost reply)."""

    refused = 0

    async def finish_step(self, *args: Any, **kwargs: Any) -> SaveResult:
        if not self.refused:
            self.refused += 1
            raise redis.ConnectionError("Error 111 connecting to localhost:6379. Connection refused.")
        return await super().finish_step(*args, **kwargs)


async def test_a_last_step_whose_first_try_failed_unsure_still_stores_the_outcome_at_once(
    redis_url: str, store: CountingStore
) -> None:
    # The retry proves the step or saves it alone (it cannot tell whether the first try landed): the outcome
    # must then be stored apart, at once. It was taken as stored: the turn was dropped with its final answer
    # in and its lease held, and ended only when another orchestrator took it over, a lease (15 s) later.
    refusing = RefusingOnceStore(store.redis)
    async with waiting_turn(redis_url, refusing) as (runtime, handle):
        entries = []
        for number, call_id in enumerate(call_ids(handle)):
            outcome = await answer(refusing, handle, call_id)
            entry = {"kind": "outcome", "turn": handle.turn_id, "call": outcome.call_id}
            entries.append((f"{number + 1}-0", {**entry, "outcome": outcome.model_dump_json()}))
        await runtime._handle_inbox(entries)
        ended = await async_wait_for(lambda: refusing.get_outcome(handle.turn_id), "the outcome", timeout_s=5)
    assert refusing.refused == 1 and ended.status == "completed" and ended.tool_executions == CALLS
    assert refusing.ends_apart == 1
    assert await store.redis.get(keys.turn_lease(handle.turn_id)) is None
