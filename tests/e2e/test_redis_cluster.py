"""Turns on a Redis Cluster: three masters, three replicas, the broker on a Redis of its own.

A `toolloop worker` and `toolloop orchestrator`s (their scripted model served over HTTP by a thread of the
test) and the test's `Client`, configured as a user configures them: `TOOLLOOP_REDIS_CLUSTER=true`,
`TOOLLOOP_REDIS_URL` naming one node, `TOOLLOOP_BROKER_URL` the broker. A burst of turns with parallel tool
calls completes with every call answered once; an orchestrator SIGKILLed mid-turn has its turns taken over;
the master of the turn queue's slot failed over to its replica mid-burst (CLUSTER FAILOVER, or a SIGKILL)
loses no turn; the API submits, streams (a reader per turn) and lists; a conversation is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
from redis.crc import key_slot

from orchestrator import Client
from orchestrator.model import TurnOutcome
from orchestrator.redis_server import RedisServer, find_free_port
from tests.faults.env import MARK_VAR, PLAN_MODEL, call, find_marked_pids, is_running, wait_checked
from tests.faults.sentinel_tools import STARTS
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.redis_cluster import RedisCluster
from tests.support.served import Served, answers, start_toolloop
from tests.support.sse import SseStream, read_sse
from tests.support.waiting import wait_until
from workers import keys
from workers.connect import connect_redis

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLUSTER_VARIABLE = keys.CLUSTER_VARIABLE


class ClusterSystem:
    """Workers, orchestrators and a client on `cluster`, as a user runs them; `close` leaves nothing."""

    def __init__(self, cluster: RedisCluster, broker: RedisServer, model: RecordingModelServer) -> None:
        self.cluster = cluster
        self.model = model
        self.mark = uuid.uuid4().hex
        self.env = {
            MARK_VAR: self.mark,
            CLUSTER_VARIABLE: "true",
            "TOOLLOOP_BROKER_URL": broker.url,
            "TOOLLOOP_LEASE_TTL_S": "3",
            "TOOLLOOP_LOST_CALL_GRACE_S": "2",
        }
        self.redis = connect_redis(cluster.url, cluster=True)
        self.client = Client(cluster.url)
        self.workers: list[WorkerHandle] = []
        self.orchestrators: list[OrchestratorHandle] = []
        self.apis: list[Served] = []

    def start_worker(self) -> WorkerHandle:
        """A worker of the fault tools; returns once its catalogue entry is in the cluster."""
        worker = start_worker(
            self.cluster.url, ["tests.faults.sentinel_tools"], concurrency=3, env=self.env, wait=False
        )
        self.workers.append(worker)
        self.wait_for(
            "the worker's catalogue entry", lambda: self.redis.hget(keys.CATALOGUE, worker.hostname)
        )
        return worker

    def start_orchestrator(self) -> OrchestratorHandle:
        """An orchestrator; returns once it is registered."""
        orchestrator = start_orchestrator(
            self.cluster.url, model_base_url=self.model.base_url, env=self.env, wait=False
        )
        self.orchestrators.append(orchestrator)
        self.wait_for(
            "the orchestrator's registration",
            lambda: (
                is_running(orchestrator)
                and self.redis.zscore(keys.ORCHESTRATORS, orchestrator.orchestrator_id) is not None
            ),
        )
        return orchestrator

    def wait_for(self, what: str, ready: Callable[[], object], timeout_s: float = 60.0) -> None:
        """Block until `ready()` is true (Redis errors count as not yet); the logs if it never is."""

        def check() -> object:
            with contextlib.suppress(redis.RedisError):
                return ready()
            return False

        wait_until(check, what, timeout_s=timeout_s, detail=self.logs)

    def submit(self, turns: int, calls: int, rounds: int, seconds: float = 0.2) -> list[str]:
        """`turns` turns of `rounds` rounds of `calls` parallel calls each."""
        ids = []
        for _ in range(turns):
            # Every call its own: the same call a third time would stop the turn (the repeat guard).
            plan = [{"calls": [_work(seconds) for _ in range(calls)]} for _ in range(rounds)]
            ids.append(
                self.client.submit(
                    prompt=json.dumps({"plan": plan}),
                    tools=["sentinel_work"],
                    model=PLAN_MODEL,
                    limits={"deadline_s": 240},
                )
            )
        return ids

    def starts(self) -> int:
        """How many tool runs have started."""
        with contextlib.suppress(redis.RedisError):
            return int(self.redis.get(STARTS) or 0)
        return 0

    def logs(self) -> str:
        """Every process's output so far."""
        logs = [w.log_text() for w in self.workers] + [o.log_text() for o in self.orchestrators]
        return "\n".join(logs + [a.log_text() for a in self.apis])

    def close(self) -> None:
        """Stop every process and the clients; kill anything still carrying the marker."""
        for api in self.apis:
            api.stop_with(signal.SIGTERM, 10)
        for orchestrator in self.orchestrators:
            orchestrator.stop()
        for worker in self.workers:
            worker.stop()
        self.client.close()
        self.redis.close()
        for pid in find_marked_pids(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _work(seconds: float) -> dict[str, object]:
    return call("sentinel_work", tag=uuid.uuid4().hex[:12], seconds=seconds)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture
def system(cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterSystem]:
    broker = RedisServer()
    broker.start()
    # The test's own Client names keys as every toolloop process on the cluster does.
    monkeypatch.setenv(CLUSTER_VARIABLE, "true")
    monkeypatch.setenv("TOOLLOOP_REDIS_URL", cluster.url)
    monkeypatch.setenv("TOOLLOOP_BROKER_URL", broker.url)
    keys.use_cluster_layout(True)
    try:
        with RecordingModelServer() as model:
            running = ClusterSystem(cluster, broker, model)
            try:
                yield running
            finally:
                running.close()
    finally:
        keys.use_cluster_layout(False)
        broker.stop()


def _completed(outcomes: list[TurnOutcome]) -> None:
    unfinished = [(o.turn_id, o.status, o.stop_reason) for o in outcomes if o.status != "completed"]
    assert unfinished == [], f"{len(unfinished)} of {len(outcomes)} turns not completed: {unfinished[:3]}"


def test_a_burst_of_parallel_calls_completes_each_call_answered_once(system: ClusterSystem) -> None:
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    ids = system.submit(turns=12, calls=3, rounds=2)
    outcomes = wait_checked(system.client, ids, 180)  # each call answered exactly once
    _completed(outcomes)
    # Every key of a turn is in one slot: the turn id is their hash tag.
    turn_keys = [keys.turn_state(ids[0]), keys.turn_events(ids[0]), keys.turn_outcome(ids[0])]
    assert len({key_slot(k.encode()) for k in turn_keys}) == 1
    # The queue's side was left clean: nothing active, claiming or homed.
    assert system.redis.zcard(keys.TURNS_ACTIVE) == 0
    assert system.redis.llen(keys.TURNS_CLAIMING) == 0
    assert system.redis.hlen(keys.TURNS_HOMES) == 0


def test_a_conversation_is_refused_with_a_clear_error(system: ClusterSystem) -> None:
    with pytest.raises(ValueError, match="conversation_id is not supported on a Redis Cluster"):
        system.client.submit(prompt="hi", model=PLAN_MODEL, conversation_id="c1")


def test_an_orchestrator_killed_mid_turn_is_taken_over(system: ClusterSystem) -> None:
    system.start_worker()
    first = system.start_orchestrator()
    ids = system.submit(turns=4, calls=2, rounds=3, seconds=0.5)
    before = system.starts()
    system.wait_for("tool runs under way", lambda: system.starts() > before + 2)
    first.kill()
    system.start_orchestrator()
    _completed(wait_checked(system.client, ids, 180))


def test_the_api_submits_streams_and_lists_turns_on_the_cluster(system: ClusterSystem) -> None:
    system.start_worker()
    system.start_orchestrator()
    port = find_free_port()
    api = start_toolloop(["api", "--host", "127.0.0.1", "--port", str(port)], env=system.env)
    system.apis.append(api)
    base_url = f"http://127.0.0.1:{port}"
    api.wait_for(lambda: answers(f"{base_url}/healthz"), "the API to answer /healthz", timeout_s=60)
    plan = {"plan": [{"calls": [_work(0.1), _work(0.1)]}]}
    body = {"prompt": json.dumps(plan), "tools": ["sentinel_work"], "model": PLAN_MODEL}

    async def run() -> tuple[str, SseStream]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            reply = await http.post("/v1/turns", json=body)
            assert reply.status_code in (200, 201, 202), reply.text + api.log_text()[-3000:]
            turn_id = reply.json()["id"]
            # Opened right after the submit: the stream's reader follows the turn's own slot.
            return turn_id, await read_sse(http, f"/v1/turns/{turn_id}/events")

    turn_id, stream = asyncio.run(run())
    assert stream.status == 200, stream.body
    names = stream.names
    assert names.count("tool_finished") == 2 and names[-1] == "turn_finished", names
    listed = httpx.get(f"{base_url}/v1/turns", timeout=30).json()
    assert turn_id in [t["turn_id"] for t in listed["turns"]], listed


@pytest.mark.parametrize("how", ["failover", "kill"])
def test_a_master_failed_over_mid_burst_loses_no_turn(
    system: ClusterSystem, cluster: RedisCluster, how: str
) -> None:
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    ids = system.submit(turns=10, calls=2, rounds=3, seconds=0.3)
    before = system.starts()
    system.wait_for("tool runs under way", lambda: system.starts() > before + 4)
    # The master of the queue's slot: every claim, submit and end goes through it.
    master = cluster.master_of(keys.TURNS_ACTIVE)
    if how == "failover":
        cluster.failover(master)
    else:
        cluster.kill_master(master)
    ids += system.submit(turns=4, calls=2, rounds=2, seconds=0.2)
    _completed(wait_checked(system.client, ids, 240))
    alive = [is_running(w) for w in system.workers] + [is_running(o) for o in system.orchestrators]
    assert all(alive), system.logs()
