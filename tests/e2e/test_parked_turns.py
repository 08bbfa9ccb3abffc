"""Turns that wait for a person cost nothing while they wait (docs/design/orchestrators.md, "Parked turns").

A real `toolloop orchestrator`, a prefork worker serving `e2e_transfer` (a tool that requires confirmation),
the scripted model over HTTP. Many turns wait for approval at once: the orchestrator's memory grows no more
than for as many turns that finished, no lease is held for them, and after every orchestrator was killed and
one started again an approval still completes its turn within seconds. 100 turns in `make test`, 1,000 in
`make test-faults`; the figures are printed (`-s`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import WorkerHandle
from tests.support.turns import wait_outcome
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WARM_UP = 30  # turns of each kind before measuring: imports, caches and pools are paid then
MIB = 1024 * 1024
# What RSS moves by on its own between two readings of an idle process (allocator arenas, GC timing).
SLACK_BYTES = 2 * MIB
BURSTS = 3  # of waiting turns, each measured


@pytest.fixture
def start(
    module_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[Callable[[], OrchestratorHandle]]:
    """Starts an orchestrator on the module's Redis; each is stopped at the end."""
    started: list[OrchestratorHandle] = []

    def start_one() -> OrchestratorHandle:
        started.append(start_orchestrator(module_redis.url, model_base_url=model_server.base_url))
        return started[-1]

    yield start_one
    for handle in started:
        if handle.process.poll() is None:
            handle.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def settled_rss(pid: int) -> int:
    # Read once the process is idle: the lowest of a few readings a moment apart.
    readings = []
    for _ in range(5):
        time.sleep(0.4)
        readings.append(rss_bytes(pid))
    return min(readings)


def submit_waiting(client: Client, count: int) -> list[str]:
    calls = [{"name": "e2e_transfer", "arguments": {"amount": 1, "to": f"p-{uuid.uuid4().hex[:8]}"}}]
    return [
        client.submit(prompt=plan_prompt([{"calls": calls}]), model="scripted:plan") for _ in range(count)
    ]


def submit_finished(client: Client, count: int) -> list[str]:
    return [
        client.submit(prompt=plan_prompt([{"text": "done"}]), model="scripted:plan") for _ in range(count)
    ]


def wait_parked(r: redis.Redis, turn_ids: list[str], timeout_s: float) -> None:
    def parked() -> bool:
        pipe = r.pipeline()
        for turn_id in turn_ids:
            pipe.zscore(keys.TURNS_PARKED, turn_id)
        return all(score is not None for score in pipe.execute())

    wait_until(parked, f"{len(turn_ids)} turns parked", timeout_s)


def wait_finished(client: Client, turn_ids: list[str], timeout_s: float) -> None:
    def finished() -> bool:
        pipe = client.redis.pipeline()
        for turn_id in turn_ids:
            pipe.get(keys.turn_status(turn_id))
        return all(s in (b"completed", "completed") for s in pipe.execute())

    wait_until(finished, f"{len(turn_ids)} turns finished", timeout_s)


@pytest.mark.parametrize("count", [100, pytest.param(1000, marks=pytest.mark.faults)])
def test_waiting_turns_hold_no_lease_nor_memory_and_an_approval_wakes_them(
    count: int, start: Callable[[], OrchestratorHandle], client: Client, module_redis_client: redis.Redis
) -> None:
    timeout_s = 30 + count * 0.2
    first = start()
    # As many waiting turns as are measured, first: a burst of claims holds that many turns at once before
    # they park, and the heap keeps its high-water mark (on a loaded machine, megabytes for a thousand). A
    # second burst reuses it; only memory kept per waiting turn would grow the process again.
    wait_parked(module_redis_client, submit_waiting(client, max(WARM_UP, count)), timeout_s)
    wait_finished(client, submit_finished(client, WARM_UP), timeout_s)
    # Several bursts, each measured: memory kept per waiting turn grows the process in every one of them,
    # while a burst whose turns were in flight together more than before (a loaded machine's timing) only
    # raises the heap's high-water mark once. The smallest growth is the one that tells.
    waiting: list[str] = []
    grown_waiting = []
    for _ in range(BURSTS):
        before = settled_rss(first.pid)
        burst = submit_waiting(client, count)
        wait_parked(module_redis_client, burst, timeout_s)
        grown_waiting.append(settled_rss(first.pid) - before)
        waiting += burst
    before = settled_rss(first.pid)
    wait_finished(client, submit_finished(client, count), timeout_s)
    grown_finished = settled_rss(first.pid) - before
    print(
        f"\norchestrator RSS {before / MIB:.1f} MiB; "
        f"+{' / +'.join(f'{g / MIB:.2f}' for g in grown_waiting)} MiB for each burst of {count} turns "
        f"waiting for approval, +{grown_finished / MIB:.2f} MiB for {count} finished turns"
    )
    assert min(grown_waiting) <= grown_finished + SLACK_BYTES
    # No lease is held for a waiting turn: none is in any orchestrator.
    pipe = module_redis_client.pipeline()
    for turn_id in waiting:
        pipe.exists(keys.turn_lease(turn_id))
    assert sum(pipe.execute()) == 0
    # Every orchestrator killed, one started again: an approval still completes its turn within seconds.
    first.kill()
    start()
    started = time.monotonic()
    assert client.approve(waiting[0], "call_r0_0", True, decided_by="ops")
    outcome = wait_outcome(client, waiting[0], timeout_s=10)
    took_s = time.monotonic() - started
    print(f"approved after a restart: completed in {took_s:.2f} s")
    assert outcome.status == "completed" and took_s < 5
    assert outcome.approvals[0].decided_by == "ops"
