"""What runs on a Redis Cluster beyond a burst: turns that wait for a person (parked in their shard, listed by
`toolloop pending`, woken by an answer, after their orchestrator died too), a tenant's `max_running_turns`
held across orchestrators, an agent's child turn whose call waits for a person on its parent, a fork, a
schedule's runs from `toolloop beat`, and a model's rate limit pacing two orchestrators.

The processes as a user runs them on a three-master cluster (`tests.support.cluster_system`), the scripted
`plan` model over HTTP, the fault tools and the e2e tools on one prefork worker.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ops.redis_cluster import RedisCluster
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.store import flows
from orchestrator.store.runner import SyncRunner
from orchestrator.store.turn_view import PendingApproval
from tests.faults.env import PLAN_MODEL, wait_checked
from tests.support.cluster_system import ClusterSystem, cluster_system, work_call
from tests.support.plans import plan_prompt
from tests.support.served import start_toolloop
from tests.support.turns import event_data
from workers import AgentSpec, keys
from workers.contract import DEFAULT_TENANT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOOL_MODULES = ("tests.faults.sentinel_tools", "tests.support.e2e_tools")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture
def system(cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterSystem]:
    with cluster_system(cluster, monkeypatch) as running:
        yield running


def _transfer(system: ClusterSystem, tenant: str | None = None) -> str:
    calls = [{"name": "e2e_transfer", "arguments": {"amount": 1, "to": f"p-{uuid.uuid4().hex[:8]}"}}]
    prompt = plan_prompt([{"calls": calls}, {"text": "sent"}])
    return system.client.submit(prompt=prompt, model=PLAN_MODEL, tenant=tenant)


def _pending(system: ClusterSystem) -> list[tuple[str, PendingApproval]]:
    return SyncRunner(system.redis).run_flow(flows.list_pending())


def _completed(outcomes: list[TurnOutcome]) -> None:
    unfinished = [(o.turn_id, o.status, o.stop_reason) for o in outcomes if o.status != "completed"]
    assert unfinished == [], unfinished


def test_turns_waiting_for_a_person_park_in_their_shard_and_answers_wake_them(system: ClusterSystem) -> None:
    system.start_worker(TOOL_MODULES)
    first = system.start_orchestrator()
    tenants = [None, None, "acme", "globex"]
    ids = [_transfer(system, tenant) for tenant in tenants]
    shards = [keys.queue_shard(t, tenant or DEFAULT_TENANT) for t, tenant in zip(ids, tenants, strict=True)]

    def parked() -> bool:
        return all(system.redis.zscore(s.parked, t) is not None for t, s in zip(ids, shards, strict=True))

    system.wait_for("every turn parked in its shard", parked)
    assert sum(system.redis.exists(keys.turn_lease(t)) for t in ids) == 0
    pending = dict(_pending(system))
    assert set(pending) == set(ids)
    assert system.client.approve(ids[0], pending[ids[0]].call_id, True, decided_by="ops")
    assert system.client.wait(ids[0], timeout=60).status == "completed"
    # Every orchestrator gone: the answers still wake the turns, for the next one to run.
    first.kill()
    system.start_orchestrator()
    for turn_id in ids[1:]:
        assert system.client.approve(turn_id, pending[turn_id].call_id, turn_id != ids[1], decided_by="ops")
    outcomes = [system.client.wait(turn_id, timeout=60) for turn_id in ids]
    denied = outcomes.pop(1)
    _completed(outcomes)
    assert (denied.status, denied.stop_reason) == ("stopped", "confirmation_denied")
    assert [a.approved for a in denied.approvals] == [False]
    outcomes.append(denied)
    assert [a.decided_by for o in outcomes for a in o.approvals] == ["ops"] * len(ids)
    assert _pending(system) == []
    # Each turn's end leaves its shard just after its outcome is written.
    system.wait_for(
        "the shards left clean",
        lambda: not any(system.redis.zcard(s.parked) or system.redis.zcard(s.active) for s in shards),
    )


def test_a_tenants_running_cap_holds_across_orchestrators(system: ClusterSystem) -> None:
    system.env["TOOLLOOP_TENANT_LIMITS"] = json.dumps({"acme": {"max_running_turns": 2}})
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    acme = system.submit(turns=8, calls=1, rounds=2, seconds=0.3, tenant="acme")
    others = system.submit(turns=6, calls=1, rounds=2, seconds=0.3)
    peak = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        statuses = [system.redis.get(keys.turn_status(t)) for t in acme]
        peak = max(peak, sum(s in (b"running", "running") for s in statuses))
        if all(s in (b"completed", "completed") for s in statuses):
            break
        time.sleep(0.05)
    _completed(wait_checked(system.client, acme + others, 120))
    assert peak == 2, peak  # held to its cap, and the cap reached: every one of its turns in one shard


def test_a_childs_call_waiting_for_a_person_is_approved_through_its_parent(system: ClusterSystem) -> None:
    system.start_worker(TOOL_MODULES)
    system.start_orchestrator()
    teller, boss = f"teller-{uuid.uuid4().hex[:6]}", f"boss-{uuid.uuid4().hex[:6]}"
    system.client.register_agent(AgentSpec(name=teller, model=PLAN_MODEL, tools=["e2e_transfer"]))
    system.client.register_agent(AgentSpec(name=boss, model=PLAN_MODEL, tools=[teller]))
    transfer: list[dict[str, Any]] = [
        {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 5, "to": "ann"}}]},
        {"text": "sent"},
    ]
    rounds: list[dict[str, Any]] = [
        {"calls": [{"name": teller, "arguments": {"prompt": plan_prompt(transfer)}}]},
        {"text": "done"},
    ]
    turn_id = system.client.submit(prompt=plan_prompt(rounds), agent=boss, tenant="acme")
    system.wait_for(
        "the child's wait shown on its parent",
        lambda: event_data(system.redis, turn_id, "child_call_waiting"),
    )
    (shown,) = event_data(system.redis, turn_id, "child_call_waiting")
    assert system.client.approve(turn_id, shown["call_id"], approved=True, decided_by="ops")
    outcome = system.client.wait(turn_id, timeout=60)
    assert outcome.status == "completed", outcome
    child = system.client.outcome(shown["child_turn_id"])
    assert child is not None and [a.decided_by for a in child.approvals] == ["ops"]
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.content == "sent"


def test_a_fork_runs_on_from_an_edited_result(system: ClusterSystem) -> None:
    system.start_worker(TOOL_MODULES)
    system.start_orchestrator()
    prompt = plan_prompt([{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}])
    original = system.client.submit(prompt=prompt, tools=["e2e_add"], model=PLAN_MODEL)
    outcome = system.client.wait(original, timeout=60)
    assert outcome.status == "completed" and "→ 5" in (outcome.text or "")
    result = outcome.messages[2]
    assert isinstance(result, ToolMessage)
    edited = {"role": "tool", "tool_call_id": result.tool_call_id, "name": result.name, "content": "42"}
    fork = system.client.fork(original, 2, replace=edited)
    forked = system.client.wait(fork, timeout=60)
    assert forked.status == "completed" and "→ 42" in (forked.text or ""), forked
    assert [(link.turn_id, link.at) for link in system.client.get(original).forks] == [(fork, 2)]


def test_a_schedule_runs_its_turns_from_a_beat_on_the_cluster(system: ClusterSystem) -> None:
    system.start_worker()
    system.start_orchestrator()
    prompt = plan_prompt([{"calls": [work_call(0.1)]}, {"text": "ran"}])
    system.client.schedule(
        "cluster-tick", every_s=1, prompt=prompt, tools=["sentinel_work"], model=PLAN_MODEL
    )
    beat = start_toolloop(["beat", "--id", "cluster-beat"], env=system.env)
    system.services.append(beat)  # stopped with the system
    try:
        system.wait_for("two runs of the schedule", lambda: len(_runs(system, "cluster-tick")) >= 2)
        runs = _runs(system, "cluster-tick")
    finally:
        assert system.client.unschedule("cluster-tick")
    _completed([system.client.wait(turn_id, timeout=60) for turn_id in runs])
    assert {system.client.get(turn_id).request.schedule for turn_id in runs} == {"cluster-tick"}


def _runs(system: ClusterSystem, name: str) -> list[str]:
    view = next((v for v in system.client.schedules() if v.schedule.name == name), None)
    return list(view.state.runs) if view is not None else []


def test_a_models_rate_limit_paces_the_fleet_on_the_cluster(system: ClusterSystem) -> None:
    # Two model calls a 2 s window for the whole fleet: 4 turns of 2 model calls each take three windows.
    limits = {"scripted": {"requests_per_minute": 60, "window_s": 2}}
    system.env["TOOLLOOP_MODEL_LIMITS"] = json.dumps(limits)
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    started = time.monotonic()
    ids = system.submit(turns=4, calls=1, rounds=1, seconds=0.05)
    _completed(wait_checked(system.client, ids, 120))
    assert time.monotonic() - started >= 5.0
