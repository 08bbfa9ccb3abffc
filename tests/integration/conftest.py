"""Integration fixtures over the session's Redis, in the store tests' own database (`tests.support.store_db`).

- `db_url`: that database, emptied for the test (a module may point it at another database number).
- `store`: a `TurnStore` of `db_url`.
- `api`: the HTTP API of `db_url` on a real uvicorn server, and an httpx client of it.
- `http`: a plain `httpx.AsyncClient`, for tests that call servers of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from tests.support.api_server import api_client
from tests.support.store_db import empty_db_url


@pytest.fixture
def db_url(redis_url: str) -> str:
    return empty_db_url(redis_url)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[TurnStore]:
    turns = TurnStore.from_url(db_url)
    yield turns
    await turns.aclose()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    with api_client(Settings(redis_url=db_url)) as http:
        yield http
