"""Session-wide fixtures: the shared test data beside the checkout, a real Redis, real workers.

- `redis_server` / `redis_url`: one real `redis-server` per test session on a free port
  (orchestrator.redis_server).
- `redis_client`: a client of it (decode_responses off). Tests use unique ids instead of flushing, because
  the session's workers keep their catalogue entries in the same Redis.
- `own_redis` / `own_persistent_redis`: a `redis-server` of the test's own, to stop and start again (the
  session's must stay up for the other tests), to fill, or to serve workers of its own; the persistent one
  keeps an append-only file, so what was written before a stop is there after the start.
- `module_redis` / `module_persistent_redis`: the same for a whole module: its workers' tools never mix with
  the session worker's catalogue, and its orchestrators claim only its turns.
- `worker`: one real prefork worker per session (`toolloop worker`, concurrency 2) serving
  `tests.support.tools`; for other modules or queues call `tests.support.processes.start_worker` yourself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.redis_server import RedisServer
from tests.support.processes import WorkerHandle, start_worker

ROOT = Path(__file__).resolve().parent.parent


def find_shared_dir() -> Path:
    """`../shared` beside the checkout, as CI has it (TOOLLOOP_SHARED_DIR overrides)."""
    override = os.environ.get("TOOLLOOP_SHARED_DIR")
    candidate = Path(override) if override else ROOT.parent / "shared"
    if not (candidate / "provider_responses").is_dir():
        raise RuntimeError(f"shared test data not found at {candidate}: clone with ../shared beside it")
    return candidate


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return find_shared_dir()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the whole session, stopped (and its temp dir removed) at the end."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def own_persistent_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="module")
def module_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def module_persistent_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="session")
def worker(redis_url: str) -> Iterator[WorkerHandle]:
    """A real prefork worker serving tests.support.tools; its process group is killed at teardown."""
    handle = start_worker(redis_url, ["tests.support.tools"], concurrency=2)
    yield handle
    handle.stop()
