"""Gemini, Bedrock and Cohere end to end: a real `toolloop orchestrator` calls them over HTTP at a local
server speaking each one's wire format (`tests.support.wire_models`), a real prefork worker runs the tools,
turns are submitted with the Python client.

Each provider, streamed and not: the model asks for two parallel calls, the worker runs both, and the final
answer quotes both results; the second request carries both results paired with their calls in the
provider's own shape (Gemini's `functionResponse` after its calls, the thought signature back on its part;
Bedrock's `toolResult` by `toolUseId`, its signed reasoning back; Cohere's `tool` messages by `tool_call_id`,
its tool plan back). Bedrock's requests are SigV4-signed and the server checks them: an orchestrator with the
wrong secret fails the turn with Bedrock's 403, once, and an unsigned or altered request is refused too. A
fallback mid-turn: Gemini asks for the calls, then is overloaded, and Cohere finishes the turn from the
history Gemini wrote (its calls and results as text, as toolloop hands another wire family's round to a
model).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from botocore.credentials import Credentials

from orchestrator.client.redis_client import Client, TextDeltaEvent
from orchestrator.model import AssistantMessage, ToolMessage, TurnOutcome
from orchestrator.providers.sigv4 import SigV4Auth
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.turns import wait_outcome
from tests.support.wire_models import (
    ACCESS_KEY_ID,
    FINAL_PREFIX,
    GEMINI_CALLS,
    REGION,
    SECRET_ACCESS_KEY,
    PlannedCall,
    Received,
    WireModelServer,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

GEMINI = "gemini:gemini-2.5-flash"
# A model id with a colon: percent-encoded in the path, and signed so.
BEDROCK = "bedrock:anthropic.claude-3-5-sonnet-20240620-v1:0"
COHERE = "cohere:command-a-03-2025"
CALLS = [PlannedCall("e2e_add", {"a": 2, "b": 3}), PlannedCall("e2e_multiply", {"a": 4, "b": 5})]
TOOLS = [call.name for call in CALLS]
# Written a piece at a time, this far apart: a streamed answer reaches the client as several deltas.
CHUNK_DELAY_S = 0.04
ORCHESTRATOR_ENV = {"TOOLLOOP_STREAM_FLUSH_S": "0.02"}


@pytest.fixture(scope="module")
def wire_server() -> Iterator[WireModelServer]:
    with WireModelServer(CALLS, chunk_delay_s=CHUNK_DELAY_S) as server:
        yield server


@pytest.fixture(scope="module")
def e2e_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, [E2E_TOOLS], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator_process(
    module_redis: RedisServer, wire_server: WireModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    env = {
        **wire_server.provider_env(),
        **ORCHESTRATOR_ENV,
        "TOOLLOOP_METRICS_PORT": str(find_free_port()),
    }
    handle = start_orchestrator(module_redis.url, env=env)
    yield handle
    handle.stop()


@pytest.fixture
def ready_client(client: Client, orchestrator_process: OrchestratorHandle) -> Client:
    return client


def run_turn(client: Client, model: str | list[str], *, stream: bool, **fields: Any) -> tuple[str, str]:
    """Submit a turn offering the planned tools; its id and the marker its prompt holds."""
    marker = f"marker-{uuid.uuid4().hex}"
    prompt = f"Add 2 and 3, and multiply 4 by 5, at once. ({marker})"
    turn_id = client.submit(prompt=prompt, tools=TOOLS, model=model, stream=stream, **fields)
    return turn_id, marker


def results_of(outcome: TurnOutcome) -> list[ToolMessage]:
    return [m for m in outcome.messages if isinstance(m, ToolMessage)]


def calls_of(outcome: TurnOutcome) -> list[tuple[str, str, dict[str, Any]]]:
    """Every tool call of the turn: (id, name, arguments)."""
    return [
        (call.id, call.name, dict(call.arguments))
        for message in outcome.messages
        if isinstance(message, AssistantMessage)
        for call in message.tool_calls
    ]


def check_outcome(outcome: TurnOutcome) -> None:
    """Both calls ran, in one round, and the final answer quotes both results."""
    assert (outcome.status, outcome.llm_calls, outcome.tool_executions) == ("completed", 2, 2), outcome
    assert [(name, arguments) for _, name, arguments in calls_of(outcome)] == [
        (c.name, c.arguments) for c in CALLS
    ]
    results = results_of(outcome)
    assert [r.tool_call_id for r in results] == [call_id for call_id, _, _ in calls_of(outcome)]
    assert all(not r.is_error for r in results), results
    assert outcome.text is not None and outcome.text.startswith(FINAL_PREFIX)
    for result in results:
        assert result.content in outcome.text


def check_gemini(
    first: Received, second: Received, outcome: TurnOutcome, recorded_json: Callable[[str], dict[str, Any]]
) -> None:
    assert first.path == second.path
    assert first.path.startswith("/v1beta/models/gemini-2.5-flash:")
    assert first.headers["x-goog-api-key"]
    user, model, answers = second.body["contents"][-3:]
    assert (user["role"], model["role"], answers["role"]) == ("user", "model", "user")
    calls = [part["functionCall"] for part in model["parts"] if "functionCall" in part]
    assert [(c["name"], c["args"]) for c in calls] == [(c.name, c.arguments) for c in CALLS]
    # The thought signature Gemini gave the first call goes back on that call's part, and only there.
    recorded = recorded_json(GEMINI_CALLS)["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    assert model["parts"][0]["thoughtSignature"] == recorded
    assert "thoughtSignature" not in model["parts"][1]
    responses = [part["functionResponse"] for part in answers["parts"]]
    assert [r["name"] for r in responses] == [c.name for c in CALLS]
    assert [r["response"] for r in responses] == [{"output": m.content} for m in results_of(outcome)]


def check_bedrock(first: Received, second: Received, outcome: TurnOutcome) -> None:
    assert first.path.startswith("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse")
    assert first.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
    assistant, answers = second.body["messages"][-2:]
    assert (assistant["role"], answers["role"]) == ("assistant", "user")
    # The signed reasoning Bedrock wrote goes back first, unchanged.
    reasoning = assistant["content"][0]["reasoningContent"]["reasoningText"]
    assert reasoning["signature"] and reasoning["text"]
    uses = [block["toolUse"] for block in assistant["content"] if "toolUse" in block]
    assert [(u["name"], u["input"]) for u in uses] == [(c.name, c.arguments) for c in CALLS]
    assert [u["toolUseId"] for u in uses] == [call_id for call_id, _, _ in calls_of(outcome)]
    results = [block["toolResult"] for block in answers["content"]]
    assert [r["toolUseId"] for r in results] == [u["toolUseId"] for u in uses]
    assert [r["content"] for r in results] == [[{"text": m.content}] for m in results_of(outcome)]


def check_cohere(first: Received, second: Received, outcome: TurnOutcome) -> None:
    assert first.path == second.path == "/v2/chat"
    assert first.body["model"] == second.body["model"] == "command-a-03-2025"
    assert first.headers["authorization"].startswith("Bearer ")
    messages = second.body["messages"]
    (assistant,) = [m for m in messages if m["role"] == "assistant"]
    assert assistant["tool_plan"].startswith("I will call e2e_add")
    wire_calls = assistant["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in wire_calls] == [
        (c.name, c.arguments) for c in CALLS
    ]
    assert [c["id"] for c in wire_calls] == [call_id for call_id, _, _ in calls_of(outcome)]
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == [c["id"] for c in wire_calls]
    assert [m["content"] for m in tools] == [
        [{"type": "text", "text": r.content}] for r in results_of(outcome)
    ]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
@pytest.mark.parametrize("model", [GEMINI, BEDROCK, COHERE])
def test_two_parallel_calls_run_and_their_results_reach_the_model(
    ready_client: Client, wire_server: WireModelServer, model: str, stream: bool
) -> None:
    turn_id, marker = run_turn(ready_client, model, stream=stream)
    events = list(ready_client.stream(turn_id))
    outcome = wait_outcome(ready_client, turn_id)
    check_outcome(outcome)
    first, second = wire_server.requests(marker=marker)
    assert (first.round, second.round, first.status, second.status) == (0, 1, 200, 200)
    assert first.streamed is second.streamed is stream
    provider = model.partition(":")[0]
    assert first.provider == second.provider == provider
    if provider == "gemini":
        assert first.query == ("alt=sse" if stream else "")
        assert first.path.endswith(":streamGenerateContent" if stream else ":generateContent")
        check_gemini(first, second, outcome, wire_server.recorded.json)
    elif provider == "bedrock":
        assert first.path.endswith("/converse-stream" if stream else "/converse")
        check_bedrock(first, second, outcome)
    else:
        assert ("stream" in first.body) is stream
        check_cohere(first, second, outcome)
    # The final answer's text reached the client as text deltas: in pieces while the model wrote, streamed.
    final_call = outcome.llm_calls - 1
    pieces = [e.text for e in events if isinstance(e, TextDeltaEvent) and e.llm_call == final_call]
    assert "".join(pieces) == outcome.text
    if stream:
        assert len(pieces) >= 2, pieces


def test_a_fallback_mid_turn_carries_geminis_calls_and_results_to_cohere(
    ready_client: Client, wire_server: WireModelServer
) -> None:
    with wire_server.overloaded("gemini", from_round=1):
        turn_id, marker = run_turn(
            ready_client, [GEMINI, COHERE], stream=True, limits={"max_model_retries": 0}
        )
        outcome = wait_outcome(ready_client, turn_id)
    assert (outcome.status, outcome.llm_calls, outcome.tool_executions) == ("completed", 3, 2), outcome
    asked = [(r.provider, r.round, r.status) for r in wire_server.requests(marker=marker)]
    assert asked == [("gemini", 0, 200), ("gemini", 1, 503), ("cohere", 1, 200)]
    failed = outcome.llm_call_records[1].error
    assert failed is not None and (failed.status, failed.type) == (503, "UNAVAILABLE")
    assert [r.provider for r in outcome.llm_call_records] == ["gemini", "gemini", "cohere"]
    results = results_of(outcome)
    assert outcome.text is not None and outcome.text.startswith(FINAL_PREFIX)
    for result in results:
        assert result.content in outcome.text
    # Cohere reads the round Gemini wrote as the view gives another wire family's calls (`machine.view`):
    # the calls and each result as assistant text, in order, and nothing of Gemini's own (no signature).
    (cohere,) = wire_server.requests(marker=marker, provider="cohere")
    messages = cohere.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "assistant"]
    described = [f"[Tool call: {c.name}] {json.dumps(c.arguments, sort_keys=True)}" for c in CALLS]
    assert messages[1]["content"] == "\n".join(described)
    assert [m["content"] for m in messages[2:]] == [f"[Tool result: {r.name}] {r.content}" for r in results]
    assert not any("tool_calls" in m for m in messages)
    assert "thoughtSignature" not in json.dumps(cohere.body)


def test_bedrock_refuses_a_request_signed_with_the_wrong_secret(
    own_redis: RedisServer, wire_server: WireModelServer
) -> None:
    # An orchestrator of its own, on a Redis of its own: it signs with a secret the server does not hold.
    env = {
        **wire_server.provider_env(secret_access_key="not/the/secret/the/server/holds/00000000"),
        **ORCHESTRATOR_ENV,
        "TOOLLOOP_METRICS_PORT": str(find_free_port()),
    }
    handle = start_orchestrator(own_redis.url, env=env)
    try:
        with Client(own_redis.url) as client:
            marker = f"marker-{uuid.uuid4().hex}"
            turn_id = client.submit(prompt=f"Hello ({marker})", model=BEDROCK)
            outcome = wait_outcome(client, turn_id)
    finally:
        handle.stop()
    assert (outcome.status, outcome.stop_reason, outcome.llm_calls) == ("failed", "provider_error", 1)
    assert outcome.error is not None
    assert (outcome.error.status, outcome.error.type) == (403, "InvalidSignatureException")
    assert "signature we calculated does not match" in outcome.error.message
    (refused,) = wire_server.requests(marker=marker)
    assert (refused.provider, refused.status) == ("bedrock", 403)
    assert refused.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")


async def test_bedrocks_check_refuses_an_unsigned_or_altered_request(wire_server: WireModelServer) -> None:
    # The orchestrator's signer over a request, then what a man in the middle could change.
    credentials = Credentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    signer = SigV4Auth(REGION, credentials=credentials)
    url = f"{wire_server.base_url}/model/{quote(BEDROCK.partition(':')[2], safe='-._~')}/converse"
    body = json.dumps({"messages": [{"role": "user", "content": [{"text": "signed"}]}]}).encode()
    signed = await signer.authorize("POST", url, {"content-type": "application/json"}, body)
    async with httpx.AsyncClient() as http:
        good = await http.post(url, content=body, headers=signed)
        altered = await http.post(url, content=body.replace(b"signed", b"forged"), headers=signed)
        unsigned = await http.post(url, content=body, headers={"content-type": "application/json"})
    assert good.status_code == 200, good.text
    for refused, exception in ((altered, "InvalidSignatureException"), (unsigned, "MissingAuthentication")):
        assert refused.status_code == 403
        assert refused.headers["x-amzn-errortype"].startswith(exception)
        assert refused.json()["message"]
