"""Client-side tools on the shipped processes: `toolloop api`, a real `toolloop orchestrator`, a prefork
worker and the scripted model over HTTP. A turn declares a tool its caller runs; the model calls it; the
turn parks until the caller answers over HTTP (`POST /v1/turns/{id}/calls/{call_id}/result`), and the model
reads the answer as the tool's output — or its error, or the timeout when no answer came.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support import served
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.plans import marked_plan_prompt
from tests.support.turns import event_data, wait_outcome
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LOCATE = {
    "name": "locate_user",
    "description": "Where the user is, from their browser.",
    "parameters": {"type": "object", "properties": {"precise": {"type": "boolean"}}, "required": ["precise"]},
}


@pytest.fixture(scope="module")
def api(module_redis: RedisServer, orchestrator_process: OrchestratorHandle) -> Iterator[httpx.Client]:
    with served.serving_api(module_redis.url) as base_url, httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


def submit(api: httpx.Client, limits: dict[str, Any] | None = None) -> tuple[str, str]:
    rounds: list[dict[str, Any]] = [
        {"calls": [{"name": "locate_user", "arguments": {"precise": True}}]},
        {"text": "found you"},
    ]
    prompt, marker = marked_plan_prompt(rounds)
    body = {"prompt": prompt, "model": "scripted:plan", "client_tools": [LOCATE], "limits": limits or {}}
    reply = api.post("/v1/turns", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()["id"], marker


def wait_for_call(api: httpx.Client, turn_id: str) -> dict[str, Any]:
    def waiting() -> dict[str, Any] | None:
        pending = api.get(f"/v1/turns/{turn_id}").json()["pending_approvals"]
        return pending[0] if pending else None

    call = wait_for(waiting, f"turn {turn_id} to wait for its caller")
    assert call["waiting_for"] == "client_result"
    return call


def model_bodies(model_server: RecordingModelServer, marker: str) -> list[str]:
    return [json.dumps(body) for body in model_server.requests() if marker in json.dumps(body)]


def test_a_result_sent_over_http_is_the_tools_output_and_a_second_is_refused(
    api: httpx.Client,
    client: Client,
    model_server: RecordingModelServer,
    module_redis_client: redis.Redis,
) -> None:
    turn_id, marker = submit(api)
    call = wait_for_call(api, turn_id)
    (shown,) = event_data(client.redis, turn_id, "call_waiting")
    assert (shown["waiting_for"], shown["call_id"], shown["arguments"]) == (
        "client_result",
        call["call_id"],
        {"precise": True},
    )
    # The model was offered the tool, with its schema.
    assert "locate_user" in model_bodies(model_server, marker)[0]
    # Parked: no orchestrator holds it while the caller works.
    wait_until(lambda: module_redis_client.zscore(keys.TURNS_PARKED, turn_id), "the turn to be parked")
    path = f"/v1/turns/{turn_id}/calls/{call['call_id']}/result"
    reply = api.post(path, json={"result": {"city": "Lyon"}})
    assert reply.status_code == 202, reply.text
    again = api.post(path, json={"result": {"city": "Paris"}})
    assert again.status_code == 409 and again.json()["code"] in {"call_decided", "call_not_waiting"}
    outcome = wait_outcome(client, turn_id, timeout_s=30)
    assert (outcome.status, outcome.text) == ("completed", "found you")
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert (answer.name, answer.content, answer.is_error) == ("locate_user", '{"city": "Lyon"}', False)
    assert '{\\"city\\": \\"Lyon\\"}' in model_bodies(model_server, marker)[1]


def test_an_error_answer_reaches_the_model_as_the_tools_error(
    api: httpx.Client, client: Client, model_server: RecordingModelServer
) -> None:
    turn_id, marker = submit(api)
    call = wait_for_call(api, turn_id)
    reply = api.post(f"/v1/turns/{turn_id}/calls/{call['call_id']}/result", json={"error": "location denied"})
    assert reply.status_code == 202, reply.text
    outcome = wait_outcome(client, turn_id, timeout_s=30)
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert (answer.is_error, answer.content) == (True, "Error: location denied")
    assert "location denied" in model_bodies(model_server, marker)[1]


def test_no_answer_in_time_is_a_timeout(api: httpx.Client, client: Client) -> None:
    turn_id, _ = submit(api, {"client_tool_timeout_s": 2})
    outcome = wait_outcome(client, turn_id, timeout_s=30)
    assert outcome.status == "completed"
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.failure_kind is FailureKind.TIMEOUT
    assert answer.content == "Error: the caller sent no result for 'locate_user' within 2 s"


def test_a_client_tool_may_not_take_a_catalogue_tools_name(api: httpx.Client) -> None:
    taken = {**LOCATE, "name": "e2e_add"}
    wait_until(lambda: api.get("/v1/tools").json() or None, "the worker's catalogue")
    reply = api.post("/v1/turns", json={"prompt": f"p-{uuid.uuid4().hex}", "client_tools": [taken]})
    assert reply.status_code == 422
    assert "e2e_add" in json.dumps(reply.json())
