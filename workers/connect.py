"""The one way every toolloop process opens Redis: the URL's own options plus an explicit TLS policy.

`rediss://` without `ssl_cert_reqs` makes redis-py skip certificate checks silently (ARCHITECTURE, SPEC §8.1),
so every client — worker, orchestrator, API, clients, CLI, demo — goes through `connect_redis` or
`connect_redis_async`, which always set the policy from `TOOLLOOP_REDIS_SSL_CERT_REQS` for such a URL. It
lives in the leaf package so that workers use it without importing the orchestrator.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

DEFAULT_SSL_CERT_REQS = "required"


def build_redis_options(redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS) -> dict[str, Any]:
    """Connection options for a Redis URL: `rediss://` always gets an explicit certificate policy."""
    if redis_url.startswith("rediss://"):
        return {"ssl_cert_reqs": ssl_cert_reqs}
    return {}


def connect_redis(
    redis_url: str,
    ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS,
    *,
    decode_responses: bool = True,
    **options: Any,
) -> redis.Redis:
    """A sync client for `redis_url`; `options` are redis-py's (e.g. `socket_connect_timeout`)."""
    return redis.Redis.from_url(
        redis_url,
        decode_responses=decode_responses,
        **build_redis_options(redis_url, ssl_cert_reqs),
        **options,
    )


def connect_redis_async(
    redis_url: str,
    ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS,
    *,
    decode_responses: bool = True,
    **options: Any,
) -> aioredis.Redis:
    """`connect_redis` for asyncio."""
    return aioredis.Redis.from_url(
        redis_url,
        decode_responses=decode_responses,
        **build_redis_options(redis_url, ssl_cert_reqs),
        **options,
    )
