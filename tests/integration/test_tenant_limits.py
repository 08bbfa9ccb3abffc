"""Limits per tenant on real processes (TOOLLOOP_TENANT_LIMITS): two orchestrators and a worker.

- `max_running_turns=2`: never more than 2 of the tenant's turns running at once, all complete (the others
  stay queued, never refused), while another tenant's turns are not held;
- `tokens_per_day`: a tenant past its quota has its next turn ended `quota_exceeded`, naming it and the
  quota; another tenant's turns go on.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator import Client
from orchestrator.model import TurnStatus
from orchestrator.redis_server import RedisServer
from orchestrator.tenant_limits import build_quota_day
from tests.support.e2e_processes import start_orchestrator
from tests.support.processes import start_worker
from workers import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TURNS = 8


def sleep_plan(seconds: float) -> str:
    plan = {"plan": [{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": seconds}}]}, {"text": "done"}]}
    return json.dumps(plan)


def test_max_running_turns_holds_a_tenant_to_its_cap_and_every_turn_completes(own_redis: RedisServer) -> None:
    env = {"TOOLLOOP_TENANT_LIMITS": json.dumps({"capped": {"max_running_turns": 2}})}
    worker = start_worker(own_redis.url, ["tests.support.e2e_tools"], concurrency=6)
    fleet = [start_orchestrator(own_redis.url, env=env) for _ in range(2)]
    client = Client(own_redis.url)
    most = 0
    done = threading.Event()

    def watch(turn_ids: list[str]) -> None:
        nonlocal most
        while not done.is_set():
            statuses = client.redis.mget([keys.turn_status(t) for t in turn_ids])
            running = (TurnStatus.RUNNING.value, TurnStatus.WAITING.value)
            most = max(most, sum(s in running for s in statuses))
            time.sleep(0.02)

    try:
        capped = [
            client.submit(prompt=sleep_plan(0.5), model="scripted:plan", tools=["e2e_sleep"], tenant="capped")
            for _ in range(TURNS)
        ]
        others = [
            client.submit(prompt=sleep_plan(0.5), model="scripted:plan", tools=["e2e_sleep"], tenant="free")
            for _ in range(4)
        ]
        watcher = threading.Thread(target=watch, args=(capped,), daemon=True)
        watcher.start()
        started = time.monotonic()
        for turn_id in others:
            assert client.wait(turn_id, 60).status == "completed"
        others_s = time.monotonic() - started
        for turn_id in capped:
            assert client.wait(turn_id, 120).status == "completed"
        capped_s = time.monotonic() - started
        done.set()
        watcher.join()
        print(
            f"\nat most {most} of {TURNS} capped turns running; the free tenant's 4 ended "
            f"in {others_s:.1f} s, "
            f"the capped tenant's in {capped_s:.1f} s"
        )
        assert most == 2
        assert others_s < capped_s
        assert client.redis.scard(keys.tenant_running("capped")) == 0
    finally:
        done.set()
        for handle in fleet:
            handle.stop()
        worker.stop()
        client.close()


def test_a_tenant_past_its_tokens_per_day_has_its_next_turn_end_quota_exceeded(
    own_redis: RedisServer,
) -> None:
    limits = {"metered": {"tokens_per_day": 1000}}
    orchestrator = start_orchestrator(own_redis.url, env={"TOOLLOOP_TENANT_LIMITS": json.dumps(limits)})
    client = Client(own_redis.url)
    plan = json.dumps({"plan": [{"text": "done"}]})
    try:
        first = client.wait(client.submit(prompt=plan, model="scripted:plan", tenant="metered"), 60)
        assert first.status == "completed"
        used = int(client.redis.get(keys.tenant_tokens_day("metered", build_quota_day(time.time()))) or 0)
        assert used > 0  # the scripted model reports its usage, counted in the tenant's day
        client.redis.incrby(keys.tenant_tokens_day("metered", build_quota_day(time.time())), 1000)
        outcome = client.wait(client.submit(prompt=plan, model="scripted:plan", tenant="metered"), 60)
        assert (outcome.status, outcome.stop_reason) == ("stopped", "quota_exceeded")
        assert "'metered'" in (outcome.error or outcome.text or "") or "'metered'" in str(outcome)
        assert "tokens_per_day" in str(outcome)
        other = client.wait(client.submit(prompt=plan, model="scripted:plan", tenant="someone"), 60)
        assert other.status == "completed"
        print(f"\nquota_exceeded: {outcome.text!r}")
    finally:
        orchestrator.stop()
        client.close()
