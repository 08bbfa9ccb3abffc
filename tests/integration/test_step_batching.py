"""Outcomes that arrive while a turn's step holds its lock are stepped and saved together (issue 16).

A real `Runtime` (the instant scripted model, real Redis) runs a turn whose round of three calls goes to a
tool no worker serves. With the turn's lock held, as a step saving or a model answer being stepped holds
it, the three outcomes are written (first writer wins, as a worker writes them) and delivered one by one, as
three inbox reads would deliver them. Once the lock is released they must cost one step and one save — not
three — and the turn must still end with all three answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
import redis.asyncio

from ops.bench.instant import INSTANT_BASE_URL, INSTANT_MODEL, build_instant_http
from orchestrator.machine.events import ToolFinished
from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.runtime.inbox import to_local_outcome
from orchestrator.runtime.process import Runtime
from orchestrator.runtime.publish import get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.history import Appended
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
    """The real store, counting the steps it saves."""

    saves = 0

    async def write_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        orchestrator_id: str | None = None,
        append: Appended | None = None,
    ) -> SaveResult:
        self.saves += 1
        return await super().write_step(
            turn_id, state_json, status, events, orchestrator_id=orchestrator_id, append=append
        )


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[CountingStore]:
    store = CountingStore.from_url(redis_url)
    entry = {"seen_at": time.time() + 3600, "tools": [SPEC.model_dump(mode="json")]}
    await store.redis.hset(keys.CATALOGUE, "batch@test", json.dumps(entry))
    yield store
    await store.redis.hdel(keys.CATALOGUE, "batch@test")
    await store.aclose()


async def test_outcomes_delivered_while_a_step_runs_are_stepped_and_saved_once(
    redis_url: str, store: CountingStore
) -> None:
    assert isinstance(store, CountingStore)
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
            await async_wait_until(lambda: _idle(handle), "the turn idle")
            calls = [call.call_id for call in handle.state.current.calls]  # type: ignore[union-attr]
            async with handle.lock:
                saves_before = store.saves
                for call_id in calls:
                    answer = ToolOutcome(
                        call_id=call_id, tool=SPEC.name, turn_id=turn_id, ok=True, content="ok"
                    )
                    await store.write_outcome(answer)
                    finished = ToolFinished(outcome=to_local_outcome(answer), at=time.time())
                    runtime.driver.deliver(handle, [finished])
                await asyncio.sleep(0)  # the step waiting for the lock is scheduled, and waits
            outcome = await async_wait_for(lambda: store.get_outcome(turn_id), "the turn's outcome")
        finally:
            runtime.request_stop()
            await running
            await queue.aclose()
    assert outcome.status == "completed"
    assert outcome.tool_executions == CALLS
    # One save for the three outcomes, one for the model's final answer (the outcome itself is written by
    # `save_outcome`); a step per delivery would have saved four times.
    assert store.saves - saves_before == 2


def _idle(handle: Any) -> bool:
    return not handle.lock.locked() and not handle.tasks
