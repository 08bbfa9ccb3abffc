"""End-to-end fixtures: per module, a prefork worker, an orchestrator and a model server, on the module's
own Redis (`module_redis`, tests/conftest.py).

A module gets its own `redis-server` (not the session's) so that its orchestrator never claims another
suite's turns and its worker's tools never mix with the session worker's catalogue on the same queue.

Reading a turn (its outcome, its events): `tests.support.turns`. Waiting on anything else:
`tests.support.waiting`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker


@pytest.fixture(scope="module")
def model_server() -> Iterator[RecordingModelServer]:
    with RecordingModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def e2e_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, [E2E_TOOLS], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator_process(
    module_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(
        module_redis.url,
        model_base_url=model_server.base_url,
        env={"TOOLLOOP_METRICS_PORT": str(find_free_port())},
    )
    yield handle
    handle.stop()


@pytest.fixture
def client(module_redis: RedisServer) -> Iterator[Client]:
    c = Client(module_redis.url)
    yield c
    c.redis.close()


@pytest.fixture
def module_redis_client(module_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(module_redis.url)
    yield c
    c.close()
