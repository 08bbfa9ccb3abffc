"""How the stores open Redis, and how long one blocking read may block on a client.

Every reader opens Redis through `connect_sync` / `connect_async` (workers.connect: decoded replies, the
`rediss://` certificate policy, redis-py's default socket timeout). redis-py gives up on a reply
that takes longer than the client's socket timeout, and a server-side block of the same length hits it
exactly: so no blocking read (XREAD BLOCK, BLMOVE, BLPOP) blocks longer than `block_cap_ms` of its client,
well under that timeout, and whoever waits longer loops in steps until its own deadline (`build_step_ms`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import redis
import redis.asyncio as aioredis

from workers.connect import connect_redis, connect_redis_async

# redis-py 8's `socket_timeout` defaults to 5 s; a read blocks at most 2 s, or less for a shorter timeout.
MAX_BLOCK_MS = 2000
_SOCKET_TIMEOUT_SHARE = 0.4
_ASSUMED_SOCKET_TIMEOUT_S = 5.0
# Connections a client may open at once (`connect_sync`'s; the async `Client`'s too). Each blocking read (a
# `wait`, `events` or `stream` of a turn) holds one while it blocks: redis-py's default cap of 100 failed a
# web app's 101st concurrent wait, and the submit beside it, as "Redis unavailable (Too many connections)"
# with Redis idle. Redis's own default `maxclients` is 10,000.
MAX_CONNECTIONS = 2000
# The password of a URL's user part (`redis://user:secret@host`), in each URL of a `;`-separated list
# (Celery's Sentinel form), and a `password=` query option.
_URL_PASSWORD = re.compile(r"(?<=://)([^:/@;]*):[^/;]*@")
_QUERY_PASSWORD = re.compile(r"(?<=[?&]password=)[^&;]*")


def connect_sync(
    redis_url: str, ssl_cert_reqs: str = "required", *, master_name: str | None = None
) -> redis.Redis:
    """The sync Redis client every sync reader uses (`Client`, direct calls): decoded replies, and for
    `rediss://` the explicit certificate policy; redis-py's default socket timeout. For a
    `sentinel://` URL, a client of the current master of `master_name` (default:
    `TOOLLOOP_REDIS_MASTER_NAME`)."""
    return connect_redis(redis_url, ssl_cert_reqs, master_name=master_name, max_connections=MAX_CONNECTIONS)


def connect_async(
    redis_url: str,
    ssl_cert_reqs: str = "required",
    *,
    master_name: str | None = None,
    max_connections: int | None = None,
) -> aioredis.Redis:
    """`connect_sync` for asyncio: the client of `TurnStore.from_url` and async direct calls; at most
    `max_connections` at once (default: redis-py's)."""
    # None is redis-py's own default for its pools.
    return connect_redis_async(
        redis_url, ssl_cert_reqs, master_name=master_name, max_connections=max_connections
    )


def build_shown_url(redis_url: str) -> str:
    """`redis_url` as a person may be shown it (an error, a log line): every password replaced by `**`."""
    return _QUERY_PASSWORD.sub("**", _URL_PASSWORD.sub(r"\1:**@", redis_url))


def _socket_timeout_s(client: Any) -> float | None:
    # The read timeout redis-py applies on `client`'s connections (sync or asyncio); None: no timeout. A
    # Sentinel pool is a connection pool too: its kwargs and connection class say the same of the master's.
    # A cluster client has no one pool: each node's connections get the client's keyword arguments.
    pool = getattr(client, "connection_pool", None)
    kwargs = pool.connection_kwargs if pool is not None else client.get_connection_kwargs()
    if "socket_timeout" in kwargs:
        value = kwargs["socket_timeout"]
    else:
        value = _default_socket_timeout(pool.connection_class if pool is not None else redis.Connection)
    return None if value is None else float(value)


def _default_socket_timeout(connection_class: type) -> Any:
    # The connection class's own default, which is what an URL without `socket_timeout` gets.
    for cls in connection_class.__mro__:
        init = vars(cls).get("__init__")
        parameter = inspect.signature(init).parameters.get("socket_timeout") if init else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return _ASSUMED_SOCKET_TIMEOUT_S


def block_cap_ms(client: Any) -> int:
    """How long one blocking read on `client` may block: `MAX_BLOCK_MS`, less for a short socket timeout."""
    timeout = _socket_timeout_s(client)
    if timeout is None or timeout <= 0:
        return MAX_BLOCK_MS
    return max(1, min(MAX_BLOCK_MS, int(timeout * 1000 * _SOCKET_TIMEOUT_SHARE)))


def build_block_ms(wanted_ms: float, cap_ms: int) -> int:
    """The BLOCK of one read: what the caller wants, capped, and at least 1 ms (BLOCK 0 waits forever)."""
    return max(1, min(cap_ms, int(wanted_ms)))


def build_step_ms(deadline: float, now: float, cap_ms: int) -> int | None:
    """The block of the next step of a wait until `deadline` (the clock of `now`); None once it has passed."""
    remaining_ms = (deadline - now) * 1000
    if remaining_ms <= 0:
        return None
    return build_block_ms(remaining_ms, cap_ms)
