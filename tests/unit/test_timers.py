"""The runtime's one timer heap: order, replacement, cancellation, and no task per timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.runtime.timers import TimerHeap
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.timeout(10)


async def test_timers_fire_in_time_order_and_replacement_wins() -> None:
    fired: list[tuple[str, str]] = []
    heap = TimerHeap(lambda turn, timer: fired.append((turn, timer)))
    task = asyncio.create_task(heap.run())
    now = time.time()
    heap.arm("t1", "late", now + 0.30)
    heap.arm("t2", "early", now + 0.05)
    heap.arm("t1", "moved", now + 0.20)
    heap.arm("t1", "moved", now + 0.10)  # re-arming replaces the earlier entry
    heap.arm("t3", "past", now - 5)
    # However late the heap's task runs, it fires what is due in time order; the replaced entry (0.20)
    # comes due before the last timer, so it would show among the four had it fired.
    await async_wait_until(lambda: len(fired) == 4, "the four timers to fire")
    task.cancel()
    assert fired == [("t3", "past"), ("t2", "early"), ("t1", "moved"), ("t1", "late")]
    assert len(heap) == 0


async def test_cancel_and_cancel_turn_forget_timers() -> None:
    fired: list[tuple[str, str]] = []
    heap = TimerHeap(lambda turn, timer: fired.append((turn, timer)))
    task = asyncio.create_task(heap.run())
    now = time.time()
    heap.arm("a", "x", now + 0.05)
    heap.arm("a", "y", now + 0.05)
    heap.arm("b", "x", now + 0.05)
    heap.cancel("a", "x")
    heap.cancel("nobody", "x")
    assert heap.armed("a") == {"y": pytest.approx(now + 0.05)}
    heap.cancel_turn("b")
    assert len(heap) == 1
    # All three were due at the same moment: one pass of the heap fires every live one of them together.
    await async_wait_until(lambda: fired, "the timer left to fire")
    task.cancel()
    assert fired == [("a", "y")]


async def test_ten_thousand_parked_turns_cost_one_task() -> None:
    fired: list[str] = []
    heap = TimerHeap(lambda turn, _timer: fired.append(turn))
    tasks_before = len(asyncio.all_tasks())
    task = asyncio.create_task(heap.run())
    far = time.time() + 3600
    for i in range(10_000):
        heap.arm(f"turn-{i}", "deadline", far + i)
    heap.arm("soon", "deadline", time.time() + 0.05)
    await async_wait_until(lambda: fired, "the timer due soon to fire")
    assert len(asyncio.all_tasks()) == tasks_before + 1
    assert fired == ["soon"]
    for i in range(10_000):
        heap.cancel_turn(f"turn-{i}")
    assert len(heap) == 0
    task.cancel()
