"""A misspelt tool or model gets the closest accepted name in the HTTP API's 422, the Python client's error
and the CLI's message alike.

A real redis-server of this module's own and a real prefork worker serving `workers.examples.arithmetic`
(`add`, `subtract`, ...), the API served by uvicorn, the installed `toolloop` command. No orchestrator runs.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from orchestrator.client.redis_client import Client, UnknownToolError
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from tests.support.api_server import api_client
from tests.support.processes import TOOLLOOP_BIN, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def served_url(module_redis: RedisServer) -> Iterator[str]:
    handle = start_worker(module_redis.url, ["workers.examples.arithmetic"], concurrency=1)
    yield module_redis.url
    handle.stop()


def test_the_api_422_names_the_closest_served_tool(served_url: str) -> None:
    with api_client(Settings(redis_url=served_url)) as http:
        reply = http.post("/v1/turns", json={"prompt": "2+3?", "tools": ["ad"]})
        assert reply.status_code == 422, reply.text
        (error,) = reply.json()["detail"]
        assert (error["type"], error["loc"]) == ("unknown_tool", ["body", "tools", 0])
        assert error["msg"].startswith("unknown tool 'ad' (did you mean 'add'?); available: add, ")
        model = http.post("/v1/turns", json={"prompt": "2+3?", "model": "smrt"})
        assert model.status_code == 422, model.text
        assert "did you mean 'smart'?" in model.json()["detail"][0]["msg"]


def test_the_client_and_the_cli_say_the_same(served_url: str) -> None:
    with Client(served_url) as client, pytest.raises(UnknownToolError, match=r"did you mean 'add'\?"):
        client.submit(prompt="2+3?", tools=["ad"])
    env = {**os.environ, "TOOLLOOP_REDIS_URL": served_url}
    done = subprocess.run(
        [str(TOOLLOOP_BIN), "submit", "--prompt", "2+3?", "--tools", "ad"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: unknown tool 'ad' (did you mean 'add'?) in 'tools'; available: add")
