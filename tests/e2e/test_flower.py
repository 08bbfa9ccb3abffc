"""A real Flower against the test Redis lists a tool task by its tool name, with redacted arguments and the
turn id and call id visible (SPEC §7.3), read through Flower's HTTP API with basic auth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from ops.redis_server import find_free_port
from orchestrator.runtime.publish import dispatch_call, get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.flower_tools import FLOWER_QUEUE
from tests.support.processes import WorkerHandle, start_worker
from workers import keys
from workers.contract import ToolCallRequest, ToolOutcome

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

AUTH = ("ops", "flower-pass")


@pytest.fixture
def flower_worker(redis_url: str) -> Iterator[WorkerHandle]:
    handle = start_worker(redis_url, ["tests.support.flower_tools"], queues=[FLOWER_QUEUE], concurrency=1)
    yield handle
    handle.stop()


@pytest.fixture
def flower(redis_url: str) -> Iterator[str]:
    port = find_free_port()
    env = {**os.environ, "FLOWER_BASIC_AUTH": f"{AUTH[0]}:{AUTH[1]}"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            f"--broker={redis_url}",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"flower exited: {process.stderr.read().decode() if process.stderr else ''}"
                )
            try:
                if httpx.get(f"{base}/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("flower did not start")
            time.sleep(0.1)
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        if process.stderr:
            process.stderr.close()


def wait_for_task(base: str, task_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tasks = httpx.get(f"{base}/api/tasks", auth=AUTH, timeout=5).json()
        task = tasks.get(task_id)
        if task is not None and task.get("state") == "SUCCESS" and task.get("name"):
            return dict(task)
        time.sleep(0.2)
    raise TimeoutError(f"flower never listed task {task_id} as succeeded")


def test_flower_lists_the_tool_task_by_name_with_redacted_arguments(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    assert httpx.get(f"{flower}/api/tasks", timeout=5).status_code == 401  # basic auth is on
    # Flower's event receiver connects shortly after its HTTP server is up; give it a moment.
    time.sleep(1.5)
    client = redis.Redis.from_url(redis_url)
    spec = read_catalogue(client)["lookup_account"]
    turn_id, call_id = f"turn_{uuid.uuid4().hex}", f"call_{uuid.uuid4().hex[:12]}"
    request = ToolCallRequest(
        call_id=call_id,
        tool="lookup_account",
        arguments={"account": "acme", "api_token": "tok-SECRET-123"},
        turn_id=turn_id,
    )
    task_id = dispatch_call(get_producer_app(Settings(redis_url=redis_url)), spec, request)
    deadline = time.monotonic() + 20
    while (raw := client.get(keys.outcome(call_id))) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert raw is not None
    assert ToolOutcome.model_validate_json(raw).ok
    client.close()

    task = wait_for_task(flower, task_id, 20)
    assert task["name"] == "tool.lookup_account"
    shown = json.dumps(task)
    assert "tok-SECRET-123" not in shown
    kwargs = json.loads(task["kwargs"])
    assert kwargs["turn_id"] == turn_id and kwargs["call_id"] == call_id
    assert kwargs["arguments"] == {"account": "acme", "api_token": "***"}
