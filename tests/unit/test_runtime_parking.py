"""Parked turns as their saved JSON, and tool specs shared between turns (memory of an orchestrator)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis.asyncio as aioredis
from celery import Celery

from orchestrator import machine
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import TurnState, dump_entries, dump_state
from orchestrator.model import TurnRequest
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.process import Runtime, RuntimeOptions
from orchestrator.settings import Settings
from orchestrator.store.catalogue import build_catalogue
from orchestrator.store.turns import TurnStore
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(10)

SPEC = ToolSpec(name="add", description="Add two numbers.", soft_time_limit_s=5, time_limit_s=10)


def raw_entry(seen_at: float, *specs: ToolSpec) -> str:
    return json.dumps({"seen_at": seen_at, "tools": [s.model_dump(mode="json") for s in specs]})


def new_state(turn_id: str = "turn_1") -> TurnState:
    catalogue = build_catalogue({"w1": raw_entry(100.0, SPEC)}, now=100.0)
    state, _ = machine.start(
        turn_id,
        TurnRequest(prompt="add 1 and 2", tools=["add"]),
        model="scripted:demo",
        catalogue=catalogue,
        at=100.0,
    )
    return state


def test_turns_started_from_one_catalogue_entry_share_its_specs() -> None:
    entries = {"w1": raw_entry(100.0, SPEC)}
    first = build_catalogue(entries, now=100.0)
    second = build_catalogue(dict(entries), now=101.0)
    assert first == {"add": SPEC}
    assert second["add"] is first["add"]
    # A republished entry is parsed anew, and staleness is still judged at each call.
    republished = build_catalogue({"w1": raw_entry(130.0, SPEC)}, now=130.0)
    assert republished["add"] == SPEC and republished["add"] is not first["add"]
    assert build_catalogue(entries, now=100.0 + 3600) == {}


def test_a_parked_turn_keeps_only_its_json_and_comes_back_equal() -> None:
    state = new_state()
    handle = TurnHandle(state.turn_id, state)
    assert not handle.park()  # never saved: nothing to come back from
    handle.set_state(state, dump_state(state), dump_entries(state.history), dump_log(state))
    assert handle.park()
    assert not handle.hydrated
    assert handle.state == state
    assert handle.hydrated


async def test_a_turn_in_use_is_not_parked() -> None:
    state = new_state()
    handle = TurnHandle(state.turn_id, state)
    handle.set_state(state, dump_state(state), dump_entries(state.history), dump_log(state))
    async with handle.lock:
        assert not handle.park()
    task = asyncio.create_task(asyncio.sleep(0))
    handle.tasks = {task}
    assert not handle.park()
    await task
    handle.tasks = None
    assert handle.park()


async def test_only_the_least_recently_stepped_turns_beyond_the_limit_are_parked() -> None:
    store = TurnStore(aioredis.Redis.from_url("redis://127.0.0.1:1/0"))
    async with httpx.AsyncClient() as http:
        runtime = Runtime(
            store=store,
            celery_app=Celery(set_as_current=False),
            http=http,
            settings=Settings(),
            options=RuntimeOptions(hydrated_turns=2),
        )
        handles = []
        for i in range(3):
            state = new_state(f"turn_{i}")
            handle = TurnHandle(state.turn_id, state)
            handle.set_state(state, dump_state(state), dump_entries(state.history), dump_log(state))
            runtime.driver.turns[handle.turn_id] = handle
            handles.append(handle)
        for handle in handles:
            runtime.driver._hydrated.stepped(handle)
        assert [h.hydrated for h in handles] == [False, True, True]
        # Stepping a parked turn brings it back and parks the one least recently stepped now.
        assert handles[0].state.turn_id == "turn_0"
        runtime.driver._hydrated.stepped(handles[0])
        assert [h.hydrated for h in handles] == [True, False, True]
        await runtime.performer.aclose()
    await store.aclose()


def test_a_turn_task_cancelled_before_its_first_step_leaves_no_unawaited_work() -> None:
    import gc
    import warnings
    from types import SimpleNamespace

    from orchestrator.runtime.driver import TurnDriver

    state = new_state()
    handle = TurnHandle(state.turn_id, state)
    started: list[str] = []

    async def work() -> None:
        started.append("work")

    async def scenario() -> None:
        # `_guarded` is never reached: the task is cancelled before its first step.
        driver = SimpleNamespace(_guarded=lambda _handle, inner: TurnDriver._guarded(driver, _handle, inner))
        TurnDriver._spawn(driver, handle, work())  # type: ignore[arg-type]
        assert handle.tasks is not None
        (task,) = handle.tasks
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert started == [] and handle.tasks is None
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
