"""Security defaults (issue 6): pickle refused by the workers, sensitive values redacted in events, logs and
the task events Flower shows (argsrepr/kwargsrepr), the API refusing requests without its token.

Real processes: Redis, a prefork worker, an orchestrator; Celery's own event receiver stands in for Flower
(Flower learns task arguments from exactly these events).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kombu import Connection, Exchange, Queue
from pydantic import SecretStr

from orchestrator.api import create_app
from orchestrator.model import ToolMessage
from orchestrator.settings import Settings
from tests.faults.env import FaultEnv, call, check_turn
from tests.faults.fault_tools import STARTS
from tests.integration.store_support import serve_app
from workers import keys
from workers.app import create_app as create_celery_app

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def env() -> Iterator[FaultEnv]:
    with FaultEnv() as fault_env:
        fault_env.start_worker(
            concurrency=2, modules=("tests.faults.fault_tools", "tests.security.secret_tools")
        )
        fault_env.start_orchestrator(env={"TOOLLOOP_LOG_LEVEL": "DEBUG"})
        yield fault_env


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
    body = ((_Exploit(str(marker)),), {"call_id": tag, "tool": "fault_work", "arguments": {"tag": tag}}, {})
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
    deadline = time.monotonic() + 15
    log = ""
    while time.monotonic() < deadline:
        log = env.workers[0].log_text()
        if "pickle" in log.lower():
            break
        time.sleep(0.1)
    assert "pickle" in log.lower(), log[-2000:]  # Celery logs the refused content type
    assert not marker.exists(), "the pickled payload was deserialised"
    assert env.redis.get(STARTS + tag) is None
    assert env.workers[0].process.poll() is None
    # Still serving JSON messages.
    turn_id = env.submit([call("fault_work", tag=uuid.uuid4().hex, seconds=0.0)])
    check_turn(env.client.wait(turn_id, 30))


def test_sensitive_values_are_redacted_in_events_logs_and_task_events(env: FaultEnv) -> None:
    secret = f"hunter2-{uuid.uuid4().hex}"
    token = f"tok-{uuid.uuid4().hex}"
    captured: list[dict[str, Any]] = []
    app = create_celery_app(Settings(redis_url=env.url), main="toolloop-events")
    ready = threading.Event()
    stop = threading.Event()

    def receive() -> None:
        with app.connection() as connection:
            receiver = app.events.Receiver(
                connection, handlers={"task-sent": captured.append, "task-received": captured.append}
            )
            ready.set()
            for _ in receiver.itercapture(limit=None, timeout=0.2, wakeup=True):
                if stop.is_set():
                    return

    thread = threading.Thread(target=_swallow_timeouts(receive), daemon=True)
    thread.start()
    ready.wait(10)
    time.sleep(0.5)
    try:
        arguments = {"user": "alice", "password": secret, "api_key": token, "options": {"auth_token": token}}
        turn_id = env.submit([call("secret_login", **arguments)])
        outcome = env.client.wait(turn_id, 30)
        check_turn(outcome)
        (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
        assert not answer.is_error, answer.content
        deadline = time.monotonic() + 10
        while not any(e.get("type") == "task-received" for e in captured) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(5)
        app.close()
    # Events of the turn.
    events = json.dumps(env.redis.xrange(keys.turn_events(turn_id)))
    assert "alice" in events and secret not in events and token not in events
    # Logs of every process.
    for text in [w.log_text() for w in env.workers] + [o.log_text() for o in env.orchestrators]:
        assert secret not in text and token not in text
    # What Flower shows: the arguments of task events.
    shown = [e for e in captured if e.get("name", "").startswith("tool.secret_login") or e.get("kwargs")]
    received = [e for e in captured if e.get("type") == "task-received"]
    assert received, captured
    for event in shown:
        text = json.dumps(event, default=str)
        assert secret not in text and token not in text
    assert any("***" in str(e.get("kwargs")) and "alice" in str(e.get("kwargs")) for e in received)


def _swallow_timeouts(target: Any) -> Any:
    def run() -> None:
        try:
            target()
        except (TimeoutError, OSError):
            return

    return run


def test_the_api_refuses_requests_without_its_token(env: FaultEnv) -> None:
    token = f"api-{uuid.uuid4().hex}"
    settings = Settings(redis_url=env.url, api_token=SecretStr(token))
    with serve_app(create_app(settings)) as base_url, httpx.Client(base_url=base_url) as http:
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
