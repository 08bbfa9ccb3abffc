"""The suite's polling helper: returns what it waited for, and fails naming what never happened."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import (
    async_wait_for,
    async_wait_until,
    wait_at_most,
    wait_for,
    wait_until,
)


def test_wait_for_returns_the_first_value_that_is_not_none() -> None:
    values = iter([None, None, 0, 5])
    assert wait_for(lambda: next(values), "a value") == 0


def test_wait_until_fails_naming_what_never_happened() -> None:
    with pytest.raises(AssertionError, match="waiting for the sky to fall"):
        wait_until(lambda: False, "the sky to fall", timeout_s=0.1)


def test_a_failure_adds_the_detail_it_is_given() -> None:
    with pytest.raises(AssertionError, match="waiting for the log line:\nthe log so far"):
        wait_until(lambda: False, "the log line", timeout_s=0.1, detail=lambda: "the log so far")


def test_wait_at_most_says_whether_it_came_and_never_fails() -> None:
    values = iter([False, False, True])
    assert wait_at_most(lambda: next(values), max_s=5) is True
    assert wait_at_most(lambda: False, max_s=0.1) is False


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
