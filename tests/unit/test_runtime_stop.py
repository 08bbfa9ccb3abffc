"""Stopping the runtime's loops (`runtime.process.cancel_until_done`): a loop whose cancellation is swallowed
below our code — as one was, inside a Redis call, under Redis out of memory — is cancelled again until it
ends, instead of holding `Runtime.run()` forever."""

from __future__ import annotations

import asyncio

from orchestrator.runtime.process import cancel_until_done
from tests.support.waiting import DEFAULT_TIMEOUT_S


async def test_a_loop_that_swallows_its_cancellation_is_cancelled_again() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1  # a library catching the cancellation and going on

    async def plain() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(plain())]
    await asyncio.sleep(0)  # both running
    await asyncio.wait_for(cancel_until_done(tasks), DEFAULT_TIMEOUT_S)
    assert all(task.cancelled() for task in tasks)
    assert swallowed == 2
