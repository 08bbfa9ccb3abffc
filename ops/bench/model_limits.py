"""What the fleet's model rate limits cost a model call: the orchestrator's CPU, Redis's CPU and round trips.

The same model calls three ways, on one Redis and the bench's OpenAI-compatible model server
(`http_model`, its own process): bare (the HTTP client alone), with the pause check every call makes
(`ModelLimiter` with no TOOLLOOP_MODEL_LIMITS: one script call before, none after unless the provider asks
for a pause), and with a budget of requests and tokens (one script call before and one after). Calls run
`CONCURRENCY` at a time, as an orchestrator's turns do; the budget is set far above what the run asks, so
nothing waits and only the accounting is measured. Figures are per call, and each limited run is compared
with the bare one measured in the same run.

    python -m ops.bench.model_limits [--calls N]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import redis
import typer

from ops.bench.http_model import ModelServer
from ops.bench.report import Metric
from orchestrator.model import Turn, UserMessage
from orchestrator.model_limits import Granted, ModelLimit, build_settlement
from orchestrator.providers import openai_chat
from orchestrator.providers.base import HttpModelClient, ModelRequest, RetryPolicy
from orchestrator.providers.rate_limits import RateLimitSignal
from orchestrator.redis_server import RedisServer
from orchestrator.store.connection import connect_async
from orchestrator.store.rate_limits import ModelLimiter

MODEL = "openai:echo"
CONCURRENCY = 20
UNLIMITED = ModelLimit(requests_per_minute=10_000_000, tokens_per_minute=1_000_000_000)


@dataclass(frozen=True)
class Run:
    """One way of calling, per call: this process's CPU (µs), Redis's CPU (µs), Redis round trips."""

    cpu_us: float
    redis_cpu_us: float
    round_trips: float


async def _calls(client: HttpModelClient, limiter: ModelLimiter | None, calls: int) -> None:
    async def one(number: int) -> None:
        signals: list[RateLimitSignal] = []
        granted = None
        if limiter is not None:
            admission = await limiter.admit(MODEL, 200, f"bench:{number}")
            assert not hasattr(admission, "wait_s"), admission
            granted = admission
        request = ModelRequest(
            model="echo",
            messages=[UserMessage(content=f"say {number}")],
            stream=False,
            on_rate_limits=signals.append if limiter is not None else None,
        )
        answer = await client.complete(request)
        assert isinstance(answer, Turn), answer
        if limiter is not None and isinstance(granted, Granted):
            settlement = build_settlement(granted, 0.0, answer.usage.total_tokens or None, signals)
            if settlement is not None:
                await limiter.settle(granted, settlement)

    queue = iter(range(calls))

    async def worker() -> None:
        for number in queue:
            await one(number)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _redis_counters(client: redis.Redis) -> tuple[float, float]:
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    # The limiter's only commands are its script calls: a script's own commands are counted apart.
    commands = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], float(commands)


async def _measure(base_url: str, redis_url: str, limits: dict[str, ModelLimit] | None, calls: int) -> Run:
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    store = connect_async(redis_url, "required")
    async with httpx.AsyncClient() as http:
        client = HttpModelClient(
            "openai", openai_chat, http, f"{base_url}/chat/completions", retry=RetryPolicy(max_retries=0)
        )
        limiter = None if limits is None else ModelLimiter(store, limits)
        await _calls(client, limiter, CONCURRENCY)  # warm: connections, scripts loaded
        redis_cpu, commands = _redis_counters(sync)
        cpu = time.process_time()
        await _calls(client, limiter, calls)
        cpu = time.process_time() - cpu
        redis_cpu_after, commands_after = _redis_counters(sync)
    await store.aclose()
    sync.close()
    return Run(
        cpu_us=cpu / calls * 1e6,
        redis_cpu_us=(redis_cpu_after - redis_cpu) / calls * 1e6,
        round_trips=(commands_after - commands) / calls,
    )


def run_model_limits(calls: int, emit: Callable[[Metric], None], progress: Callable[[str], None]) -> None:
    """Measure the three ways (see the module) and emit the limited ones against the bare one."""
    progress(f"model limits: {calls} model calls, three ways")
    model = ModelServer()
    server = RedisServer().start()
    try:
        model.wait_ready()
        ways: dict[str, dict[str, ModelLimit] | None] = {
            "bare": None,
            "pause_check": {},
            "budget": {MODEL: UNLIMITED},
        }
        # Twice each, interleaved, the lower CPU of the two kept: one run's noise is not the limiter's cost.
        runs: dict[str, list[Run]] = {name: [] for name in ways}
        for _ in range(2):
            for name, limits in ways.items():
                runs[name].append(asyncio.run(_measure(model.base_url, server.url, limits, calls)))
        bare = min(runs["bare"], key=lambda r: r.cpu_us)
        for name in ("pause_check", "budget"):
            run = min(runs[name], key=lambda r: r.cpu_us)
            cpu_ratio = run.cpu_us / bare.cpu_us
            emit(
                Metric(
                    f"model_limits.{name}.orchestrator_cpu_per_call",
                    run.cpu_us,
                    "us",
                    baseline=bare.cpu_us,
                    ratio=cpu_ratio,
                    extra={
                        "redis_cpu_us_per_call": round(run.redis_cpu_us, 1),
                        "redis_round_trips_per_call": round(run.round_trips, 2),
                    },
                )
            )
    finally:
        model.proc.stop()
        server.stop()


def main(calls: int = typer.Option(2000, help="Model calls per way of calling.")) -> None:
    """Print the JSON line of each figure."""
    run_model_limits(calls, lambda metric: print(metric.to_json(), flush=True), lambda _: None)


if __name__ == "__main__":
    typer.run(main)
