"""Every process parses Redis replies with hiredis (issue 16): the bench's per-call CPU figures assume it.

redis-py falls back to its pure-Python parser without a word when hiredis is missing; that parser cost the
orchestrator about a third more CPU per tool call in `make bench`. The dependency is `redis[hiredis]`, and
these tests fail if an install ever loses it.
"""

from __future__ import annotations

from typing import Any

import kombu.transport.redis as kombu_redis
from redis._parsers.hiredis import _AsyncHiredisParser, _HiredisParser

from workers.connect import connect_redis, connect_redis_async

URL = "redis://127.0.0.1:1/0"


def _parser(connection: Any) -> object:
    return connection._parser


def test_sync_clients_parse_with_hiredis() -> None:
    pool: Any = connect_redis(URL).connection_pool
    assert isinstance(_parser(pool.make_connection()), _HiredisParser)


def test_async_clients_parse_with_hiredis() -> None:
    pool: Any = connect_redis_async(URL).connection_pool
    assert isinstance(_parser(pool.make_connection()), _AsyncHiredisParser)


def test_celery_broker_channels_parse_with_hiredis() -> None:
    # kombu's Redis transport opens its channels with redis-py's connection class and its default parser.
    connection_class: Any = kombu_redis.Channel.connection_class
    assert isinstance(_parser(connection_class(host="127.0.0.1", port=1)), _HiredisParser)
