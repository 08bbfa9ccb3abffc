"""Model prices end to end: a real `toolloop orchestrator` and prefork worker, with OPENAI_BASE_URL at a local
OpenAI-compatible model server that records every request body and answers any model name by playing the
prompt's plan (the scripted `plan` model).

A model the old hand-kept table lacked is priced from genai-prices' list and keeps a dollar budget; a model
nothing prices is told of in one log line however many calls it makes; a gateway's alias costs the price of
the model it stands for while the server is asked for the alias.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.client.redis_client import Client
from orchestrator.model import TurnOutcome
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.plans import marked_plan_prompt
from tests.support.processes import WorkerHandle
from tests.support.turns import wait_outcome

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALIASES = {"openai:gw-model": "openai:gpt-5-mini"}
# gpt-5-mini's list price, USD per million tokens (genai-prices, as locked).
GPT_5_MINI_INPUT_USD, GPT_5_MINI_OUTPUT_USD = 0.25, 2.00
UNPRICED_AT_START = "openai:unpriced-fast-tier"
ADD_ROUND = {"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}


class _AsPlan:
    """ASGI middleware: a request for a model the scripted server does not know is played as `plan`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body"))
        body = json.loads(b"".join(chunks) or b"{}")
        if isinstance(body, dict) and not str(body.get("model", "")).startswith(("plan", "scripted:")):
            body["model"] = "plan"
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

        await self.app(scope, replay, send)


class AnyModelServer(RecordingModelServer):
    """The recording model server (it keeps each body as sent), answering any model name as `plan`."""

    def __init__(self) -> None:
        super().__init__()
        # Inside the recorder, so that the recorded body names the model the orchestrator asked for.
        recorder: Any = self._server.config.app
        recorder.app = _AsPlan(recorder.app)


@pytest.fixture(scope="module")
def any_model_server() -> Iterator[AnyModelServer]:
    with AnyModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def priced_orchestrator(
    module_redis: RedisServer, any_model_server: AnyModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    env = {
        "TOOLLOOP_METRICS_PORT": str(find_free_port()),
        "OPENAI_BASE_URL": any_model_server.base_url,
        "TOOLLOOP_MODEL_ALIASES": json.dumps(ALIASES),
        "TOOLLOOP_MODEL_FAST": UNPRICED_AT_START,
    }
    handle = start_orchestrator(module_redis.url, model_base_url=any_model_server.base_url, env=env)
    yield handle
    handle.stop()


@pytest.fixture
def ready_client(client: Client, priced_orchestrator: OrchestratorHandle) -> Client:
    return client


def bodies_with(server: RecordingModelServer, marker: str) -> list[dict[str, Any]]:
    return [body for body in server.requests() if marker in json.dumps(body)]


def lines_naming(handle: OrchestratorHandle, *words: str) -> list[str]:
    return [line for line in handle.log_text().splitlines() if all(word in line for word in words)]


def run_turn(
    client: Client, model: str, rounds: list[dict[str, Any]], **options: Any
) -> tuple[TurnOutcome, str]:
    prompt, marker = marked_plan_prompt(rounds)
    turn_id = client.submit(prompt=prompt, tools=["e2e_add"], model=model, **options)
    return wait_outcome(client, turn_id), marker


def test_a_model_the_old_table_lacked_keeps_a_dollar_budget(
    ready_client: Client, any_model_server: AnyModelServer
) -> None:
    outcome, marker = run_turn(
        ready_client, "openai:gpt-5.1", [ADD_ROUND, {"text": "5"}], limits={"max_cost_usd": 1.0}
    )
    assert (outcome.status, outcome.text, outcome.llm_calls) == ("completed", "5", 2), outcome
    assert outcome.usage.cost_usd is not None and outcome.usage.cost_usd > 0
    assert all(record.usage.cost_usd for record in outcome.llm_call_records)
    assert [body["model"] for body in bodies_with(any_model_server, marker)] == ["gpt-5.1", "gpt-5.1"]


def test_an_unpriced_model_is_told_of_in_one_line_however_many_calls_it_makes(
    ready_client: Client, priced_orchestrator: OrchestratorHandle
) -> None:
    model = "openai:local-unpriced-model"
    rounds = [{"calls": [{"name": "e2e_add", "arguments": {"a": n, "b": 1}}]} for n in range(3)]
    outcome, _ = run_turn(ready_client, model, [*rounds, {"text": "done"}])
    assert (outcome.status, outcome.llm_calls) == ("completed", 4), outcome
    assert outcome.usage.cost_usd is None
    again, _ = run_turn(ready_client, model, [{"text": "again"}])
    assert again.status == "completed", again
    (line,) = lines_naming(priced_orchestrator, "TOOLLOOP_MODEL_PRICES", f"model {model}:")
    assert "TOOLLOOP_CONTEXT_WINDOWS" in line and "32,768 tokens" in line
    # The configured tier is told of at start; the default scripted model, priced models and aliases never.
    assert len(lines_naming(priced_orchestrator, f"model {UNPRICED_AT_START}:")) == 1
    assert lines_naming(priced_orchestrator, "model scripted:") == []
    assert lines_naming(priced_orchestrator, "model openai:gpt-5.1:") == []
    assert lines_naming(priced_orchestrator, "model openai:gw-model:") == []


def test_a_gateway_alias_costs_its_models_price_and_the_server_is_asked_for_the_alias(
    ready_client: Client, any_model_server: AnyModelServer
) -> None:
    outcome, marker = run_turn(ready_client, "openai:gw-model", [ADD_ROUND, {"text": "5"}])
    assert (outcome.status, outcome.llm_calls) == ("completed", 2), outcome
    used = outcome.usage
    assert used.input_tokens > 0 and used.output_tokens > 0
    expected = (used.input_tokens * GPT_5_MINI_INPUT_USD + used.output_tokens * GPT_5_MINI_OUTPUT_USD) / 1e6
    assert used.cost_usd == pytest.approx(expected)
    assert [body["model"] for body in bodies_with(any_model_server, marker)] == ["gw-model", "gw-model"]
