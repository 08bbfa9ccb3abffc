"""A zero-latency model and the orchestrator process of the benchmark.

The model is the project's scripted brain (`providers.scripted.brain.build_reply`) behind an in-process
`httpx.MockTransport`: the runtime still builds the OpenAI Chat Completions request, and the Chat
Completions adapter still parses the response, but no socket and no server sits between them — the model
costs only what the orchestrator's own code costs. The runtime takes its `httpx.AsyncClient` as an
argument, so nothing in it is patched.

    python -m ops.bench.instant            # TOOLLOOP_REDIS_URL, TOOLLOOP_TOOL_MODULES as usual
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from typing import Any

import httpx

from orchestrator.providers.scripted.brain import build_reply
from orchestrator.providers.scripted.wire import build_error_reply
from orchestrator.runtime.process import Runtime
from orchestrator.runtime.publish import get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore

# Never resolved: the mock transport answers every request to it.
INSTANT_BASE_URL = "http://instant-model.invalid/v1"
INSTANT_MODEL = "scripted:plan"


def answer(request: httpx.Request) -> httpx.Response:
    """The scripted brain's reply to one Chat Completions request."""
    try:
        body = json.loads(request.content)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        reply = build_error_reply(400, f"request body is not valid JSON: {exc}")
    else:
        reply = build_reply(body)
    if reply.status == 200:
        give_unique_ids(reply.body)
    return httpx.Response(reply.status, json=reply.body, headers=reply.headers)


def give_unique_ids(completion: dict[str, Any]) -> None:
    """Random tool-call ids, as real providers give them (the scripted brain numbers calls per round)."""
    for choice in completion.get("choices", []):
        for call in (choice.get("message") or {}).get("tool_calls") or []:
            call["id"] = f"call_{uuid.uuid4().hex[:24]}"


def build_instant_http() -> httpx.AsyncClient:
    """An httpx client whose every request is answered in-process by the scripted brain."""
    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def build_settings() -> Settings:
    """Settings from the environment, with the scripted model pointed at the instant transport."""
    return Settings(scripted_base_url=INSTANT_BASE_URL, model=INSTANT_MODEL)


async def serve_instant(settings: Settings) -> None:
    """Run one orchestrator with the instant model until SIGTERM/SIGINT."""
    store = TurnStore.from_url(settings.redis_url, lease_ttl_s=settings.lease_ttl_s)
    async with build_instant_http() as http:
        runtime = Runtime(store=store, celery_app=get_producer_app(settings), http=http, settings=settings)
        runtime.install_signals()
        try:
            await runtime.run()
        finally:
            await store.aclose()


def main() -> None:
    """Entry point of the orchestrator subprocess."""
    logging.basicConfig(
        level=os.environ.get("TOOLLOOP_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(serve_instant(build_settings()))


if __name__ == "__main__":
    main()
