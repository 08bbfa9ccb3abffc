"""Hundreds of SSE streams, and Redis restarted under them, against the whole system (issue 12: item 6 and the
SSE part of item 2): a real `toolloop api` (uvicorn), a prefork worker and an orchestrator, each a process,
on a Redis with an append-only file.

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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from ops.bench.instant import INSTANT_MODEL
from ops.redis_server import find_free_port
from orchestrator.api_fanout import parse_stream_id
from orchestrator.api_redis import CLIENT_NAME
from tests.faults.env import MARK_VAR, FaultEnv, call, check_turn
from tests.support.served import Served, start_toolloop
from tests.support.sse import SseStream, read_sse
from workers import keys

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
    """`toolloop api` on the environment's Redis, marked as one of its processes; its URL once healthy."""
    port = find_free_port()
    extra = {
        "TOOLLOOP_REDIS_URL": env.url,
        "TOOLLOOP_API_REDIS_MAX_CONNECTIONS": str(POOL),
        "TOOLLOOP_API_SSE_KEEPALIVE_S": "1",
        MARK_VAR: env.mark,
    }
    served = start_toolloop(["api", "--host", "127.0.0.1", "--port", str(port)], env=extra)
    base_url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
        return False

    served.wait_for(healthy, "the API to answer /healthz")
    return served, base_url


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
    body = {"prompt": json.dumps(plan), "tools": ["fault_work"], "model": INSTANT_MODEL}
    body["limits"] = {"deadline_s": size.timeout_s}
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
    stored = [entry_id for entry_id, _ in env.redis.xrange(keys.turn_events(turn_id))]
    assert stream.ids == stored, f"{turn_id}: sent {stream.names}"
    ordered = [parse_stream_id(i) for i in stream.ids]
    assert ordered == sorted(set(ordered))
    assert stream.names[-1] == "turn_finished" and stream.names.count("turn_finished") == 1
    check_turn(env.client.wait(turn_id, 30))


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
        asyncio.create_task(read_sse(http, f"/v1/turns/{t}/events", on_message=lambda _m, t=t: first(t)))
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
                for _ in range(size.restarts):
                    await asyncio.sleep(1.0)
                    assert not all(t.done() for t in tasks), "every stream ended before the restart"
                    await asyncio.to_thread(env.server.stop, keep_data=True)
                    await asyncio.sleep(OUTAGE_S)
                    await asyncio.to_thread(env.server.start)
                streams = await asyncio.wait_for(asyncio.gather(*tasks), size.timeout_s)
                await asyncio.sleep(0.5)
            for turn_id, stream in zip(turn_ids, streams, strict=True):
                check_stream(env, turn_id, stream)
            assert 503 in health.statuses, "healthz never said Redis was away"
            assert health.statuses[-1] == 200
            assert served.process.poll() is None, "the API must outlive the restarts"
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
    started = time.monotonic()
    asyncio.run(run_at_once(size))
    print(f"{size.streams} streams at once: {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(QUICK_RESTARTS, id="quick", marks=pytest.mark.timeout(120)),
        pytest.param(LONG_RESTARTS, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(900)]),
    ],
)
def test_streams_ride_out_redis_restarts_without_losing_or_repeating_an_event(size: Size) -> None:
    started = time.monotonic()
    asyncio.run(run_restarts(size))
    print(f"{size.streams} streams, {size.restarts} restarts: {time.monotonic() - started:.1f} s")
