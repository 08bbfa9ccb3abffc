"""One timer heap for every turn an orchestrator drives.

The machine arms timers (deadlines, lost-call checks, model retry backoff) as values; the runtime keeps them
all in one heap served by one asyncio task. A parked turn therefore costs one small heap entry per armed
timer and no task, and an idle orchestrator sleeps until the earliest timer — no polling.

Times are wall-clock epoch seconds, because they come from persisted state that another orchestrator (on
another machine) may resume; the sleep is capped so a clock step never strands a timer for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A wall clock can step; waking at least this often bounds how late a timer fires after a step.
MAX_SLEEP_S = 30.0

FireCallback = Callable[[str, str], None]


@dataclass(order=True)
class _Entry:
    at: float
    seq: int
    turn_id: str = field(compare=False)
    timer_id: str = field(compare=False)


class TimerHeap:
    """Timers keyed by (turn id, timer id); re-arming a key replaces it. `run()` fires them in time order.

    `on_fire(turn_id, timer_id)` is called from the heap's task and must not block: the runtime uses it to
    schedule a `TimerFired` event for the turn.
    """

    def __init__(self, on_fire: FireCallback, *, clock: Callable[[], float] = time.time) -> None:
        self._on_fire = on_fire
        self._clock = clock
        self._heap: list[_Entry] = []
        # The live entries per turn; heap entries not in here were cancelled or replaced (lazy deletion).
        self._live: dict[str, dict[str, _Entry]] = {}
        self._count = 0
        self._seq = itertools.count()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return self._count

    def arm(self, turn_id: str, timer_id: str, at: float) -> None:
        """Fire `timer_id` of `turn_id` at epoch `at` (at once if it is past), replacing an earlier arming."""
        entry = _Entry(at, next(self._seq), turn_id, timer_id)
        timers = self._live.setdefault(turn_id, {})
        if timer_id not in timers:
            self._count += 1
        timers[timer_id] = entry
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._changed.set()
        self._compact()

    def cancel(self, turn_id: str, timer_id: str) -> None:
        """Forget one timer; cancelling an unknown one is a no-op."""
        timers = self._live.get(turn_id)
        if timers is not None and timers.pop(timer_id, None) is not None:
            self._count -= 1
            if not timers:
                del self._live[turn_id]

    def cancel_turn(self, turn_id: str) -> None:
        """Forget every timer of a turn (it finished or moved to another orchestrator)."""
        self._count -= len(self._live.pop(turn_id, {}))
        self._compact()

    def armed(self, turn_id: str) -> dict[str, float]:
        """The live timers of one turn: timer id -> epoch seconds."""
        return {timer_id: e.at for timer_id, e in self._live.get(turn_id, {}).items()}

    async def run(self) -> None:
        """Fire timers as they come due, forever (cancel the task to stop)."""
        while True:
            self._fire_due()
            delay = MAX_SLEEP_S
            if self._heap:
                delay = min(max(self._heap[0].at - self._clock(), 0.0), MAX_SLEEP_S)
            self._changed.clear()
            # asyncio.timeout rather than wait_for: wait_for wraps the wait in a second task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._changed.wait()

    def _fire_due(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0].at <= now:
            entry = heapq.heappop(self._heap)
            if self._live.get(entry.turn_id, {}).get(entry.timer_id) is entry:
                self.cancel(entry.turn_id, entry.timer_id)
                self._on_fire(entry.turn_id, entry.timer_id)

    def _compact(self) -> None:
        # Cancelled entries stay in the heap until they surface; rebuild when they dominate it.
        if len(self._heap) > 64 and len(self._heap) > 2 * self._count:
            self._heap = [e for timers in self._live.values() for e in timers.values()]
            heapq.heapify(self._heap)
