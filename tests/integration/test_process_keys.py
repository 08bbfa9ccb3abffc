"""Keys of a process outlive it by a bounded time (issue 30, item 6): an orchestrator's inbox and registry
entry, a worker's heartbeat. Real Redis; the orchestrator test runs `toolloop orchestrator` and SIGKILLs it.
"""

from __future__ import annotations

import time

import pytest
import redis

from orchestrator.store.turns import TurnStore
from tests.support.e2e_processes import start_orchestrator
from tests.support.waiting import wait_until
from workers import keys

pytestmark = pytest.mark.timeout(60)


async def test_keep_inbox_creates_an_empty_inbox_with_an_expiry_and_forgets_the_silent(
    store: TurnStore,
) -> None:
    await store.redis.zadd(keys.ORCHESTRATORS, {"gone": time.time() - 100, "alive": time.time()})
    assert await store.keep_inbox("o", 30.0) is True
    inbox = keys.inbox("o")
    assert await store.redis.xlen(inbox) == 0
    assert 29_000 < await store.redis.pttl(inbox) <= 30_000
    assert await store.redis.zrange(keys.ORCHESTRATORS, 0, -1) == ["alive"]
    # A notification (the workers' XADD) keeps the expiry; the next keep pushes it back, keeping entries.
    await store.redis.xadd(inbox, {"kind": "started", "turn": "t"})
    await store.redis.pexpire(inbox, 5_000)
    assert await store.keep_inbox("o", 30.0) is False
    assert await store.redis.xlen(inbox) == 1 and await store.redis.pttl(inbox) > 29_000


def test_a_dead_orchestrators_inbox_and_registry_entry_vanish(db_url: str) -> None:
    client = redis.Redis.from_url(db_url, decode_responses=True)
    lease_ttl_s = 1.0
    ttl_s = keys.build_inbox_ttl_s(lease_ttl_s)
    dead = start_orchestrator(db_url, env={"TOOLLOOP_LEASE_TTL_S": str(lease_ttl_s)})
    alive = start_orchestrator(db_url, env={"TOOLLOOP_LEASE_TTL_S": str(lease_ttl_s)})
    try:
        inbox = keys.inbox(dead.orchestrator_id)
        wait_until(lambda: client.exists(inbox), "the inbox opened at registration")
        assert 0 < client.pttl(inbox) <= ttl_s * 1000
        dead.kill()
        killed_at = time.monotonic()
        wait_until(lambda: not client.exists(inbox), "the dead orchestrator's inbox to expire", ttl_s + 5)
        assert time.monotonic() - killed_at <= ttl_s + 1
        # The live one keeps its own, and forgets the dead one in the registry.
        assert client.pttl(keys.inbox(alive.orchestrator_id)) > 0
        wait_until(
            lambda: client.zscore(keys.ORCHESTRATORS, dead.orchestrator_id) is None,
            "the dead orchestrator to leave the registry",
        )
        assert client.zscore(keys.ORCHESTRATORS, alive.orchestrator_id) is not None
    finally:
        dead.stop()
        alive.stop()
        client.close()
