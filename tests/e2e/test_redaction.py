"""What a person is shown of a turn is redacted; what its tool receives and what is stored is not.

A real turn on the whole system (Redis, a prefork worker, `toolloop orchestrator`, the scripted `plan` model
over HTTP) calls `secret_login` with a password and an API key, under a context holding a password. Every
place a person looks — `Client.get` / `wait` / `outcome`, `AsyncClient.get`, `toolloop show`,
`toolloop submit --wait`, `GET /v1/turns/{id}`, the events, the logs — shows `***` instead; the tool's answer
proves it got the password whole, and the turn stored in Redis keeps it. The user's own text is free text,
shown as written: the `plan` model reads its calls from it, so the checks leave it out.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from orchestrator import AsyncClient
from orchestrator.api.app import create_app
from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from tests.support.api_server import serve_app
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle, start_worker
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def e2e_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    """This module's worker also serves `secret_login`, whose arguments carry secrets."""
    handle = start_worker(module_redis.url, [E2E_TOOLS, "tests.security.secret_tools"], concurrency=2)
    yield handle
    handle.stop()


class Secrets:
    """Values unique to one test, so that finding one anywhere can only mean it leaked."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex
        self.password = f"hunter2-{tag}"
        self.api_key = f"sk-live-{tag}"
        self.context_password = f"ctx-pass-{tag}"

    def prompt(self) -> str:
        arguments = {
            "user": "alice",
            "password": self.password,
            "api_key": self.api_key,
            "options": {"auth_token": self.api_key, "remember": True},
        }
        return json.dumps({"plan": [{"calls": [{"name": "secret_login", "arguments": arguments}]}]})

    def context(self) -> dict[str, Any]:
        return {"user_id": 7, "password": self.context_password}

    def assert_hidden_in(self, shown: str, where: str) -> None:
        """`shown` (JSON) has no secret outside the user's own text, and shows `***` where one was."""
        text = json.dumps(without_user_text(json.loads(shown)))
        for value in (self.password, self.api_key, self.context_password):
            assert value not in text, f"{where} shows a secret: {text[:3000]}"
        assert '"***"' in text and "alice" in text, f"{where} shows neither the redaction nor the user"


def without_user_text(value: Any) -> Any:
    """A JSON value with the prompt and the user messages' text left out."""
    if isinstance(value, list):
        return [without_user_text(item) for item in value]
    if not isinstance(value, dict):
        return value
    kept = {k: without_user_text(v) for k, v in value.items() if k != "prompt"}
    if value.get("role") == "user":
        kept["content"] = "(the user's text)"
    return kept


def run_cli(redis_server: RedisServer, *args: str) -> str:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    command = [str(TOOLLOOP_BIN), *args]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_view_of_a_turn_is_redacted_while_the_tool_and_the_store_keep_the_secrets(
    client: Client,
    module_redis: RedisServer,
    module_redis_client: redis.Redis,
    orchestrator_process: OrchestratorHandle,
    e2e_worker: WorkerHandle,
) -> None:
    secrets = Secrets()
    turn_id = client.submit(
        prompt=secrets.prompt(), model="scripted:plan", tools=["secret_login"], context=secrets.context()
    )
    waited = client.wait(turn_id, timeout=45)
    assert waited.status == "completed", waited.text
    (answer,) = [m for m in waited.messages if isinstance(m, ToolMessage)]
    # The tool counted the characters of the password it received: the whole one, not "***".
    assert answer.content == f"logged in alice ({len(secrets.password)}-char password)"

    view = client.get(turn_id)
    assert view.request.context == {"user_id": 7, "password": "***"}
    (asked,) = [m for m in view.messages if m.role == "assistant" and m.tool_calls]
    assert asked.tool_calls[0].arguments == {  # type: ignore[union-attr]
        "user": "alice",
        "password": "***",
        "api_key": "***",
        "options": {"auth_token": "***", "remember": True},
    }
    secrets.assert_hidden_in(view.model_dump_json(), "Client.get")
    secrets.assert_hidden_in(waited.model_dump_json(), "Client.wait")
    secrets.assert_hidden_in(client.outcome(turn_id).model_dump_json(), "Client.outcome")  # type: ignore[union-attr]
    secrets.assert_hidden_in(run_cli(module_redis, "show", turn_id), "toolloop show")
    with serve_app(create_app(Settings(redis_url=module_redis.url))) as base_url:
        reply = httpx.get(f"{base_url}/v1/turns/{turn_id}", timeout=10)
    assert reply.status_code == 200
    secrets.assert_hidden_in(reply.text, "GET /v1/turns/{id}")

    # What is stored is whole: a tool receives its context, and a resumed turn its history.
    stored_request = module_redis_client.get(keys.turn_request(turn_id)) or b""
    # The turn's messages are stored once, in its history list (the outcome references it).
    stored_history = b"".join(module_redis_client.lrange(keys.turn_history(turn_id), 0, -1))
    assert secrets.context_password.encode() in stored_request
    assert secrets.password.encode() in stored_history
    # Events are redacted when they are written; no process logs a secret.
    events = str(module_redis_client.xrange(keys.turn_events(turn_id)))
    assert "tool_dispatched" in events
    for value in (secrets.password, secrets.api_key, secrets.context_password):
        assert value not in events
        assert value not in orchestrator_process.log_text() and value not in e2e_worker.log_text()


async def test_the_async_client_and_submit_wait_show_the_same_redaction(
    module_redis: RedisServer, orchestrator_process: OrchestratorHandle
) -> None:
    secrets = Secrets()
    arguments = ["--prompt", secrets.prompt(), "--model", "scripted:plan", "--tools", "secret_login"]
    arguments += ["--context", json.dumps(secrets.context()), "--wait", "--timeout", "45"]
    printed = run_cli(module_redis, "submit", *arguments)
    secrets.assert_hidden_in(printed, "toolloop submit --wait")
    outcome = json.loads(printed)
    async with AsyncClient(module_redis.url) as aclient:
        view = await aclient.get(outcome["turn_id"])
        waited = await aclient.wait(outcome["turn_id"], timeout=5)
    assert view.request.context == {"user_id": 7, "password": "***"}
    secrets.assert_hidden_in(view.model_dump_json(), "AsyncClient.get")
    secrets.assert_hidden_in(waited.model_dump_json(), "AsyncClient.wait")
