"""What a person sees when Redis stays away longer than a client's patience, on a real redis-server.

`wait` still ends at its own timeout, with `RedisUnavailableError` (a `TimeoutError` and a
`redis.ConnectionError`) naming the URL; the same client works again once Redis is back. `toolloop submit`
without a Redis exits 3 with one error line, its URL's password hidden, never a traceback.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import redis

from orchestrator.client.redis_client import AsyncClient, Client, RedisUnavailableError
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.processes import ROOT, TOOLLOOP_BIN

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_wait_ends_at_its_timeout_while_redis_is_away_and_works_again_once_it_is_back(
    own_persistent_redis: RedisServer,
) -> None:
    with Client(own_persistent_redis.url, retry_s=1.0) as client:
        turn_id = client.submit(prompt="nobody runs this turn")
        own_persistent_redis.stop(keep_data=True)
        with pytest.raises(RedisUnavailableError) as raised:
            client.wait(turn_id, 1.5)
        assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, redis.ConnectionError)
        assert str(raised.value).startswith(f"cannot reach Redis at {own_persistent_redis.url} (tried for ")
        with pytest.raises(RedisUnavailableError):
            client.get(turn_id)  # a call without a timeout of its own waits `retry_s`
        own_persistent_redis.start()
        assert client.get(turn_id).status == "queued"  # the turn was kept (AOF), the client reconnects
        with pytest.raises(TimeoutError) as still_queued:
            client.wait(turn_id, 0.5)
        assert not isinstance(still_queued.value, RedisUnavailableError)


async def test_the_async_wait_ends_the_same_way(own_persistent_redis: RedisServer) -> None:
    async with AsyncClient(own_persistent_redis.url, retry_s=1.0) as client:
        turn_id = await client.submit(prompt="nobody runs this turn")
        own_persistent_redis.stop(keep_data=True)
        with pytest.raises(RedisUnavailableError, match="cannot reach Redis at"):
            await client.wait(turn_id, 1.5)
        own_persistent_redis.start()
        assert (await client.get(turn_id)).status == "queued"


def test_submit_without_redis_says_so_in_one_line_without_the_password() -> None:
    url = f"redis://:s3cret@127.0.0.1:{find_free_port()}/0"
    env = {**os.environ, "TOOLLOOP_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(TOOLLOOP_BIN), "submit", "--prompt", "hi", "--wait", "--timeout", "5"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "s3cret" not in done.stderr
    # The retry notice, then the error: one line each.
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot reach Redis at redis://:**@127.0.0.1:"), done.stderr
