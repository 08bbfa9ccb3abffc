"""Two `toolloop worker`s started the same way on one host keep their own catalogue entries.

The catalogue is keyed by node name. Under Celery's default (`celery@<host>`) the second worker overwrote
the first one's entry, and when either stopped its cleanup removed the entry both relied on: the tools of
the worker still running vanished ("unknown tool …; available: none") until its next refresh.
"""

from __future__ import annotations

import signal

import pytest
import redis

from orchestrator.redis_server import RedisServer
from orchestrator.store.catalogue import read_catalogue
from tests.support.served import Served, start_toolloop
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def test_two_default_named_workers_on_one_host_keep_their_tools(own_redis: RedisServer) -> None:
    env = {"TOOLLOOP_REDIS_URL": own_redis.url, "TOOLLOOP_TOOL_MODULES": "tests.support.tools"}
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    workers: list[Served] = []
    try:
        for _ in range(2):
            workers.append(start_toolloop(["worker", "--concurrency", "1"], env=env))
        workers[0].wait_for(lambda: client.hlen(keys.CATALOGUE) == 2, "two catalogue entries")
        names = list(client.hkeys(keys.CATALOGUE))
        assert all(name.startswith("toolloop-") for name in names), names
        first, second = workers
        first.stop_with(signal.SIGTERM, within_s=30)
        second.wait_for(lambda: client.hlen(keys.CATALOGUE) == 1, "the stopped worker's entry removed")
        assert "echo" in read_catalogue(client), "the running worker's tools are still listed"
    finally:
        for served in workers:
            served.kill()
        client.close()
