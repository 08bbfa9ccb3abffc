"""Waiting on a condition instead of on the clock: the one polling helper of the suite.

A test never asserts how long something took (speed belongs in `make bench`); it waits, with a generous
timeout, until what it expects is true, and fails naming what never happened.

    wait_until(lambda: outcome_of(call_id) is not None, "the call's outcome")
    found = wait_for(lambda: read_event(...), "a tool_started event")   # the first value not None
    wait_until(ready, "the worker's catalogue", detail=handle.log_text)  # the log added to a failure
    await async_wait_until(lambda: store.exists(key), "the lease")   # check: sync or async

A tool that holds its call until the test's go, never longer than a bound of its own, polls with
`wait_at_most`: it never fails, it says whether the go came, and the tool goes on.
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


def _poll(find: Callable[[], T | None], timeout_s: float, poll_s: float) -> T | None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = find()
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)


async def _async_poll(find: Callable[[], Awaitable[T | None]], timeout_s: float, poll_s: float) -> T | None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await find()
        if found is not None or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)


def _timed_out(what: str, timeout_s: float, detail: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout_s:g} s waiting for {what}"
    return AssertionError(f"{message}:\n{detail()}" if detail is not None else message)


def wait_for(
    find: Callable[[], T | None],
    what: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `find()` until it returns something other than None, and return that; fail naming `what`
    (and adding `detail()`: a log, the state seen last)."""
    found = _poll(find, timeout_s, POLL_S)
    if found is None:
        raise _timed_out(what, timeout_s, detail)
    return found


def wait_until(
    check: Callable[[], object],
    what: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll `check()` until it is true; fail naming `what` (and adding `detail()`)."""
    wait_for(lambda: True if check() else None, what, timeout_s, detail=detail)


def wait_at_most(check: Callable[[], object], max_s: float, poll_s: float = POLL_S) -> bool:
    """Poll `check()` until it is true or `max_s` has passed: whether it came. Never fails — for a tool that
    holds until the test's go (a flag file, a key) but not forever, and goes on either way."""
    return _poll(lambda: True if check() else None, max_s, poll_s) is not None


async def async_wait_for(
    find: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> T:
    """`wait_for` in a coroutine, for an async `find`: the loop keeps running between polls."""
    found = await _async_poll(find, timeout_s, POLL_S)
    if found is None:
        raise _timed_out(what, timeout_s, None)
    return found


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
