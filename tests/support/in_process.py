"""An orchestrator `Runtime` serving in the test's own event loop, for tests that reach into its parts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from orchestrator.publishing.publisher import get_producer_app
from orchestrator.runtime.process import Runtime, RuntimeOptions
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore


@asynccontextmanager
async def serving(store: TurnStore, settings: Settings) -> AsyncIterator[Runtime]:
    """A `Runtime` on `store` that runs until the block ends, then is stopped and waited for."""
    async with httpx.AsyncClient() as http:
        runtime = Runtime(
            store=store,
            celery_app=get_producer_app(settings),
            http=http,
            settings=settings,
            options=RuntimeOptions(lease_ttl_s=15.0),
        )
        task = asyncio.create_task(runtime.run())
        try:
            yield runtime
        finally:
            runtime.request_stop()
            await task
