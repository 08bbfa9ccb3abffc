"""Security defaults (issue 6): pickle refused by the workers, sensitive values redacted in events, logs and
the task events Flower shows (argsrepr/kwargsrepr), the API refusing requests without its token.

The shipped processes, as a user deploys them (`FaultEnv`): Redis, `toolloop worker`, `toolloop orchestrator`
reaching its model over HTTP, and `toolloop api` with a token; the logs read are theirs. Celery's own event
receiver stands in for Flower (Flower learns task arguments from exactly these events).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kombu import Connection, Exchange, Queue

from orchestrator.model import ToolMessage
from tests.faults.env import PLAN_MODEL, FaultEnv, call, check_turn, is_running
from tests.faults.fault_tools import STARTS
from tests.support.served import Served
from tests.support.task_events import TaskEvents
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@dataclass
class Deployment:
    """The scenario's processes, and the API's token and address."""

    env: FaultEnv
    api: Served
    api_url: str
    token: str


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with FaultEnv() as fault_env:
        fault_env.start_worker(
            concurrency=2, modules=("tests.faults.fault_tools", "tests.security.secret_tools")
        )
        fault_env.start_orchestrator(env={"TOOLLOOP_LOG_LEVEL": "DEBUG"})
        token = f"api-{uuid.uuid4().hex}"
        api, api_url = fault_env.start_api({"TOOLLOOP_API_TOKEN": token})
        yield Deployment(fault_env, api, api_url, token)


@pytest.fixture
def env(deployment: Deployment) -> FaultEnv:
    return deployment.env


class _Exploit:
    """Unpickling this runs a shell command: what a pickle-accepting worker would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_message_is_refused_and_the_worker_keeps_serving(env: FaultEnv) -> None:
    marker = Path(tempfile.gettempdir()) / f"toolloop-pwned-{uuid.uuid4().hex}"
    tag = uuid.uuid4().hex
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": "tool.fault_work",
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "attacker",
    }
    body: tuple[Any, ...] = (
        (_Exploit(str(marker)),),
        {"call_id": tag, "tool": "fault_work", "arguments": {"tag": tag}},
        {},
    )
    # The queue the worker consumes for fault_work: the tool's own.
    queue = Queue("tool.fault_work", Exchange("tool.fault_work"), routing_key="tool.fault_work")
    with Connection(env.url) as connection:
        connection.Producer().publish(
            body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            serializer="pickle",
            headers=headers,
            declare=[queue],
        )
    # The worker's message guard refuses it for its content type (a pickle's), before anything reads it.
    wait_until(
        lambda: "application/x-python-serialize" in env.workers[0].log_text(),
        "the worker to refuse the pickle",
    )
    assert not marker.exists(), "the pickled payload was deserialised"
    assert env.redis.get(STARTS + tag) is None
    assert is_running(env.workers[0])
    # Still serving JSON messages.
    turn_id = env.submit([call("fault_work", tag=uuid.uuid4().hex, seconds=0.0)])
    check_turn(env.client.wait(turn_id, 60))


def test_sensitive_values_are_redacted_in_events_logs_and_task_events(deployment: Deployment) -> None:
    env = deployment.env
    secret = f"hunter2-{uuid.uuid4().hex}"
    token = f"tok-{uuid.uuid4().hex}"
    with TaskEvents(env.url) as task_events:
        # Submitted as a web app would: through the API, with its token.
        arguments = {"user": "alice", "password": secret, "api_key": token, "options": {"auth_token": token}}
        plan = {"plan": [{"calls": [call("secret_login", **arguments)]}]}
        body = {"prompt": json.dumps(plan), "tools": ["secret_login"], "model": PLAN_MODEL}
        reply = httpx.post(
            f"{deployment.api_url}/v1/turns",
            json=body,
            headers={"authorization": f"Bearer {deployment.token}"},
            timeout=30,
        )
        assert reply.status_code == 202, reply.text
        turn_id = reply.json()["id"]
        outcome = env.client.wait(turn_id, 60)
        check_turn(outcome)
        (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
        assert not answer.is_error, answer.content
        wait_until(lambda: task_events.of_type("task-received"), "the worker's task-received event")
        captured = task_events.of_type("task-sent", "task-received")
    # Events of the turn.
    events = json.dumps(env.redis.xrange(keys.turn_events(turn_id)))
    assert "alice" in events and secret not in events and token not in events
    # Logs of every process: the worker, the orchestrator (at DEBUG) and the API the turn came through.
    logs = {f"worker {w.pid}": w.log_text() for w in env.workers}
    logs |= {f"orchestrator {o.pid}": o.log_text() for o in env.orchestrators}
    logs[f"api {deployment.api.pid}"] = deployment.api.log_text()
    assert all(logs.values()), "a process wrote no log: the check would prove nothing"
    for name, text in logs.items():
        assert secret not in text and token not in text, f"a secret in the log of the {name}"
    # What Flower shows: the arguments of task events.
    shown = [e for e in captured if e.get("name", "").startswith("tool.secret_login") or e.get("kwargs")]
    received = [e for e in captured if e.get("type") == "task-received"]
    assert received, captured
    for event in shown:
        text = json.dumps(event, default=str)
        assert secret not in text and token not in text
    assert any("***" in str(e.get("kwargs")) and "alice" in str(e.get("kwargs")) for e in received)


def test_the_api_refuses_requests_without_its_token(deployment: Deployment) -> None:
    token = deployment.token
    with httpx.Client(base_url=deployment.api_url, timeout=30) as http:
        routes = [
            ("POST", "/v1/turns", {"prompt": "hi"}),
            ("GET", "/v1/turns/turn_0123456789abcdef0123456789abcdef", None),
            ("GET", "/v1/turns/turn_0123456789abcdef0123456789abcdef/events", None),
            ("POST", "/v1/turns/turn_0123456789abcdef0123456789abcdef/cancel", None),
            ("POST", "/v1/turns/turn_0123456789abcdef0123456789abcdef/approvals/c1", {"approved": True}),
            ("GET", "/v1/tools", None),
            ("GET", "/metrics", None),
        ]
        for headers in (
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": token},
            {"authorization": "Basic x"},
        ):
            for method, path, body in routes:
                reply = http.request(method, path, json=body, headers=headers)
                assert reply.status_code == 401, (method, path, headers, reply.status_code)
                assert token not in reply.text
        good = {"authorization": f"Bearer {token}"}
        assert http.post("/v1/turns", json={"prompt": "hi"}, headers=good).status_code == 202
        assert http.get("/v1/tools", headers=good).status_code == 200
        assert http.get("/healthz").status_code == 200  # health stays open for probes
    assert token not in deployment.api.log_text()
