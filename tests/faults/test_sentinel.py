"""Redis behind Sentinel (issue 12, item 3): the master fails over while turns run, and every turn completes.

A master, a replica and three sentinels (`tests.support.sentinel`, the one `redis-server` binary); a
`toolloop worker`, a `toolloop orchestrator` (its scripted model served over HTTP by a thread of the test)
and the test's `Client` all configured as users configure them: `TOOLLOOP_REDIS_URL` in Celery's Sentinel
form and `TOOLLOOP_REDIS_MASTER_NAME`. Once tools are running, the master is SIGKILLed
(the sentinels elect the replica) and, with work running again, failed over by SENTINEL FAILOVER (the old
master stays up until the sentinels demote it); the long variant does both twice, with more turns.
Afterwards every turn is completed, every tool call in every history answered exactly once, no process
died, and a fresh turn completes on the new master.

Turns are submitted only between failovers, once every sentinel names the new master: a failover loses
at most the writes of its last moments, which toolloop catches up on, so no turn may end otherwise. A turn
ends `failed` with `turn_lost` (toolloop's record of a turn Redis dropped) only when its submit itself is
lost: a submit made while a failover switches masters (docs/operations/sentinel.md says so; not what this
test submits), or a failover nobody asked for, sentinels misled by a stalled node promoting a replica not
yet in sync. The test counts the failovers, and names such a one rather than blame the turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import pytest
import redis

from orchestrator import Client
from orchestrator.model import ToolMessage
from tests.faults.env import MARK_VAR, PLAN_MODEL, call, find_marked_pids, is_running, wait_checked
from tests.faults.sentinel_tools import STARTS
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.sentinel import SentinelCluster
from tests.support.waiting import wait_until
from workers import keys
from workers.connect import MASTER_CHECK_S, MASTER_NAME_VARIABLE, connect_redis, connect_redis_async

pytestmark = [pytest.mark.e2e]


@dataclass(frozen=True)
class Size:
    turns: int
    calls: int
    rounds: int
    # Each entry fails the master over once: "failover" (SENTINEL FAILOVER) or "kill" (SIGKILL).
    how: tuple[str, ...]
    seconds: float
    timeout_s: float


QUICK = Size(turns=4, calls=2, rounds=2, how=("kill", "failover"), seconds=0.3, timeout_s=60)
LONG = Size(
    turns=20, calls=3, rounds=3, how=("failover", "kill", "failover", "kill"), seconds=0.5, timeout_s=300
)
SIZES = [
    pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(120)),
    pytest.param(LONG, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(600)]),
]


class SentinelSystem:
    """A worker, an orchestrator and a client on `cluster`, as a user runs them, and the orchestrator's
    model server (it outlives every failover); `close` leaves nothing."""

    def __init__(self, cluster: SentinelCluster, model: RecordingModelServer) -> None:
        self.cluster = cluster
        self.model = model
        self.mark = uuid.uuid4().hex
        self.env = {
            MARK_VAR: self.mark,
            MASTER_NAME_VARIABLE: cluster.master_name,
            "TOOLLOOP_LEASE_TTL_S": "3",
            "TOOLLOOP_LOST_CALL_GRACE_S": "2",
        }
        self.redis = connect_redis(cluster.url, master_name=cluster.master_name)
        self.client = Client(cluster.url)
        self.worker: WorkerHandle | None = None
        self.orchestrator: OrchestratorHandle | None = None

    def start(self) -> None:
        """Start the worker and the orchestrator; return once both are registered in Redis."""
        self.worker = start_worker(
            self.cluster.url, ["tests.faults.sentinel_tools"], concurrency=3, env=self.env, wait=False
        )
        worker = self.worker
        self.wait_for(
            "the worker's catalogue entry", lambda: self.redis.hget(keys.CATALOGUE, worker.hostname)
        )
        assert is_running(self.worker), self.worker.log_text()
        # Registration is read here, through the sentinels: the helper's own wait reads a plain Redis URL.
        self.orchestrator = orchestrator = start_orchestrator(
            self.cluster.url, model_base_url=self.model.base_url, env=self.env, wait=False
        )
        self.wait_for(
            "the orchestrator's registration",
            lambda: (
                is_running(orchestrator)
                and self.redis.zscore(keys.ORCHESTRATORS, orchestrator.orchestrator_id) is not None
            ),
        )

    def wait_for(self, what: str, ready: Callable[[], object]) -> None:
        """Block until `ready()` is true (Redis errors count as not yet); the logs if it never is."""

        def check() -> object:
            with contextlib.suppress(redis.RedisError):
                return ready()
            return False

        wait_until(check, what, detail=self.logs)

    def submit(self, size: Size) -> list[str]:
        """`size.turns` turns of `size.rounds` rounds of `size.calls` calls each, every call its own (the
        same call made a third time would stop the turn: the repeat guard)."""
        ids = []
        for _ in range(size.turns):
            plan = [
                {
                    "calls": [
                        call("sentinel_work", tag=_tag(), seconds=size.seconds) for _ in range(size.calls)
                    ]
                }
                for _ in range(size.rounds)
            ]
            prompt = {"plan": plan}
            ids.append(
                self.client.submit(
                    prompt=json.dumps(prompt),
                    tools=["sentinel_work"],
                    model=PLAN_MODEL,
                    limits={"deadline_s": size.timeout_s},
                )
            )
        return ids

    def starts(self) -> int:
        """How many tool runs have started (as far as the current master knows)."""
        return int(self.redis.get(STARTS) or 0)

    def started_since(self, before: int) -> bool:
        """Whether more than `before` tool runs have started."""
        return self.starts() > before

    def alive(self) -> bool:
        """Whether the worker and the orchestrator still run."""
        worker, orchestrator = self.worker, self.orchestrator
        return (
            worker is not None
            and is_running(worker)
            and orchestrator is not None
            and is_running(orchestrator)
        )

    def logs(self) -> str:
        """The worker's and the orchestrator's output so far."""
        return "\n".join(p.log_text() for p in (self.worker, self.orchestrator) if p is not None)

    def close(self) -> None:
        """Stop both processes and the clients; kill anything still carrying the marker."""
        if self.orchestrator is not None:
            self.orchestrator.stop()
        if self.worker is not None:
            self.worker.stop()
        self.client.close()
        self.redis.close()
        for pid in find_marked_pids(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _tag() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def system(monkeypatch: pytest.MonkeyPatch) -> Iterator[SentinelSystem]:
    with SentinelCluster() as cluster, RecordingModelServer() as model:
        # The test's own Client reads the master's name as every toolloop process does: from the environment.
        monkeypatch.setenv(MASTER_NAME_VARIABLE, cluster.master_name)
        monkeypatch.setenv("TOOLLOOP_REDIS_URL", cluster.url)
        running = SentinelSystem(cluster, model)
        try:
            running.start()
            yield running
        finally:
            running.close()


def _fail_over(cluster: SentinelCluster, how: str) -> float:
    started = time.monotonic()
    if how == "kill":
        cluster.kill_master()
    else:
        cluster.failover()
    return time.monotonic() - started


@pytest.mark.parametrize("size", SIZES)
def test_master_fails_over_mid_turn(system: SentinelSystem, size: Size) -> None:
    cluster = system.cluster
    ids = system.submit(size)
    for number, how in enumerate(size.how):
        before = system.starts()
        system.wait_for("tool runs under way", partial(system.started_since, before))
        took = _fail_over(cluster, how)
        print(f"{how}: the master is now on port {cluster.master().port}, {took:.1f} s after it began")
        if number < len(size.how) - 1:
            ids += system.submit(size)
    outcomes = wait_checked(system.client, ids, size.timeout_s)
    failovers = cluster.failovers()
    assert failovers == len(size.how), f"the sentinels failed over {failovers} times, {len(size.how)} asked"
    unfinished = [
        (
            o.status,
            o.stop_reason,
            [m.content for m in o.messages if isinstance(m, ToolMessage) and m.is_error],
        )
        for o in outcomes
        if o.status != "completed"
    ]
    assert unfinished == [], f"{len(unfinished)} of {len(outcomes)} turns not completed: {unfinished[:3]}"
    assert system.alive(), system.logs()
    # Still serving on the new master: a fresh turn completes.
    (fresh,) = wait_checked(system.client, system.submit(Size(1, 1, 1, (), 0.0, 60)), 60)
    assert fresh.status == "completed", fresh


@dataclass
class Writes:
    """What one client pushed during a failover: (when it sent it, the value) for each acknowledged push."""

    acked: list[tuple[float, str]] = field(default_factory=list)
    errors: int = 0


def _push_sync(url: str, name: str, stop: threading.Event, into: Writes) -> None:
    client = connect_redis(url, master_name=name, socket_timeout=2)
    try:
        for i in itertools.count():
            if stop.is_set():
                return
            sent = time.monotonic()
            try:
                client.rpush(PUSHED, f"sync:{i}")
                into.acked.append((sent, f"sync:{i}"))
            except redis.RedisError:
                into.errors += 1
            time.sleep(0.02)
    finally:
        client.close()


async def _push_async(url: str, name: str, stop: threading.Event, into: Writes) -> None:
    # Two writers and a blocking reader share the client's pool, as an orchestrator's tasks do: the reader's
    # connection is busy when the pool learns of the new master, and goes back to the pool after.
    client = connect_redis_async(url, master_name=name, socket_timeout=3)

    async def write(writer: int) -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            sent = time.monotonic()
            try:
                await client.rpush(PUSHED, f"async:{writer}:{i}")
                into.acked.append((sent, f"async:{writer}:{i}"))
            except redis.RedisError:
                into.errors += 1
            await asyncio.sleep(0.02)

    async def block() -> None:
        while not stop.is_set():
            with contextlib.suppress(redis.RedisError):
                await client.blpop([PUSHED + ":never"], timeout=1)

    try:
        await asyncio.gather(write(0), write(1), block())
    finally:
        await client.aclose()


PUSHED = "sentinel-test:pushed"


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_warm_clients_leave_the_old_master_once_the_sentinels_switch() -> None:
    # After SENTINEL FAILOVER the old master stays up and takes writes until the sentinels reconfigure it,
    # about ten seconds on, and then drops them. redis-py alone asks the sentinels only when it opens a
    # connection: its warm connections would write there all along. Ours ask again every MASTER_CHECK_S.
    with SentinelCluster() as cluster:
        stop = threading.Event()
        pushed = {"sync": Writes(), "async": Writes()}
        threads = [
            threading.Thread(
                target=_push_sync, args=(cluster.url, cluster.master_name, stop, pushed["sync"])
            ),
            threading.Thread(
                target=asyncio.run,
                args=(_push_async(cluster.url, cluster.master_name, stop, pushed["async"]),),
            ),
        ]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: all(w.acked for w in pushed.values()), "a first write of each client")
            old, new = cluster.begin_failover()
            wait_until(lambda: cluster.all_name(new.port), f"every sentinel naming port {new.port}")
            # What the old master took before the sentinels named another one is lost (Redis replicates
            # asynchronously); what a client sent once its pool could have asked again must not be.
            settled = time.monotonic() + MASTER_CHECK_S + 1.0
            cluster.wait_switched(old, new)
            wait_until(
                lambda: all(any(sent > settled for sent, _ in w.acked) for w in pushed.values()),
                "a write of each client sent once its pool asked the sentinels again",
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
        kept = set(cluster.master_client().lrange(PUSHED, 0, -1))
        for kind, writes in pushed.items():
            late_losses = [value for sent, value in writes.acked if sent > settled and value not in kept]
            assert late_losses == [], f"{kind}: {len(late_losses)} acknowledged writes lost after the switch"
            lost = sum(1 for _, value in writes.acked if value not in kept)
            print(f"{kind}: {len(writes.acked)} acked, {lost} lost before the switch, {writes.errors} errors")
