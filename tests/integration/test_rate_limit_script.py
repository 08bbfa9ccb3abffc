"""`rate_limit.lua` on a real Redis: what a call reserves, how it is corrected and refunded, how waiters are
lined up, and the pause every orchestrator meets (`orchestrator.store.rate_limits`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from orchestrator.model_limits import Granted, ModelLimit, Settlement, Throttled
from orchestrator.store.connection import connect_async
from orchestrator.store.rate_limits import PAUSE_SEEN_S, ModelLimiter
from workers import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

MODEL = "openai:m"
BUDGET = keys.model_budget_tokens(MODEL)


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = connect_async(db_url, "required")
    yield redis
    await redis.aclose()


def limiter(client: aioredis.Redis, **limit: float) -> ModelLimiter:
    return ModelLimiter(client, {MODEL: ModelLimit(**limit)})  # type: ignore[arg-type]


async def tokens_of(client: aioredis.Redis) -> dict[str, int]:
    return {k: int(v) for k, v in (await client.hgetall(BUDGET)).items()}


async def test_a_call_reserves_is_corrected_and_a_failed_one_refunded(client: aioredis.Redis) -> None:
    limits = limiter(client, tokens_per_minute=1000, requests_per_minute=10)
    first = await limits.admit(MODEL, 400, "t:0")
    second = await limits.admit(MODEL, 500, "t:1")
    assert isinstance(first, Granted) and isinstance(second, Granted)
    assert await tokens_of(client) == {"t:0": 400, "t:1": 500, "~sum": 900}
    # Over what is left: held by tokens, and nothing reserved.
    held = await limits.admit(MODEL, 200, "t:2")
    assert isinstance(held, Throttled) and held.limit == "tokens_per_minute" and 59 < held.wait_s <= 60
    await limits.settle(first, Settlement(answered_ago_s=0.0, used_tokens=150))
    assert await tokens_of(client) == {"t:0": 150, "t:1": 500, "~sum": 650}
    await limits.settle(second, Settlement(refund=True))
    assert await tokens_of(client) == {"t:0": 150, "~sum": 150}
    assert await client.zrange(keys.model_budget_calls(MODEL), 0, -1) == ["t:0"]
    # t:2 was told to wait, and is first in line; back, it finds room.
    assert isinstance(await limits.admit(MODEL, 200, "t:2"), Granted)


async def test_requests_leave_the_window_and_waiters_get_slots_of_their_own(client: aioredis.Redis) -> None:
    limits = limiter(client, requests_per_minute=120, window_s=1)  # 2 per 1 s window
    assert isinstance(await limits.admit(MODEL, 0, "a"), Granted)
    await asyncio.sleep(0.2)
    assert isinstance(await limits.admit(MODEL, 0, "b"), Granted)
    waits = [await limits.admit(MODEL, 0, name) for name in ("c", "d", "e")]
    assert all(isinstance(w, Throttled) and w.limit == "requests_per_minute" for w in waits)
    c, d, e = (w.wait_s for w in waits if isinstance(w, Throttled))
    # c takes a's slot, d b's, e the next after them: three distinct times, in line.
    assert 0.6 < c < 1.0 and 0.1 < d - c < 0.4 and e > 1.0
    # A newcomer goes behind the line even when a slot has freed.
    await asyncio.sleep(c + 0.05)
    late = await limits.admit(MODEL, 0, "f")
    assert isinstance(late, Throttled)
    assert isinstance(await limits.admit(MODEL, 0, "c"), Granted)


async def test_a_pause_holds_every_call_until_it_is_over(client: aioredis.Redis) -> None:
    limits, other = limiter(client, requests_per_minute=1000), ModelLimiter(client, {})
    granted = await limits.admit(MODEL, 0, "t:0")
    assert isinstance(granted, Granted)
    await limits.settle(granted, Settlement(refund=True, pause_s=0.5))
    # Another orchestrator, with no limits of its own, meets it too.
    held = await other.admit(MODEL, 0, "u:0")
    assert isinstance(held, Throttled) and held.limit == "provider" and 0.3 < held.wait_s < 1.0
    # A shorter pause never shortens a longer one.
    await other.settle(Granted(MODEL, "u:0"), Settlement(pause_s=0.1))
    assert await client.pttl(keys.model_pause(MODEL)) > 200
    await asyncio.sleep(0.6)
    assert isinstance(await other.admit(MODEL, 0, "u:0"), Granted)


async def test_a_model_seen_unpaused_costs_no_read_per_call_and_a_pause_still_holds(
    client: aioredis.Redis,
) -> None:
    # Without a budget, a call only checks its model's pause: seen clear, it is trusted for PAUSE_SEEN_S.
    one, other = ModelLimiter(client, {}), ModelLimiter(client, {})
    before = await script_calls(client)
    for n in range(5):
        assert isinstance(await one.admit(MODEL, 0, f"t:{n}"), Granted)
    assert await script_calls(client) - before == 1
    # A pause the other orchestrator meets holds its own next call at once, and this one's within the moment.
    await other.settle(Granted(MODEL, "u:0"), Settlement(pause_s=5.0))
    held = await other.admit(MODEL, 0, "u:1")
    assert isinstance(held, Throttled) and held.limit == "provider"
    await asyncio.sleep(PAUSE_SEEN_S)
    held = await one.admit(MODEL, 0, "t:5")
    assert isinstance(held, Throttled) and held.limit == "provider"


async def script_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) + int(
        stats.get("cmdstat_eval", {}).get("calls", 0)
    )


async def test_a_call_is_counted_from_when_its_answer_began(client: aioredis.Redis) -> None:
    limits = limiter(client, requests_per_minute=60)
    granted = await limits.admit(MODEL, 0, "t:0")
    assert isinstance(granted, Granted)
    calls = keys.model_budget_calls(MODEL)
    [(_, admitted)] = await client.zrange(calls, 0, -1, withscores=True)
    await asyncio.sleep(0.3)
    await limits.settle(granted, Settlement(answered_ago_s=0.1))
    [(_, counted)] = await client.zrange(calls, 0, -1, withscores=True)
    assert 150 < counted - admitted < 300


async def test_a_redis_that_does_not_answer_holds_no_call() -> None:
    broken = connect_async("redis://127.0.0.1:1/0", "required")
    try:
        granted = await limiter(broken, requests_per_minute=1).admit(MODEL, 0, "t:0")
        assert granted == Granted(MODEL, "t:0")
    finally:
        await broken.aclose()
