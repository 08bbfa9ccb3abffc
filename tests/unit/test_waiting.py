"""The suite's polling helper: returns what it waited for, and fails naming what never happened."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import async_wait_for, async_wait_until, wait_for, wait_until


def test_wait_for_returns_the_first_value_that_is_not_none() -> None:
    values = iter([None, None, 0, 5])
    assert wait_for(lambda: next(values), "a value") == 0


def test_wait_until_fails_naming_what_never_happened() -> None:
    with pytest.raises(AssertionError, match="waiting for the sky to fall"):
        wait_until(lambda: False, "the sky to fall", timeout_s=0.1)


def test_async_waits_take_sync_and_async_checks() -> None:
    counter = itertools.count()

    async def later() -> int | None:
        value = next(counter)
        return value if value >= 2 else None

    async def both() -> int:
        await async_wait_until(lambda: True, "at once")
        return await async_wait_for(later, "the third poll")

    assert asyncio.run(both()) == 2
    with pytest.raises(AssertionError, match="never"):
        asyncio.run(async_wait_until(lambda: 0, "never", timeout_s=0.1))
