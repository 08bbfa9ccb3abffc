"""The API's Redis connections, each bounded, and how a Redis failure becomes a 503 (issue 12).

Three clients, so that no use of Redis can starve another:

- requests (`POST /v1/turns`, reads, cancel, approvals, `/v1/tools`, the SSE streams' opening and catch-up
  reads): a pool of at most `api_redis_max_connections` (`TOOLLOOP_API_REDIS_MAX_CONNECTIONS`) behind a
  `RedisGate`, so a burst waits its turn for a connection (up to `SLOT_WAIT_S`) instead of failing;
- the events reader (`api_fanout.EventFanout`): one connection, whatever the number of open SSE streams;
- `/healthz`: a connection of its own, so it tells whether Redis answers, not whether the pool is busy.

The connections are named (`CLIENT SETNAME toolloop-api-requests`, `-events`, `-health`): `CLIENT LIST`
shows what an API holds. Any Redis failure — unreachable, a timeout, out of memory, a read-only replica, no
connection free in time — answers 503 with `Retry-After` and a one-line reason (`build_unavailable_reply`),
logged once and then every `FAILURE_LOG_S` while failures go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator import metrics
from orchestrator.api.fanout import EventFanout
from orchestrator.client.redis_client import AsyncClient
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from workers.connect import connect_redis_async
from workers.redis_errors import REDIS_ERRORS, RedisErrorKind, classify

log = logging.getLogger("toolloop.api")

# What a 503 asks a client to wait before trying again (s): Redis restarts and failovers take seconds.
RETRY_AFTER_S = 1
# How long a request waits for a free connection of the pool before its 503.
SLOT_WAIT_S = 5.0
# How long /healthz waits for PONG; also its connection's connect timeout.
HEALTH_TIMEOUT_S = 3.0
# A reader that cannot connect gives up on that try after this long (then backs off and tries again).
CONNECT_TIMEOUT_S = 5.0
# While Redis keeps failing requests, how often that is logged again.
FAILURE_LOG_S = 10.0
CLIENT_NAME = "toolloop-api"


# What a 503's reason says first, by the kind of Redis error (`workers.redis_errors`).
_REASONS: dict[RedisErrorKind, str] = {
    RedisErrorKind.UNREACHABLE: "Redis unavailable",
    RedisErrorKind.FAILOVER: "Redis is read-only (a replica, or a failover under way)",
    RedisErrorKind.OUT_OF_MEMORY: "Redis is out of memory (maxmemory reached)",
    RedisErrorKind.LOADING: "Redis is loading its data or busy running a script",
    RedisErrorKind.CLUSTER_MOVING: "Redis Cluster is moving slots or has no majority",
    RedisErrorKind.CANNOT_PERSIST: "Redis cannot persist to disk and refuses writes",
    RedisErrorKind.ACCESS_DENIED: "Redis refused access (password or ACL)",
}


def build_failure_reason(exc: BaseException) -> str:
    """One line saying what went wrong with Redis, in an operator's words (a client's retries that ran out
    are told by the failure they retried, the cause of their error)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    meaning = classify(exc.__cause__ if isinstance(exc.__cause__, REDIS_ERRORS) else exc)
    if meaning is None:
        return f"Redis unavailable: {text}"
    return f"{_REASONS.get(meaning.kind, 'Redis refused the command')}: {text}"


def build_unavailable_reply(body: Mapping[str, str]) -> JSONResponse:
    """A 503 with `Retry-After` and `body`."""
    return JSONResponse(dict(body), status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


class FailureLog:
    """Logs Redis failures of requests once, then every `FAILURE_LOG_S` while they go on (not one a 503);
    counts each in `toolloop_redis_errors_total{loop="api_request"}`."""

    def __init__(self, report_s: float = FAILURE_LOG_S) -> None:
        self.report_s = report_s
        self._reported_at: float | None = None
        self._count = 0

    def failed(self, exc: BaseException, reason: str) -> None:
        """A request got a 503 for `exc`, told as `reason`."""
        metrics.record_redis_error("api_request", exc)
        self._count += 1
        now = time.monotonic()
        if self._reported_at is None or now - self._reported_at >= self.report_s:
            log.warning("API request answered 503 (%d since the last report): %s", self._count, reason)
            self._reported_at, self._count = now, 0


class RedisGate:
    """At most `slots` Redis commands of requests at a time (the pool's size): others wait for a slot."""

    def __init__(self, slots: int, wait_s: float = SLOT_WAIT_S) -> None:
        self.wait_s = wait_s
        self._free = asyncio.Semaphore(slots)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot; redis-py's `ConnectionError` (a 503) when none is free within `wait_s`, as its
        blocking pool says."""
        try:
            async with asyncio.timeout(self.wait_s):
                await self._free.acquire()
        except TimeoutError:
            raise RedisConnectionError(f"no Redis connection free within {self.wait_s:g} s") from None
        try:
            yield
        finally:
            self._free.release()


class HealthCheck:
    """PING on the health connection; concurrent checks share the PING under way."""

    def __init__(self, redis: aioredis.Redis, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        self._redis = redis
        self.timeout_s = timeout_s
        self._ping: asyncio.Task[object] | None = None

    async def check(self) -> str | None:
        """None when Redis answers, else why not."""
        if self._ping is None or self._ping.done():
            self._ping = asyncio.create_task(self._send_ping())
            # Retrieved here, so a PING nobody waits for any more never warns "exception never retrieved".
            self._ping.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(self._ping)
        except TimeoutError:
            return f"Redis did not answer PING within {self.timeout_s:g} s"
        except REDIS_ERRORS as exc:
            return build_failure_reason(exc)
        return None

    async def _send_ping(self) -> object:
        return await self._redis.ping()

    async def aclose(self) -> None:
        """Cancel a PING under way and close the connection."""
        if self._ping is not None:
            self._ping.cancel()
        with contextlib.suppress(*REDIS_ERRORS):
            await self._redis.aclose()


@dataclass
class ApiRedis:
    """Everything of the API that talks to Redis, opened for the app's lifetime (`open`, `aclose`)."""

    client: AsyncClient
    gate: RedisGate
    fanout: EventFanout
    health: HealthCheck
    failures: FailureLog

    @classmethod
    def open(cls, settings: Settings) -> ApiRedis:
        """Open the three clients (no connection is made before first use) and start the events reader."""
        url, tls = settings.redis_url, settings.redis_ssl_cert_reqs
        size = settings.api_redis_max_connections
        requests = connect_redis_async(url, tls, max_connections=size, client_name=f"{CLIENT_NAME}-requests")
        reader = connect_redis_async(
            url,
            tls,
            max_connections=1,
            client_name=f"{CLIENT_NAME}-events",
            socket_connect_timeout=CONNECT_TIMEOUT_S,
        )
        health = connect_redis_async(
            url,
            tls,
            max_connections=1,
            client_name=f"{CLIENT_NAME}-health",
            socket_connect_timeout=HEALTH_TIMEOUT_S,
        )
        store = TurnStore(requests, lease_ttl_s=settings.lease_ttl_s)
        fanout = EventFanout(reader, buffer_events=settings.api_stream_buffer_events, waker=requests)
        fanout.start()
        return cls(
            client=AsyncClient(settings=settings, store=store, retry_s=settings.api_redis_retry_s),
            gate=RedisGate(size),
            fanout=fanout,
            health=HealthCheck(health),
            failures=FailureLog(),
        )

    async def aclose(self) -> None:
        """Stop the reader and close every connection, without waiting on Redis."""
        await self.fanout.aclose()
        await self.health.aclose()
        with contextlib.suppress(*REDIS_ERRORS):
            await self.client.aclose()
