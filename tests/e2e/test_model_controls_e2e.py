"""Model controls end to end: a real `toolloop orchestrator` and prefork worker, the scripted model
behind a server that records every request body, turns submitted through the Python client, the CLI and the
HTTP API.

What reaches the provider (instructions, every setting, the answer's schema) is read from the recorded bodies
and checked against OpenAI's published schema; what comes back (the parsed `output`, retries, fallback,
budgets, approvals with edits and denials with reasons) from the outcome and the recorded bodies.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pydantic import BaseModel

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer, find_free_port
from tests.docs.blocks import python_block
from tests.openapi_schemas import assert_valid
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.plans import marked_plan_prompt
from tests.support.processes import TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.served import answers, serving_api, start_python
from tests.support.turns import wait_outcome
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


class Weather(BaseModel):
    city: str
    celsius: float


PARIS = {"city": "Paris", "celsius": 21.5}
ORCHESTRATORS_SMART = "anthropic:claude-sonnet-4-5"


def bodies_with(server: RecordingModelServer, marker: str) -> list[dict[str, Any]]:
    return [body for body in server.requests() if marker in json.dumps(body)]


@pytest.fixture(scope="module")
def e2e_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    # The demo's tools too: the models guide's typed-answer example offers get_weather.
    handle = start_worker(module_redis.url, [E2E_TOOLS, "workers.examples"], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator_process(
    module_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    # The orchestrator knows a tier this test process does not: a submit naming it cannot be checked here.
    env = {"TOOLLOOP_METRICS_PORT": str(find_free_port()), "TOOLLOOP_MODEL_SMART": ORCHESTRATORS_SMART}
    handle = start_orchestrator(module_redis.url, model_base_url=model_server.base_url, env=env)
    yield handle
    handle.stop()


@pytest.fixture
def ready_client(client: Client, orchestrator_process: OrchestratorHandle) -> Client:
    return client


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer, orchestrator_process: OrchestratorHandle) -> Iterator[str]:
    with serving_api(module_redis.url) as url:
        yield url


def run_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url}
    return subprocess.run(
        [str(TOOLLOOP_BIN), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


# --- what reaches the provider -----------------------------------------------------------------------------


def test_instructions_and_every_setting_reach_the_provider_in_a_valid_body(
    ready_client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt([{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}])
    settings = {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_output_tokens": 300,
        "stop": ["END"],
        "seed": 7,
        "reasoning_effort": "low",
        "parallel_tool_calls": False,
        "extra": {"top_k": 40},
    }
    instructions = "You are terse. Never guess."
    turn_id = ready_client.submit(
        prompt=prompt,
        tools=["e2e_add"],
        model="scripted:plan",
        instructions=instructions,
        model_settings=settings,
    )
    outcome = wait_outcome(ready_client, turn_id)
    assert outcome.status == "completed", outcome
    bodies = bodies_with(model_server, marker)
    assert len(bodies) == 2  # the tool call, then the answer: every call carries them all
    for body in bodies:
        assert_valid(body, "CreateChatCompletionRequest")
        first = body["messages"][0]
        assert first["role"] in ("system", "developer") and first["content"] == instructions
        assert sum(instructions in json.dumps(m) for m in body["messages"]) == 1
        assert (body["temperature"], body["top_p"], body["max_completion_tokens"]) == (0.3, 0.9, 300)
        assert (body["stop"], body["seed"], body["reasoning_effort"]) == (["END"], 7, "low")
        assert (body["parallel_tool_calls"], body["top_k"]) == (False, 40)
    # Kept out of the stored conversation: a later turn of it may say something else.
    assert all(m.role != "system" for m in outcome.messages)
    assert instructions not in json.dumps([m.model_dump(mode="json") for m in outcome.messages])


def test_a_setting_the_provider_cannot_honour_is_refused_and_nothing_is_stored(
    ready_client: Client, module_redis_client: redis.Redis, module_redis: RedisServer
) -> None:
    before = module_redis_client.llen(keys.TURN_QUEUE)
    with pytest.raises(ValueError, match=r"model_settings\.seed: seed is not supported by anthropic"):
        ready_client.submit(
            prompt="hi", model=["scripted:plan", "anthropic:claude-x"], model_settings={"seed": 1}
        )
    done = run_cli(
        module_redis.url, "submit", "--prompt", "hi", "--model", "openai_responses:gpt-x", "--stop", "X"
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: model_settings.stop: stop is not supported by openai_responses")
    assert len(done.stderr.strip().splitlines()) == 1
    assert module_redis_client.llen(keys.TURN_QUEUE) == before


def test_a_setting_the_orchestrators_model_cannot_honour_fails_the_turn_before_any_call(
    ready_client: Client, model_server: RecordingModelServer
) -> None:
    # Only the orchestrator resolves "smart" (to Anthropic, which has no seed): it refuses, never drops it.
    assert "TOOLLOOP_MODEL_SMART" not in os.environ
    marker = f"refused-{uuid.uuid4().hex}"
    turn_id = ready_client.submit(
        prompt=marker, model="smart", model_settings={"seed": 5, "temperature": 1.7}
    )
    outcome = wait_outcome(ready_client, turn_id, timeout_s=60)
    assert (outcome.status, outcome.stop_reason, outcome.llm_calls) == ("failed", "provider_error", 0)
    assert outcome.error is not None and outcome.error.type == "unsupported_setting"
    assert "model_settings.seed: seed is not supported by anthropic" in outcome.error.message
    assert "temperature above 1 is not supported by anthropic" in outcome.error.message
    assert bodies_with(model_server, marker) == []


# --- a typed answer ----------------------------------------------------------------------------------------


def test_an_answer_breaking_the_schema_is_retried_with_the_errors_then_parsed(
    ready_client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt([{"text": "It is sunny and warm."}, {"text": json.dumps(PARIS)}])
    turn_id = ready_client.submit(prompt=prompt, model="scripted:plan", output_schema=Weather)
    outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.status, outcome.llm_calls, outcome.output) == ("completed", 2, PARIS), outcome
    assert outcome.parse(Weather) == Weather(city="Paris", celsius=21.5)
    first, second = bodies_with(model_server, marker)
    for body in (first, second):
        assert_valid(body, "CreateChatCompletionRequest")
        assert body["response_format"]["type"] == "json_schema"
        assert (
            body["response_format"]["json_schema"]["schema"]["properties"]
            == Weather.model_json_schema()["properties"]
        )
    # The retry shows the model its answer and what was wrong with it.
    sent_back = json.dumps(second["messages"][len(first["messages"]) :])
    assert "It is sunny and warm." in sent_back
    assert "JSON" in sent_back or "json" in sent_back


def test_an_answer_that_never_fits_ends_invalid_output_after_the_retries(
    ready_client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt([{"text": '{"city": "Paris"}', "repeat": True}])
    limits = {"max_output_retries": 1, "repeat_guard_rounds": None}
    turn_id = ready_client.submit(prompt=prompt, model="scripted:plan", output_schema=Weather, limits=limits)
    outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.stop_reason, outcome.output, outcome.llm_calls) == ("invalid_output", None, 2), outcome
    assert len(bodies_with(model_server, marker)) == 2
    sent_back = json.dumps(bodies_with(model_server, marker)[1]["messages"])
    assert "celsius" in sent_back  # the missing property is named
    with pytest.raises(ValueError, match="has no output"):
        outcome.parse(Weather)


def test_the_cli_sends_its_flags_and_prints_the_output(
    module_redis: RedisServer, orchestrator_process: OrchestratorHandle, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt([{"text": json.dumps(PARIS)}])
    schema = json.dumps(Weather.model_json_schema())
    done = run_cli(
        module_redis.url,
        *("submit", "--prompt", prompt, "--model", "scripted:plan", "--wait", "--timeout", "30"),
        *("--instructions", "Be brief.", "--temperature", "0.5", "--max-output-tokens", "64"),
        *("--no-parallel-tool-calls", "--setting", "top_k=5", "--setting", 'logit_bias={"50256": -100}'),
        *("--output-schema", schema, "--max-output-retries", "0", "--max-total-tokens", "100000"),
        *("--max-model-retries", "1"),
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    with Client(module_redis.url) as reader:
        limits = reader.get(printed["turn_id"]).request.limits
    assert (limits.max_output_retries, limits.max_model_retries, limits.max_total_tokens) == (0, 1, 100000)
    assert (printed["status"], printed["output"]) == ("completed", PARIS)
    assert TurnOutcome.model_validate(printed).parse(Weather).celsius == 21.5
    (body,) = bodies_with(model_server, marker)
    assert_valid(body, "CreateChatCompletionRequest")
    assert (body["temperature"], body["max_completion_tokens"], body["top_k"]) == (0.5, 64, 5)
    assert body["logit_bias"] == {"50256": -100} and body["messages"][0]["content"] == "Be brief."
    assert body["parallel_tool_calls"] is False and body["tools"]  # every public tool is offered


def test_the_http_api_takes_the_same_fields(
    api_url: str, ready_client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt([{"text": json.dumps(PARIS)}])
    turn = {
        "prompt": prompt,
        "model": ["scripted:plan"],
        "instructions": "Answer in JSON.",
        "model_settings": {"seed": 3},
        "output_schema": Weather.model_json_schema(),
    }
    reply = httpx.post(f"{api_url}/v1/turns", json=turn, timeout=10)
    assert reply.status_code == 202, reply.text
    outcome = wait_outcome(ready_client, reply.json()["id"])
    assert outcome.output == PARIS
    shown = httpx.get(f"{api_url}/v1/turns/{reply.json()['id']}", timeout=10).json()
    assert shown["outcome"]["output"] == PARIS and shown["request"]["instructions"] == "Answer in JSON."
    (body,) = bodies_with(model_server, marker)
    assert body["seed"] == 3
    refused = httpx.post(
        f"{api_url}/v1/turns",
        json={"prompt": "x", "model": "anthropic:claude-x", "model_settings": {"seed": 3}},
        timeout=10,
    )
    assert refused.status_code == 422
    (error,) = refused.json()["detail"]
    assert (error["type"], error["loc"]) == ("unsupported_setting", ["body", "model_settings", "seed"])
    assert "seed is not supported by anthropic" in error["msg"]


# --- fallback and budgets ----------------------------------------------------------------------------------


def test_a_model_answering_503_falls_back_to_the_next_in_the_list(
    ready_client: Client, model_server: RecordingModelServer
) -> None:
    down = {"error": {"status": 503, "message": "overloaded", "model": "plan-down"}}
    prompt, marker = marked_plan_prompt([down, {"text": "answered by the fallback"}])
    limits = {"max_model_retries": 1}
    turn_id = ready_client.submit(prompt=prompt, model=["scripted:plan-down", "scripted:plan"], limits=limits)
    outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.status, outcome.text) == ("completed", "answered by the fallback"), outcome
    asked = [body["model"] for body in bodies_with(model_server, marker)]
    assert asked == ["plan-down", "plan-down", "plan"]  # the call, its one retry, then the next model
    assert outcome.llm_call_records[-1].model in ("scripted:plan", "plan")


def test_max_total_tokens_stops_a_tool_calling_turn_once_spent(ready_client: Client) -> None:
    budget = 600
    rounds = [{"calls": [{"name": "e2e_add", "arguments": {"a": 1, "b": 2}}], "repeat": True}]
    prompt, _ = marked_plan_prompt(rounds)
    limits = {"max_total_tokens": budget, "max_llm_calls": 20, "repeat_guard_rounds": None}
    turn_id = ready_client.submit(prompt=prompt, tools=["e2e_add"], model="scripted:plan", limits=limits)
    outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.stop_reason, outcome.limit_reached) == ("max_total_tokens", True), outcome
    spent = [record.usage.total_tokens for record in outcome.llm_call_records]
    assert outcome.usage.total_tokens == sum(spent) >= budget
    assert sum(spent[:-1]) < budget  # it went on while under budget, and stopped once spent
    assert outcome.llm_calls >= 2


# --- approvals with edits and reasons ----------------------------------------------------------------------


def test_an_approval_with_edited_arguments_runs_the_edited_call(
    ready_client: Client, api_url: str, module_redis_client: redis.Redis
) -> None:
    suffix = uuid.uuid4().hex[:8]
    asked, edited = f"alice-{suffix}", f"bob-{suffix}"
    prompt, _ = marked_plan_prompt(
        [{"calls": [{"name": "e2e_transfer", "arguments": {"amount": 500, "to": asked}}]}]
    )
    turn_id = ready_client.submit(prompt=prompt, model="scripted:plan")
    wait_until(lambda: ready_client.get(turn_id).pending_approvals, "the call to wait for approval")
    # Edited arguments that break the tool's schema are refused before anything is recorded.
    with pytest.raises(ValueError, match="amount"):
        ready_client.approve(turn_id, "call_r0_0", True, arguments={"amount": "lots", "to": edited})
    bad = httpx.post(
        f"{api_url}/v1/turns/{turn_id}/approvals/call_r0_0",
        json={"approved": True, "arguments": {"to": edited}},
        timeout=10,
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "arguments"]
    assert "amount" in bad.json()["detail"][0]["msg"]
    assert ready_client.get(turn_id).status.value == "waiting"
    assert ready_client.approve(turn_id, "call_r0_0", True, arguments={"amount": 5, "to": edited})
    outcome = wait_outcome(ready_client, turn_id)
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.content == f"sent 5.0 to {edited}"
    assert int(module_redis_client.get(f"{COUNTER_PREFIX}transfer:{edited}") or 0) == 1
    assert module_redis_client.get(f"{COUNTER_PREFIX}transfer:{asked}") is None


def test_a_denials_reason_reaches_the_models_next_request(
    ready_client: Client, module_redis: RedisServer, model_server: RecordingModelServer
) -> None:
    prompt, marker = marked_plan_prompt(
        [
            {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 9, "to": "carol"}}]},
            {"text": "Understood."},
        ]
    )
    limits = {"stop_on_confirmation_denied": False}
    turn_id = ready_client.submit(prompt=prompt, model="scripted:plan", limits=limits)
    wait_until(lambda: ready_client.get(turn_id).pending_approvals, "the call to wait for approval")
    reason = "carol was paid last week"
    done = run_cli(module_redis.url, "approve", turn_id, "call_r0_0", "--deny", "--reason", reason)
    assert (done.returncode, done.stdout.strip()) == (0, "denied"), done.stderr
    outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.status, outcome.text) == ("completed", "Understood."), outcome
    last = bodies_with(model_server, marker)[-1]
    (tool_message,) = [m for m in last["messages"] if m["role"] == "tool"]
    assert reason in tool_message["content"]
    again = run_cli(module_redis.url, "approve", turn_id, "call_r0_0")
    assert again.returncode == 1 and "already ended" in again.stderr


# --- the models guide's example -----------------------------------------------------------------------------


def check_typed_answer_example(block: str, redis_url: str, app_dir: Path) -> None:
    """Serve `block` (the models guide's FastAPI app) under uvicorn; its typed answer comes from the demo
    model and the real `get_weather` tool."""
    (app_dir / "readme_typed.py").write_text(block)
    port = find_free_port()
    served = start_python(
        ["-m", "uvicorn", "readme_typed:app", "--port", str(port), "--app-dir", str(app_dir)],
        env={"TOOLLOOP_REDIS_URL": redis_url},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        served.wait_for(lambda: answers(f"{url}/docs"), "the docs' app answers")
        reply = httpx.get(f"{url}/weather", params={"city": "Paris"}, timeout=60)
        assert reply.status_code == 200, (reply.text, served.log_text())
        answer = reply.json()
        assert answer["city"] == "Paris" and isinstance(answer["temperature"], float) and answer["conditions"]
    finally:
        served.kill()


def test_the_docs_typed_answer_example_runs(
    module_redis: RedisServer, orchestrator_process: OrchestratorHandle, tmp_path: Path
) -> None:
    check_typed_answer_example(
        python_block("docs/guides/models.md", "weather_app.py"), module_redis.url, tmp_path
    )
