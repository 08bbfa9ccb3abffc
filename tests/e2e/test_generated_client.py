"""The API's contract as a stranger's tooling reads it: a client generated from the live `/openapi.json` by
`openapi-python-client` submits a turn (the scripted `demo` model, `workers.examples` tools on a real
prefork worker, a real orchestrator and `toolloop api` with a token) and reads it to its end; and what the
schema declares — operation ids, tags, each answer's schema, the bearer scheme — is what the live API gives.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from orchestrator.redis_server import RedisServer, find_free_port
from tests.openapi_schemas import assert_valid_answer
from tests.support import served
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "generated-client-token"
PACKAGE = "toolloop_api_client"
GENERATOR = Path(sys.executable).with_name("openapi-python-client")
OPERATIONS = {
    ("post", "/v1/turns"): "submitTurn",
    ("get", "/v1/turns"): "listTurns",
    ("get", "/v1/turns/{turn_id}"): "getTurn",
    ("get", "/v1/turns/{turn_id}/events"): "streamTurnEvents",
    ("post", "/v1/turns/{turn_id}/cancel"): "cancelTurn",
    ("post", "/v1/turns/{turn_id}/approvals/{call_id}"): "answerApproval",
    ("post", "/v1/turns/{turn_id}/calls/{call_id}/result"): "submitToolResult",
    ("post", "/v1/turns/{turn_id}/fork"): "forkTurn",
    ("get", "/v1/tools"): "listTools",
    ("post", "/v1/tools/{name}/calls"): "callTool",
    ("get", "/v1/agents"): "listAgents",
    ("put", "/v1/agents/{name}"): "registerAgent",
    ("put", "/v1/schedules/{name}"): "putSchedule",
    ("delete", "/v1/schedules/{name}"): "deleteSchedule",
    ("get", "/v1/schedules"): "listSchedules",
    ("get", "/metrics"): "getMetrics",
    ("get", "/healthz"): "getHealth",
}


@pytest.fixture(scope="module")
def examples_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, ["workers.examples.arithmetic"], concurrency=1)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def api_base_url(module_redis: RedisServer, examples_worker: WorkerHandle) -> Iterator[str]:
    orchestrator: OrchestratorHandle = start_orchestrator(
        module_redis.url, env={"TOOLLOOP_METRICS_PORT": str(find_free_port())}
    )
    try:
        with served.serving_api(module_redis.url, env={"TOOLLOOP_API_TOKEN": TOKEN}) as base_url:
            yield base_url
    finally:
        orchestrator.stop()


@pytest.fixture(scope="module")
def document(api_base_url: str) -> dict[str, Any]:
    reply = httpx.get(f"{api_base_url}/openapi.json", timeout=10).raise_for_status()
    schema: dict[str, Any] = reply.json()
    return schema


@pytest.fixture
def generated(document: dict[str, Any], api_base_url: str, tmp_path: Path) -> Iterator[ModuleType]:
    """The package `openapi-python-client` generates from the live schema, imported."""
    schema_path = tmp_path / "openapi.json"
    schema_path.write_text(httpx.get(f"{api_base_url}/openapi.json", timeout=10).text)
    command = [str(GENERATOR), "generate", "--path", str(schema_path), "--meta", "none"]
    # Its post-generation hooks run ruff, from the same environment.
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(
        [*command, "--output-path", str(tmp_path / PACKAGE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "warning" not in (run.stdout + run.stderr).lower(), run.stdout + run.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def test_a_generated_client_submits_a_turn_and_reads_it_to_its_end(
    generated: ModuleType, api_base_url: str
) -> None:
    submit_turn = importlib.import_module(f"{PACKAGE}.api.turns.submit_turn")
    get_turn = importlib.import_module(f"{PACKAGE}.api.turns.get_turn")
    models = importlib.import_module(f"{PACKAGE}.models")
    with (
        generated.AuthenticatedClient(base_url=api_base_url, token=TOKEN) as client,
        generated.AuthenticatedClient(base_url=api_base_url, token="wrong") as anonymous,
    ):
        body = models.TurnBody(
            prompt="What is 2+3, times 4?", tools=["add", "multiply"], model="scripted:demo"
        )
        reply = submit_turn.sync(client=client, body=body)
        assert isinstance(reply, models.SubmitReply), reply
        turn_id = reply.id

        def finished() -> Any:
            view = get_turn.sync(turn_id, client=client)
            assert isinstance(view, models.TurnView), view
            return view if isinstance(view.outcome, models.TurnOutcome) else None

        view = wait_for(finished, f"turn {turn_id} to finish")
        unknown = get_turn.sync("turn_nope", client=client)
        refused = get_turn.sync_detailed(turn_id, client=anonymous)
    assert view.status == models.TurnStatus.COMPLETED and "20" in view.outcome.text
    tool_results = [m.content for m in view.outcome.messages if isinstance(m, models.ToolMessage)]
    assert tool_results == ["5.0", "20.0"]
    assert isinstance(unknown, models.ErrorBody) and "turn_nope" in unknown.detail
    assert refused.status_code == 401 and isinstance(refused.parsed, models.ErrorBody)


def test_the_schema_names_every_operation_and_the_answers_match_it(
    document: dict[str, Any], api_base_url: str
) -> None:
    operations = {
        (method, path): operation
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    assert {key: op["operationId"] for key, op in operations.items()} == OPERATIONS
    assert document["components"]["securitySchemes"]["bearerToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerToken"]["description"],
    }
    for (method, path), operation in operations.items():
        assert operation["tags"], (method, path)
        for status, answer in operation["responses"].items():
            content = answer.get("content")
            assert content, (method, path, status)  # every answer, 2xx or not, has a schema
            if status.startswith(("4", "5")) and path != "/healthz":
                assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
        open_route = path == "/healthz"
        assert ("security" in operation) != open_route, (method, path)
    events = operations[("get", "/v1/turns/{turn_id}/events")]["responses"]["200"]["content"]
    items = events["text/event-stream"]["itemSchema"]["oneOf"]
    assert {"turn_queued", "text_delta", "tool_finished", "turn_finished"} <= {i["title"] for i in items}

    # What the live API answers is what its schema says, errors included.
    with httpx.Client(base_url=api_base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        submitted = http.post(
            "/v1/turns", json={"prompt": "2+2?", "tools": ["add"], "model": "scripted:demo"}
        )
        turn_id = submitted.json()["id"]
        answers = [
            ("post", "/v1/turns", submitted),
            ("get", "/v1/turns/{turn_id}", http.get(f"/v1/turns/{turn_id}")),
            ("get", "/v1/turns", http.get("/v1/turns")),
            ("get", "/v1/tools", http.get("/v1/tools")),
            ("get", "/healthz", http.get("/healthz")),
            ("get", "/v1/turns/{turn_id}", http.get("/v1/turns/turn_nope")),
            ("post", "/v1/turns", http.post("/v1/turns", json={"prompt": "x", "tools": ["nope"]})),
            ("post", "/v1/turns", http.post("/v1/turns", json={"colour": "red"})),
            ("post", "/v1/turns", http.post("/v1/turns", json={"prompt": "x" * (2 * 1024 * 1024)})),
            ("get", "/v1/turns/{turn_id}", http.get(f"/v1/turns/{turn_id}", headers={"Authorization": ""})),
        ]
        wait_for(lambda: http.get(f"/v1/turns/{turn_id}").json()["outcome"], "the turn to end")
        answers += [
            ("get", "/v1/turns/{turn_id}", http.get(f"/v1/turns/{turn_id}")),
            ("post", "/v1/turns/{turn_id}/cancel", http.post(f"/v1/turns/{turn_id}/cancel")),
        ]
    statuses = [answer.status_code for _, _, answer in answers]
    assert statuses == [202, 200, 200, 200, 200, 404, 422, 422, 413, 401, 200, 409]
    for method, path, answer in answers:
        assert_valid_answer(document, method, path, answer.status_code, answer.json())
