"""A rolling deploy: workers with different tool sets on one Redis, and no call lost or left to its deadline.

Worker A serves `tests.support.tools`; workers B and D serve `tests.support.rolling_tools`, each narrowed
to one tool's queue (`--queues`). Turns run on `toolloop orchestrator` with the scripted model over HTTP
(`scripted:plan`, `FaultEnv`). A call that was dropped would be answered `deadline_exceeded` at its turn's
deadline: each turn's answers are checked for what they say, never for how soon they came.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from orchestrator import Client
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store.catalogue import LIVE_CATALOGUE_MAX_AGE_S, LiveCatalogue
from tests.faults.env import PLAN_MODEL, FaultEnv, call, check_turn
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_for
from workers import keys
from workers.app import create_app
from workers.contract import FailureKind, ToolSpec
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DEADLINE_S = 90.0
# How long after its last worker a tool is gone (TOOLLOOP_TOOL_GONE_AFTER_S), short here: a test waits it out.
GONE_AFTER_S = 1.0


class Fleet:
    """The environment, its workers by role, and the turn helpers of these tests."""

    def __init__(self, env: FaultEnv) -> None:
        self.env = env
        self.a = env.start_worker(modules=("tests.support.tools",))
        self.b = self.start("tool.shout")
        self.d = self.start("tool.ship_parcel")
        env.start_orchestrator(env={"TOOLLOOP_TOOL_GONE_AFTER_S": str(GONE_AFTER_S)})

    def start(self, queue: str) -> WorkerHandle:
        handle = start_worker(self.env.url, ["tests.support.rolling_tools"], queues=[queue], env=self.env.env)
        self.env.workers.append(handle)
        return handle

    def submit(self, *calls: dict[str, Any]) -> str:
        prompt = json.dumps({"plan": [{"calls": list(calls)}]})
        tools = sorted({c["name"] for c in calls})
        return self.env.client.submit(
            prompt=prompt, tools=tools, model=PLAN_MODEL, limits={"deadline_s": DEADLINE_S}
        )

    def wait(self, turn_id: str) -> TurnOutcome:
        outcome = self.env.client.wait(turn_id, DEADLINE_S + 60)
        check_turn(outcome)
        return outcome


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with FaultEnv() as env:
        yield Fleet(env)


def answers(outcome: TurnOutcome) -> dict[str, ToolMessage]:
    return {m.name: m for m in outcome.messages if isinstance(m, ToolMessage)}


def test_each_worker_consumes_exactly_the_queues_of_the_tools_it_serves(fleet: Fleet) -> None:
    app = create_app(WorkerSettings(redis_url=fleet.env.url))
    hosts = {fleet.a.hostname, fleet.b.hostname, fleet.d.hostname}

    def replies() -> dict[str, Any] | None:
        got = app.control.inspect(destination=sorted(hosts), timeout=2).active_queues() or {}
        return got if set(got) == hosts else None

    try:
        found = wait_for(replies, "every worker's queues (active_queues)")
    finally:
        app.close()
    consumed = {host: sorted(q["name"] for q in queues) for host, queues in found.items()}
    raw = fleet.env.redis.hget(keys.CATALOGUE, fleet.a.hostname)
    served_by_a = [spec["name"] for spec in json.loads(raw or "{}")["tools"]]
    assert "echo" in served_by_a
    assert consumed == {
        fleet.a.hostname: sorted(f"tool.{name}" for name in served_by_a),
        fleet.b.hostname: ["tool.shout"],
        fleet.d.hostname: ["tool.ship_parcel"],
    }


def test_turns_calling_tools_of_two_workers_all_finish_without_waiting_for_the_deadline(fleet: Fleet) -> None:
    turn_ids = [fleet.submit(call("echo", text=f"hi{i}"), call("shout", text=f"hey{i}")) for i in range(8)]
    outcomes = [fleet.wait(turn_id) for turn_id in turn_ids]
    for i, outcome in enumerate(outcomes):
        assert (outcome.status, outcome.stop_reason) == ("completed", None), outcome.stop_reason
        got = answers(outcome)
        assert (got["echo"].content, got["shout"].content) == (f"hi{i}", f"HEY{i}!"), outcome.messages
        assert not any(m.is_error for m in got.values())


def test_a_worker_answers_a_tool_it_does_not_serve_at_once(fleet: Fleet) -> None:
    # A worker of an older release still advertises `retired_tool` on a queue worker A consumes (tool.echo):
    # the orchestrator sends it there, and A, which has no such tool, must answer it, not drop it.
    retired = ToolSpec(name="retired_tool", queue="tool.echo", soft_time_limit_s=5, time_limit_s=10)
    entry = {"seen_at": time.time() + 30, "tools": [retired.model_dump(mode="json")]}
    fleet.env.redis.hset(keys.CATALOGUE, "old-release@host", json.dumps(entry))
    try:
        outcome = fleet.wait(fleet.submit(call("retired_tool")))
    finally:
        fleet.env.redis.hdel(keys.CATALOGUE, "old-release@host")
    answer = answers(outcome)["retired_tool"]
    assert answer.failure_kind is FailureKind.NOT_FOUND and not answer.synthetic
    assert "'retired_tool' is not served by worker" in answer.content
    assert fleet.a.hostname in answer.content and "tool.echo" in answer.content


def test_a_tool_whose_worker_is_gone_fails_at_dispatch_as_not_found(fleet: Fleet) -> None:
    # The turn is offered ship_parcel while D serves it, then waits for approval; D stops meanwhile.
    turn_id = fleet.submit(call("ship_parcel", parcel="p1"))
    events = fleet.env.client.events(turn_id)
    asked = next(e for e in events if e.name == "approval_requested")
    fleet.d.stop()
    try:
        assert fleet.env.redis.hget(keys.CATALOGUE, fleet.d.hostname) is None  # a clean stop removes it
        # Not a synchronisation: the dispatcher trusts a view of the catalogue this old by design, and a
        # tool is gone only that long after its last worker; no event marks either. Past both, the dispatch
        # must see that D is gone (within them, the call would wait in its queue for another worker).
        time.sleep(max(LIVE_CATALOGUE_MAX_AGE_S, GONE_AFTER_S) + 0.2)
        assert fleet.env.client.approve(turn_id, asked.data["call_ids"][0], True)
        outcome = fleet.wait(turn_id)
        answer = answers(outcome)["ship_parcel"]
        assert answer.failure_kind is FailureKind.NOT_FOUND and answer.synthetic
        assert "not served by any live worker" in answer.content
        # Direct calls read the same catalogue: the same verdict, before anything is sent.
        settings = Settings(redis_url=fleet.env.url, tool_gone_after_s=GONE_AFTER_S)
        with Client(fleet.env.url, settings=settings) as client:
            direct = client.call_tool("ship_parcel", {"parcel": "p2"}, timeout_s=30)
        assert direct.failure_kind is FailureKind.NOT_FOUND and direct.attempts == 0
    finally:
        fleet.d = fleet.start("tool.ship_parcel")  # the fleet whole again, for the tests after this one


async def test_a_burst_of_dispatch_reads_costs_one_hgetall() -> None:
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url)
        spec = ToolSpec(name=f"t{uuid.uuid4().hex[:6]}")
        await client.hset(
            keys.CATALOGUE, "w@h", json.dumps({"seen_at": time.time(), "tools": [spec.model_dump()]})
        )
        live = LiveCatalogue(client, max_age_s=0.3)
        try:
            await client.config_resetstat()
            views = await asyncio.gather(*(live.read() for _ in range(50)))
            assert all(view.live == {spec.name: spec} for view in views)
            # One read is one MULTI of two HGETALLs: the live entries and when each tool was last served.
            assert await hgetall_calls(client) == 2
            await asyncio.sleep(0.35)
            await live.read()
            assert await hgetall_calls(client) == 4
            # A reader that must not trust a view older than a moment (a turn's snapshot) gets a new read,
            # and readers asking for no more than that share it.
            turn_started_at = time.time()
            await asyncio.gather(*(live.read(newer_than=turn_started_at) for _ in range(10)))
            assert await hgetall_calls(client) == 6
        finally:
            await client.aclose()


async def hgetall_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))
