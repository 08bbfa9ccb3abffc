"""Hundreds of SSE streams, and Redis restarted under them, against the whole system (issue 12: item 6 and the
SSE part of item 2): `toolloop api`, `toolloop worker` and `toolloop orchestrator`, each a process, on a Redis
with an append-only file (`FaultEnv`).

- At once: every stream is opened before any turn runs (no orchestrator yet), so all are open together; then
  the turns run. Every stream ends with every event of its turn, `/healthz` (polled all along) answers 200
  throughout, a `POST /v1/turns` is served while they are open, and the API holds a bounded number of
  Redis connections (CLIENT LIST; the figure is printed).
- Restarts: Redis is stopped (SIGTERM, its AOF flushed) and started again on the same port, for 2 s each
  time, while the streams are open. No stream fails, each gets every event of its turn once, in order, and
  `/healthz` says 503 while Redis is away and 200 once it is back.

Quick variants run in `make test`; long ones are marked `faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial

import httpx
import pytest

from orchestrator.api.connections import CLIENT_NAME
from orchestrator.api.fanout import parse_stream_id
from tests.faults.env import PLAN_MODEL, FaultEnv, call, check_turn, is_running
from tests.support.served import Served
from tests.support.sse import SseStream, read_sse
from tests.support.turns import event_ids
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.e2e]

OUTAGE_S = 2.0
POOL = 10  # TOOLLOOP_API_REDIS_MAX_CONNECTIONS of the API under test


@dataclass(frozen=True)
class Size:
    streams: int
    restarts: int
    rounds: int
    seconds: float
    workers: int
    timeout_s: float


QUICK_AT_ONCE = Size(streams=120, restarts=0, rounds=1, seconds=0.05, workers=1, timeout_s=90)
LONG_AT_ONCE = Size(streams=200, restarts=0, rounds=2, seconds=0.2, workers=2, timeout_s=300)
QUICK_RESTARTS = Size(streams=50, restarts=1, rounds=2, seconds=0.4, workers=1, timeout_s=90)
LONG_RESTARTS = Size(streams=200, restarts=5, rounds=3, seconds=0.5, workers=2, timeout_s=400)


@dataclass
class Health:
    """Every `/healthz` status seen by a poller, in order."""

    statuses: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def poll_health(base_url: str) -> AsyncIterator[Health]:
    """Poll `/healthz` every 0.1 s, on a client of its own, for as long as the block runs."""
    health = Health()

    async def poll() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            while True:
                try:
                    health.statuses.append((await http.get("/healthz")).status_code)
                except httpx.HTTPError as exc:
                    health.errors.append(repr(exc))
                await asyncio.sleep(0.1)

    task = asyncio.create_task(poll())
    try:
        yield health
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def start_api(env: FaultEnv) -> tuple[Served, str]:
    """`toolloop api` on the environment's Redis, with a small Redis pool and a keep-alive every second."""
    return env.start_api(
        {"TOOLLOOP_API_REDIS_MAX_CONNECTIONS": str(POOL), "TOOLLOOP_API_SSE_KEEPALIVE_S": "1"}
    )


def stop_api(served: Served) -> str:
    """SIGTERM the API (then its group, whatever is left); its log."""
    served.stop_with(signal.SIGTERM, within_s=10)
    served.kill()
    return served.log_text()


def open_http(base_url: str) -> httpx.AsyncClient:
    # httpx pools 100 connections by default; these tests hold one per stream.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60)


async def submit(http: httpx.AsyncClient, size: Size, tag: str) -> str:
    plan = {"plan": [{"calls": [call("fault_work", tag=tag, seconds=size.seconds)]}] * size.rounds}
    body = {
        "prompt": json.dumps(plan),
        "tools": ["fault_work"],
        "model": PLAN_MODEL,
        "limits": {"deadline_s": size.timeout_s},
    }
    reply = await http.post("/v1/turns", json=body)
    assert reply.status_code == 202, reply.text
    turn_id: str = reply.json()["id"]
    return turn_id


def api_connections(env: FaultEnv) -> list[str]:
    """The names of the Redis connections the API holds (CLIENT LIST)."""
    return [c["name"] for c in env.redis.client_list() if c["name"].startswith(CLIENT_NAME)]


def check_stream(env: FaultEnv, turn_id: str, stream: SseStream) -> None:
    """Every event of the turn, each once, in order, ending with turn_finished; the turn itself sound."""
    assert stream.status == 200, stream.body
    stored = event_ids(env.redis, turn_id)
    assert stream.ids == stored, f"{turn_id}: sent {stream.names}"
    ordered = [parse_stream_id(i) for i in stream.ids]
    assert ordered == sorted(set(ordered))
    assert stream.names[-1] == "turn_finished" and stream.names.count("turn_finished") == 1
    check_turn(env.client.wait(turn_id, 60))


def _first(first: Callable[[str], None], turn_id: str, _message: object) -> None:
    first(turn_id)


async def follow_all(
    http: httpx.AsyncClient, turn_ids: list[str]
) -> tuple[list[asyncio.Task[SseStream]], asyncio.Event]:
    """One stream per turn, as tasks; the event is set once every stream got its first message."""
    started: set[str] = set()
    all_started = asyncio.Event()

    def first(turn_id: str) -> None:
        started.add(turn_id)
        if len(started) == len(turn_ids):
            all_started.set()

    tasks = [
        asyncio.create_task(read_sse(http, f"/v1/turns/{t}/events", on_message=partial(_first, first, t)))
        for t in turn_ids
    ]
    return tasks, all_started


async def run_at_once(size: Size) -> None:
    with FaultEnv() as env:
        for _ in range(size.workers):
            env.start_worker(concurrency=4)
        served, base_url = start_api(env)
        try:
            async with open_http(base_url) as http, poll_health(base_url) as health:
                turn_ids = [await submit(http, size, f"at-once-{n}") for n in range(size.streams)]
                tasks, all_started = await follow_all(http, turn_ids)
                await asyncio.wait_for(all_started.wait(), 60)
                # Every stream open, no turn running yet: what the API holds, and a request served.
                held = api_connections(env)
                print(f"\nAPI Redis connections with {size.streams} SSE streams open: {len(held)} {held}")
                assert held.count(f"{CLIENT_NAME}-events") == 1 and len(held) <= POOL + 2, held
                turn_ids.append(await submit(http, size, "while-open"))
                tasks += (await follow_all(http, turn_ids[-1:]))[0]
                await asyncio.to_thread(env.start_orchestrator)
                streams = await asyncio.wait_for(asyncio.gather(*tasks), size.timeout_s)
            assert health.errors == [] and health.statuses, health.errors
            assert set(health.statuses) == {200}, health.statuses
            for turn_id, stream in zip(turn_ids, streams, strict=True):
                check_stream(env, turn_id, stream)
        finally:
            log = stop_api(served)
        assert "Traceback" not in log, log


async def run_restarts(size: Size) -> None:
    with FaultEnv() as env:
        for _ in range(size.workers):
            env.start_worker(concurrency=4)
        env.start_orchestrator()
        served, base_url = start_api(env)
        try:
            async with open_http(base_url) as http, poll_health(base_url) as health:
                turn_ids = [await submit(http, size, f"restarts-{n}") for n in range(size.streams)]
                tasks, all_started = await follow_all(http, turn_ids)
                await asyncio.wait_for(all_started.wait(), 60)  # restarted mid-stream, not mid-opening
                tags = [f"restarts-{n}" for n in range(size.streams)]
                started = 0
                for _ in range(size.restarts):
                    # Mid-turn: tools have run since the last restart.
                    started = await asyncio.to_thread(env.wait_new_start, tags, started)
                    assert not all(t.done() for t in tasks), "every stream ended before the restart"
                    await asyncio.to_thread(env.server.stop, keep_data=True)
                    await asyncio.sleep(OUTAGE_S)  # the fault itself: how long Redis stays away
                    await asyncio.to_thread(env.server.start)
                streams = await asyncio.wait_for(asyncio.gather(*tasks), size.timeout_s)
                await async_wait_until(
                    lambda: health.statuses[-1:] == [200], "/healthz to say 200 once Redis is back"
                )
            for turn_id, stream in zip(turn_ids, streams, strict=True):
                check_stream(env, turn_id, stream)
            assert 503 in health.statuses, "healthz never said Redis was away"
            assert is_running(served), "the API must outlive the restarts"
        finally:
            log = stop_api(served)
        assert "Traceback" not in log, log


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(QUICK_AT_ONCE, id="quick", marks=pytest.mark.timeout(120)),
        pytest.param(LONG_AT_ONCE, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(600)]),
    ],
)
def test_streams_at_once_all_finish_and_healthz_stays_200(size: Size) -> None:
    asyncio.run(run_at_once(size))


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(QUICK_RESTARTS, id="quick", marks=pytest.mark.timeout(120)),
        pytest.param(LONG_RESTARTS, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(900)]),
    ],
)
def test_streams_ride_out_redis_restarts_without_losing_or_repeating_an_event(size: Size) -> None:
    asyncio.run(run_restarts(size))
