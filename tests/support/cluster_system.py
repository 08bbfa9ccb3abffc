"""Toolloop's processes on a real Redis Cluster, as a user runs them (`TOOLLOOP_REDIS_CLUSTER=true`,
`TOOLLOOP_REDIS_URL` naming one node, `TOOLLOOP_BROKER_URL` a Redis of its own), for the cluster's e2e tests.

    with RedisCluster() as cluster, cluster_system(cluster, monkeypatch) as system:
        system.start_worker(); system.start_orchestrator()
        ids = system.submit(turns=12, calls=3, rounds=2)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest
import redis

from ops.redis_cluster import RedisCluster
from orchestrator import Client
from orchestrator.redis_server import RedisServer
from tests.faults.env import MARK_VAR, PLAN_MODEL, call, find_marked_pids, is_running
from tests.faults.sentinel_tools import STARTS
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.served import Served
from tests.support.waiting import wait_until
from workers import keys
from workers.connect import connect_redis

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
        self.services: list[Served] = []  # `toolloop api` and `toolloop beat` processes

    def start_worker(self, modules: Sequence[str] = ("tests.faults.sentinel_tools",)) -> WorkerHandle:
        """A worker of `modules` (the fault tools); returns once its catalogue entry is in the cluster."""
        worker = start_worker(self.cluster.url, list(modules), concurrency=3, env=self.env, wait=False)
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

    def submit(
        self, turns: int, calls: int, rounds: int, seconds: float = 0.2, tenant: str | None = None
    ) -> list[str]:
        """`turns` turns of `rounds` rounds of `calls` parallel calls each (of `tenant`)."""
        ids = []
        for _ in range(turns):
            # Every call its own: the same call a third time would stop the turn (the repeat guard).
            plan = [{"calls": [work_call(seconds) for _ in range(calls)]} for _ in range(rounds)]
            ids.append(
                self.client.submit(
                    prompt=json.dumps({"plan": plan}),
                    tools=["sentinel_work"],
                    model=PLAN_MODEL,
                    limits={"deadline_s": 240},
                    tenant=tenant,
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
        return "\n".join(logs + [a.log_text() for a in self.services])

    def close(self) -> None:
        """Stop every process and the clients; kill anything still carrying the marker."""
        for service in self.services:
            service.stop_with(signal.SIGTERM, 10)
        for orchestrator in self.orchestrators:
            orchestrator.stop()
        for worker in self.workers:
            worker.stop()
        self.client.close()
        self.redis.close()
        for pid in find_marked_pids(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def work_call(seconds: float) -> dict[str, object]:
    """A call of `sentinel_work` of its own (the same call thrice would stop a turn: the repeat guard)."""
    return call("sentinel_work", tag=uuid.uuid4().hex[:12], seconds=seconds)


@contextlib.contextmanager
def cluster_system(cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterSystem]:
    """A `ClusterSystem` on `cluster` with a broker of its own; the test's process names keys as its
    processes do while it runs."""
    broker = RedisServer()
    broker.start()
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
