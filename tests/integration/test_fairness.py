"""Fair claiming on real processes: tenant A queues hundreds of turns, tenant B a few after it; B's turns
are claimed in turn with A's (`claim.lua`: round robin across tenants), so they end within seconds instead
of after A's backlog."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator import Client
from orchestrator.redis_server import RedisServer
from tests.support.e2e_processes import start_orchestrator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BACKLOG = 300
FEW = 3
PLAN = json.dumps({"plan": [{"text": "done"}]})


def test_one_tenants_backlog_does_not_hold_up_another_tenants_turns(own_redis: RedisServer) -> None:
    # Two orchestrators of 4 turns at once each: A's backlog takes a while to drain.
    env = {"TOOLLOOP_ORCHESTRATOR_MAX_TURNS": "4"}
    fleet = [start_orchestrator(own_redis.url, env=env) for _ in range(2)]
    client = Client(own_redis.url)
    try:
        started = time.monotonic()
        backlog = [
            client.submit(prompt=PLAN, model="scripted:plan", tenant="tenant-a") for _ in range(BACKLOG)
        ]
        submitted_b = time.monotonic()
        few = [client.submit(prompt=PLAN, model="scripted:plan", tenant="tenant-b") for _ in range(FEW)]
        for turn_id in few:
            assert client.wait(turn_id, 60).status == "completed"
        b_wait_s = time.monotonic() - submitted_b
        for turn_id in backlog:
            assert client.wait(turn_id, 120).status == "completed"
        a_drain_s = time.monotonic() - started
        print(
            f"\nB's {FEW} turns ended {b_wait_s:.2f} s after their submit; A's {BACKLOG} in {a_drain_s:.2f} s"
        )
        assert b_wait_s < 5.0
        assert b_wait_s < a_drain_s / 4
    finally:
        for handle in fleet:
            handle.stop()
        client.close()
