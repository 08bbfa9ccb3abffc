"""A zero-latency model and the orchestrator process of the benchmark.

The model is the project's scripted brain (`providers.scripted.brain.build_reply`) behind an in-process
`httpx.MockTransport`: the runtime still builds the OpenAI Chat Completions request, and the Chat
Completions adapter still parses the response, but no socket and no server sits between them — the model
costs only what the orchestrator's own code costs. The runtime takes its `httpx.AsyncClient` as an
argument, so nothing in it is patched.

    python -m ops.bench.instant            # TOOLLOOP_REDIS_URL, TOOLLOOP_TOOL_MODULES as usual

The model's own work (parsing each request, building its reply) runs in this process too, so it counts in the
process's CPU time; with `BENCH_MODEL_CPU_FILE` set, the CPU seconds it took so far are kept in that file,
so that a figure of the orchestrator's CPU can say how much of it was the model's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from orchestrator.providers.scripted.brain import build_reply
from orchestrator.providers.scripted.wire import build_error_reply
from orchestrator.publishing.publisher import get_producer_app
from orchestrator.runtime.process import Runtime
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore

# Never resolved: the mock transport answers every request to it.
INSTANT_BASE_URL = "http://instant-model.invalid/v1"
INSTANT_MODEL = "scripted:plan"
# Names the file that holds the model's CPU seconds so far (`ModelClock`); unset: not counted.
MODEL_CPU_FILE_ENV = "BENCH_MODEL_CPU_FILE"


class ModelClock:
    """The CPU seconds the in-process model used, rewritten in a file after each reply.

    The mock transport calls the model in the event loop's thread, so the thread's CPU clock measures
    the model alone."""

    def __init__(self, path: str | None) -> None:
        self.total_s = 0.0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600) if path else None

    def add(self, seconds: float) -> None:
        self.total_s += seconds
        if self._fd is not None:
            os.pwrite(self._fd, f"{self.total_s:.6f}".ljust(24).encode(), 0)


def read_model_cpu_s(path: str) -> float:
    """The model's CPU seconds so far, as `ModelClock` wrote them (0 before its first reply)."""
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return 0.0
    return float(text) if text else 0.0


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


def build_instant_http(clock: ModelClock | None = None) -> httpx.AsyncClient:
    """An httpx client whose every request is answered in-process by the scripted brain."""
    if clock is None:
        return httpx.AsyncClient(transport=httpx.MockTransport(answer))
    counted = clock

    def timed_answer(request: httpx.Request) -> httpx.Response:
        started = time.thread_time()
        try:
            return answer(request)
        finally:
            counted.add(time.thread_time() - started)

    return httpx.AsyncClient(transport=httpx.MockTransport(timed_answer))


def build_settings() -> Settings:
    """Settings from the environment, with the scripted model pointed at the instant transport."""
    return Settings(scripted_base_url=INSTANT_BASE_URL, model=INSTANT_MODEL)


async def serve_instant(settings: Settings) -> None:
    """Run one orchestrator with the instant model until SIGTERM/SIGINT."""
    store = TurnStore.from_url(settings.redis_url, lease_ttl_s=settings.lease_ttl_s)
    clock = ModelClock(os.environ.get(MODEL_CPU_FILE_ENV))
    async with build_instant_http(clock) as http:
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
