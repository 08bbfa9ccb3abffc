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


def build_redis_options(
    redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS, **options: Any
) -> dict[str, Any]:
    """Client options for a Redis URL: decoded replies unless `options` say otherwise, redis-py's `options`
    (e.g. `socket_connect_timeout`), and for `rediss://` always an explicit certificate policy."""
    built: dict[str, Any] = {"decode_responses": True, **options}
    if redis_url.startswith("rediss://"):
        built["ssl_cert_reqs"] = ssl_cert_reqs
    return built


def connect_redis(redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS, **options: Any) -> redis.Redis:
    """A sync client for `redis_url` with the options of `build_redis_options`."""
    return redis.Redis.from_url(redis_url, **build_redis_options(redis_url, ssl_cert_reqs, **options))


def connect_redis_async(
    redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS, **options: Any
) -> aioredis.Redis:
    """`connect_redis` for asyncio."""
    return aioredis.Redis.from_url(redis_url, **build_redis_options(redis_url, ssl_cert_reqs, **options))
