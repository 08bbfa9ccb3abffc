"""The one way every toolloop process opens Redis: the URL's own options plus an explicit TLS policy.

`rediss://` without `ssl_cert_reqs` makes redis-py skip certificate checks silently,
so every client — worker, orchestrator, API, clients, CLI, demo — goes through `connect_redis` or
`connect_redis_async`, which always set the policy from `TOOLLOOP_REDIS_SSL_CERT_REQS` for such a URL. It
lives in the leaf package so that workers use it without importing the orchestrator.

A Redis behind Sentinel is named as Celery names it: `sentinel://h1:26379;sentinel://h2:26379/0`, one
`sentinel://` part per sentinel, with the name of the master they monitor in `TOOLLOOP_REDIS_MASTER_NAME`.
For such a URL the helpers return a client of the current master (redis-py's `Sentinel.master_for`): each
new connection asks the sentinels where the master is, a connection that finds it demoted (READONLY) is
dropped, and the pool asks the sentinels again at least every `MASTER_CHECK_S` while it is in use (see
`MasterCheckingPool`), so the next command goes to the new master.

A Redis Cluster (`TOOLLOOP_REDIS_CLUSTER=true`) is named by any of its nodes, `redis://node:6379/0`: the
helpers return redis-py's cluster client, which reads the slot map from that node and sends each command to
the master of its key's slot, following MOVED and ASK and reading the map again after a failover. Keys are
then named with hash tags (`workers.keys`), so the layout and the client always agree: both follow the same
switch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from kombu.utils.url import maybe_sanitize_url
from redis.connection import parse_url

from workers import keys
from workers.errors import RedisConfigError
from workers.redis_errors import REDIS_ERRORS, is_transient

DEFAULT_SSL_CERT_REQS = "required"
SENTINEL_SCHEME = "sentinel://"
DEFAULT_SENTINEL_PORT = 26379
MASTER_NAME_VARIABLE = "TOOLLOOP_REDIS_MASTER_NAME"
# The parts of one `sentinel://` URL that name the master's database and credentials, not a sentinel.
_MASTER_KEYS = ("db", "username", "password")
# How often a pool in use asks the sentinels whether the master moved (one SENTINEL MASTERS round trip).
MASTER_CHECK_S = 1.0


@dataclass(frozen=True)
class SentinelTarget:
    """What a `sentinel://` URL says: where the sentinels are, and how to talk to the master they name."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    # redis-py's query options (socket_timeout, …), for the master's connections and the sentinels' socket.
    options: dict[str, Any] = field(default_factory=dict)


def is_sentinel_url(redis_url: str) -> bool:
    """Whether `redis_url` is Celery's Sentinel form (`sentinel://h1:26379;sentinel://h2:26379/0`)."""
    return redis_url.startswith(SENTINEL_SCHEME)


def parse_sentinel_url(redis_url: str) -> SentinelTarget:
    """The sentinels, database, credentials and options of a `sentinel://` URL.

    As in kombu and Celery, every `;`-separated part is one sentinel (port 26379 unless given); the
    database, user name and password may be written on any part but must agree where written twice.
    Raises `RedisConfigError` for a part that is not `sentinel://`, or parts that disagree.
    """
    sentinels: list[tuple[str, int]] = []
    master: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in redis_url.split(";"))):
        if not is_sentinel_url(part):
            raise RedisConfigError(f"every part of a Sentinel URL starts with sentinel://, not {part!r}")
        try:
            # redis-py's own parser: the same query options (typed) as a redis:// URL.
            parsed: dict[str, Any] = parse_url("redis://" + part.removeprefix(SENTINEL_SCHEME))  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise RedisConfigError(f"bad Sentinel URL part {maybe_sanitize_url(part)!r}: {exc}") from exc
        sentinels.append((parsed.pop("host", "localhost"), parsed.pop("port", DEFAULT_SENTINEL_PORT)))
        for key, value in parsed.items():
            into = master if key in _MASTER_KEYS else options
            if into.setdefault(key, value) != value:
                raise RedisConfigError(f"the parts of the Sentinel URL disagree on {key}")
    if any(key.startswith("ssl") for key in options):
        raise RedisConfigError(
            "TLS through Sentinel is not supported: a sentinel:// URL has no ssl_* options"
        )
    return SentinelTarget(sentinels=tuple(sentinels), options=options, **master)


def build_sentinel_broker_url(redis_url: str) -> str:
    """A `sentinel://` URL as kombu and Celery read it: the master's database and credentials on every part.

    Both take them from the first part only, so `sentinel://h1;sentinel://h2/3` would be database 0 there
    and database 3 here; written on every part it is the same database everywhere. Query options go: kombu
    would hand them to its Connection, which refuses redis-py's.
    """
    target = parse_sentinel_url(redis_url)
    auth = ""
    if target.username is not None or target.password is not None:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password or '', safe='')}@"
    return ";".join(f"{SENTINEL_SCHEME}{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)


def resolve_master_name(master_name: str | None = None) -> str:
    """The master a Sentinel URL means: `master_name`, else `TOOLLOOP_REDIS_MASTER_NAME`.

    Raises `RedisConfigError` when neither names one: a Sentinel URL without it names no Redis.
    """
    name = (master_name or os.environ.get(MASTER_NAME_VARIABLE, "")).strip()
    if not name:
        raise RedisConfigError(
            f"TOOLLOOP_REDIS_URL is a Sentinel URL (sentinel://…): set {MASTER_NAME_VARIABLE} to the name "
            "of the master its sentinels monitor (`sentinel monitor <name> …` in their configuration)"
        )
    return name


def build_redis_options(
    redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS, **options: Any
) -> dict[str, Any]:
    """Client options for a Redis URL: decoded replies unless `options` say otherwise, redis-py's `options`
    (e.g. `socket_connect_timeout`), and for `rediss://` always an explicit certificate policy.

    Replies are decoded with `surrogateescape`: a compressed record (`workers.packing`) is bytes that are not
    UTF-8, read as text that encodes back to the same bytes instead of failing the whole reply."""
    built: dict[str, Any] = {"decode_responses": True, "encoding_errors": "surrogateescape", **options}
    if redis_url.startswith("rediss://"):
        built["ssl_cert_reqs"] = ssl_cert_reqs
    return built


class MasterCheckingPool(redis.sentinel.SentinelConnectionPool):
    """redis-py's Sentinel pool, asking the sentinels where the master is before handing out a connection
    when it last asked `MASTER_CHECK_S` ago.

    redis-py asks only when it opens a connection. After SENTINEL FAILOVER the old master stays up and
    writable until the sentinels reconfigure it, about ten seconds later, and then drops what it was sent
    meanwhile: a pool of warm connections would write there all that time. Seeing the new address, redis-py
    disconnects the idle connections and drops the busy ones when they come back.
    """

    _checked_at = float("-inf")

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the master the sentinels name now (asked at most every `MASTER_CHECK_S`)."""
        now = time.monotonic()
        if now - self._checked_at >= MASTER_CHECK_S:
            self._checked_at = now
            # Sentinels unreachable: the connection opened next asks again, and raises if they still are.
            try:
                self.get_master_address()  # type: ignore[no-untyped-call]
            except REDIS_ERRORS as exc:
                if not is_transient(exc):
                    raise
        return super().get_connection(*args, **kwargs)


class AsyncMasterCheckingPool(aiosentinel.SentinelConnectionPool):
    """`MasterCheckingPool` for asyncio."""

    _checked_at = float("-inf")

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the master the sentinels name now (asked at most every `MASTER_CHECK_S`)."""
        now = time.monotonic()
        if now - self._checked_at >= MASTER_CHECK_S:
            self._checked_at = now
            try:
                await self.get_master_address()  # type: ignore[no-untyped-call]
            except REDIS_ERRORS as exc:
                if not is_transient(exc):
                    raise
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]

    async def release(self, connection: Any) -> None:
        """Take a connection back; one to an address the sentinels no longer name is disconnected first.

        redis-py's sync pool checks this (`owns_connection`), its asyncio one does not: a connection busy
        while the pool learnt of a new master (a blocking read, a slow script) would go on writing to the old
        one, writable until the sentinels demote it and then wiped."""
        master = self.master_address
        if self.is_master and master is not None and (connection.host, connection.port) != tuple(master):
            await connection.disconnect()
        await super().release(connection)


class SentinelRedis(redis.Redis):
    """A client of the master the sentinels name; closing it closes its connections to the sentinels too."""

    sentinels: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        """Close the master's connections, then the sentinels'."""
        try:
            super().close()
        finally:
            if self.sentinels is not None:
                self.sentinels.close()


class AsyncSentinelRedis(aioredis.Redis):
    """`SentinelRedis` for asyncio: without `aclose`, the sentinels' connections would be left unclosed."""

    sentinels: aiosentinel.Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the master's connections, then the sentinels'."""
        try:
            await super().aclose(close_connection_pool)
        finally:
            if self.sentinels is not None:
                await self.sentinels.aclose()


def _build_sentinel_kwargs(
    redis_url: str, master_name: str | None, options: dict[str, Any]
) -> tuple[str, SentinelTarget, dict[str, Any]]:
    # The master's name, the URL's parts, and the keyword arguments of its master's connections.
    name = resolve_master_name(master_name)
    target = parse_sentinel_url(redis_url)
    credentials = {"username": target.username, "password": target.password}
    built = build_redis_options(redis_url, **{**target.options, **options})
    return name, target, {"db": target.db, **{k: v for k, v in credentials.items() if v is not None}, **built}


def _check_cluster_url(redis_url: str) -> None:
    if is_sentinel_url(redis_url):
        raise RedisConfigError(
            "TOOLLOOP_REDIS_CLUSTER is on but TOOLLOOP_REDIS_URL is a Sentinel URL: a Redis Cluster fails "
            "over by itself; name any of its nodes (redis://host:port/0)"
        )
    if parse_url(redis_url).get("db", 0) not in (0, None):  # type: ignore[no-untyped-call]
        raise RedisConfigError(
            "a Redis Cluster has only database 0: TOOLLOOP_REDIS_URL must end in /0 or no /db"
        )


def _cluster_options(redis_url: str, ssl_cert_reqs: str, options: dict[str, Any]) -> dict[str, Any]:
    _check_cluster_url(redis_url)
    built = build_redis_options(redis_url, ssl_cert_reqs, **options)
    # Per node on a cluster; the single client's pool cap would otherwise starve the busiest node.
    built.pop("max_connections", None)
    return built


def check_redis_url(redis_url: str, *, cluster: bool | None = None) -> None:
    """`RedisConfigError` for a `redis_url` no client could be made of in this layout (`cluster`; default:
    this process's): a cluster's Sentinel URL or database other than 0, a Sentinel URL naming no master. For
    a process that checks its configuration before it starts serving."""
    if keys.is_cluster_layout() if cluster is None else cluster:
        _check_cluster_url(redis_url)
    elif is_sentinel_url(redis_url):
        resolve_master_name()


def probe_redis_layout(redis_url: str) -> None:
    """`RedisConfigError` when Redis answers that this process's layout is not its own: TOOLLOOP_REDIS_CLUSTER
    on against one Redis, or off against a cluster's node. Nothing when it answers as expected, or not at all
    (a process that starts before its Redis rides that out). For a long-running process, before it starts."""
    check_redis_url(redis_url)
    try:
        client = connect_redis(redis_url, socket_timeout=5)  # a cluster's client reads the slots here
    except REDIS_ERRORS:
        return
    try:
        if not keys.is_cluster_layout() and int(client.info("cluster").get("cluster_enabled", 0)) == 1:
            raise RedisConfigError(
                f"{maybe_sanitize_url(redis_url)} is a node of a Redis Cluster: set "
                "TOOLLOOP_REDIS_CLUSTER=true, and TOOLLOOP_BROKER_URL, on every process"
            )
    except REDIS_ERRORS:
        return
    finally:
        client.close()


def connect_redis(
    redis_url: str,
    ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS,
    *,
    master_name: str | None = None,
    cluster: bool | None = None,
    **options: Any,
) -> redis.Redis:
    """A sync client for `redis_url` with the options of `build_redis_options`.

    For a `sentinel://` URL, a client of the current master of `master_name` (default:
    `TOOLLOOP_REDIS_MASTER_NAME`; `RedisConfigError` when neither is set). With `cluster` (default: the key
    layout of this process, `TOOLLOOP_REDIS_CLUSTER`), redis-py's Redis Cluster client, typed as a client of
    one Redis because it answers the same commands.
    """
    if keys.is_cluster_layout() if cluster is None else cluster:
        built = _cluster_options(redis_url, ssl_cert_reqs, options)
        try:
            return redis.cluster.RedisCluster.from_url(redis_url, **built)  # type: ignore[return-value]
        except REDIS_ERRORS as exc:
            # The sync client reads the cluster's slots as it is made: no node answering is an unreachable
            # Redis to its caller (a `ConnectionError`, as a client of one Redis raises at its first command).
            raise _cluster_failure(redis_url, exc) from exc
    if not is_sentinel_url(redis_url):
        return redis.Redis.from_url(redis_url, **build_redis_options(redis_url, ssl_cert_reqs, **options))
    name, target, kwargs = _build_sentinel_kwargs(redis_url, master_name, options)
    manager = redis.sentinel.Sentinel(list(target.sentinels), **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    client: SentinelRedis = manager.master_for(  # type: ignore[no-untyped-call]
        name, redis_class=SentinelRedis, connection_pool_class=MasterCheckingPool
    )
    client.sentinels = manager
    return client


def _cluster_failure(redis_url: str, exc: Exception) -> Exception:
    # A node that is no cluster's (TOOLLOOP_REDIS_CLUSTER on against one Redis) is a configuration mistake;
    # no node answering, or the cluster not serving every slot yet, is Redis away.
    shown = maybe_sanitize_url(redis_url)
    if is_transient(exc):
        return redis.exceptions.ConnectionError(f"no node of the Redis Cluster at {shown} answers: {exc}")
    return RedisConfigError(
        f"TOOLLOOP_REDIS_CLUSTER is on but {shown} is not a node of a Redis Cluster ({exc}): unset it for "
        "one Redis"
    )


def connect_redis_async(
    redis_url: str,
    ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS,
    *,
    master_name: str | None = None,
    cluster: bool | None = None,
    **options: Any,
) -> aioredis.Redis:
    """`connect_redis` for asyncio."""
    if keys.is_cluster_layout() if cluster is None else cluster:
        built = _cluster_options(redis_url, ssl_cert_reqs, options)
        return aiocluster.RedisCluster.from_url(redis_url, **built)  # type: ignore[return-value]
    if not is_sentinel_url(redis_url):
        return aioredis.Redis.from_url(redis_url, **build_redis_options(redis_url, ssl_cert_reqs, **options))
    name, target, kwargs = _build_sentinel_kwargs(redis_url, master_name, options)
    manager = aiosentinel.Sentinel(list(target.sentinels), **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    client: AsyncSentinelRedis = manager.master_for(
        name, redis_class=AsyncSentinelRedis, connection_pool_class=AsyncMasterCheckingPool
    )
    client.sentinels = manager
    return client
