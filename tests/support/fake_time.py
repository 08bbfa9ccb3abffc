"""Clocks and sleeps a unit test injects instead of real time, so that a wait is observed, never spent.

clock = ManualClock()          # `clock()` is the time; a test moves it: `clock.now += 1.5`
clock = SleepingClock()        # `clock.now()` moves only when the code under test sleeps (`clock.sleep`)
sleep = SleepRecorder()        # an `asyncio.sleep` that notes each wait in `sleep.waits` and returns
"""

from __future__ import annotations

import asyncio


class ManualClock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SleepingClock:
    """A clock that moves only when the code under test sleeps; `pauses` are the sleeps, in order."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self.pauses: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.t += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class SleepRecorder:
    """Stands in for asyncio.sleep so that retry waits are observed, not spent."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)
