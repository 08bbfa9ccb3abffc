"""Waiting on a condition instead of on the clock: the one polling helper of the suite.

A test never asserts how long something took (speed belongs in `make bench`); it waits, with a generous
timeout, until what it expects is true, and fails naming what never happened.

    wait_until(lambda: outcome_of(call_id) is not None, "the call's outcome")
    found = wait_for(lambda: read_event(...), "a tool_started event")   # the first value not None
    await async_wait_until(lambda: store.exists(key), "the lease")   # check: sync or async
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Generous: a loaded 2-core CI machine running two suites side by side is many times slower than a laptop.
DEFAULT_TIMEOUT_S = 60.0
POLL_S = 0.05


def wait_for(find: Callable[[], T | None], what: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> T:
    """Poll `find()` until it returns something other than None, and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = find()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def wait_until(check: Callable[[], object], what: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Poll `check()` until it is true; fail naming `what`."""
    wait_for(lambda: True if check() else None, what, timeout_s)


async def async_wait_for(
    find: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> T:
    """`wait_for` in a coroutine, for an async `find`: the loop keeps running between polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await find()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def async_wait_until(
    check: Callable[[], object | Awaitable[object]], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """`wait_until` for a coroutine: `check` may be sync or async."""

    async def find() -> bool | None:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        return True if value else None

    await async_wait_for(find, what, timeout_s)
