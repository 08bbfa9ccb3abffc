"""Model rate limits shared by the fleet, on real processes: two `toolloop orchestrator`s, a prefork worker,
and an OpenAI-compatible model server that enforces a sliding window of requests with OpenAI's 429s and
headers (`tests.support.rate_limited_model`).

A burst of turns, each one tool call then a final answer, asks for three times what the window allows. With
TOOLLOOP_MODEL_LIMITS at the server's limit the fleet paces itself and every turn completes with almost no
429; without it, the provider's own headers (remaining 0, the reset) and its 429s pause the model for the
whole fleet, which keeps refusals well under a fleet that does not listen (docs/guides/models.md, "Rate
limits shared by the fleet", has the figures).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from orchestrator import Client
from orchestrator.redis_server import RedisServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.rate_limited_model import RateLimitedModelServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "openai:plan"
LIMIT = 20
WINDOW_S = 5.0
TURNS = 30  # 60 model requests: three windows' worth at once
DEADLINE_S = 120.0
# The server's limit as the setting states it: 20 per 5 s is 240 a minute, counted over the same window.
LIMITS = json.dumps({MODEL: {"requests_per_minute": LIMIT * 60 / WINDOW_S, "window_s": WINDOW_S}})


@dataclass(frozen=True)
class Burst:
    """What one burst came to: the turns' stop reasons, and what the server accepted and refused."""

    stop_reasons: Counter[str]
    accepted: int
    refused: int

    @property
    def refused_share(self) -> float:
        return self.refused / (self.accepted + self.refused)


@pytest.fixture
def worker(own_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(own_redis.url, ["tests.support.tools"], concurrency=2)
    yield handle
    handle.stop()


def run_burst(redis_url: str, env: dict[str, str]) -> Burst:
    with RateLimitedModelServer(limit=LIMIT, window_s=WINDOW_S) as server:
        fleet: list[OrchestratorHandle] = []
        try:
            for _ in range(2):
                fleet.append(start_orchestrator(redis_url, env={"OPENAI_BASE_URL": server.base_url, **env}))
            client = Client(redis_url)
            plan = {"plan": [{"calls": [{"name": "echo", "arguments": {"text": "paced"}}]}]}
            turn_ids = [
                client.submit(
                    prompt=json.dumps(plan), tools=["echo"], model=MODEL, limits={"deadline_s": DEADLINE_S}
                )
                for _ in range(TURNS)
            ]
            outcomes = [client.wait(turn_id, DEADLINE_S + 30) for turn_id in turn_ids]
        finally:
            for handle in fleet:
                handle.stop()
        reasons = Counter(o.stop_reason or o.status for o in outcomes)
        burst = Burst(reasons, server.accepted, server.refused)
    print(f"\n{env or 'no limits'}: {burst}, refused {burst.refused_share:.1%}")
    return burst


def test_a_fleet_with_the_limit_stays_under_it(own_redis: RedisServer, worker: WorkerHandle) -> None:
    burst = run_burst(own_redis.url, {"TOOLLOOP_MODEL_LIMITS": LIMITS})
    assert burst.stop_reasons == Counter({"completed": TURNS})
    assert burst.refused_share < 0.05


def test_without_the_limit_the_headers_pause_the_fleet(own_redis: RedisServer, worker: WorkerHandle) -> None:
    burst = run_burst(own_redis.url, {})
    assert burst.stop_reasons == Counter({"completed": TURNS})
    assert burst.refused_share < 0.25
