"""A real Flower against the test Redis tells how each tool call ended (SPEC §7.3), read through Flower's
HTTP API with basic auth, and never shows a secret.

Each call ends one way — success, a raised error, a retry, a hard kill, a revoke — and Flower's state must
say so (SUCCESS, FAILURE with "<kind>: <message>", RETRY with its reason, FAILURE with TimeLimitExceeded,
REVOKED) while the outcome in Redis stays the record. Every call carries a secret argument and a secret
context value; neither may appear in any Flower answer (task list, task info, the task page, the table
behind the tasks page). The last test opens the task page of a failed call in a real browser.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from ops.redis_server import find_free_port
from tests.support.browser import open_chromium
from tests.support.flower_client import (
    AUTH,
    assert_flower_hides,
    flower_get,
    flower_post,
    send_call,
    wait_for_flower_events,
    wait_for_outcome,
    wait_for_state,
)
from tests.support.flower_tools import CLOSED_MESSAGE, FLOWER_QUEUE
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle, start_worker
from workers import keys
from workers.contract import FailureKind
from workers.errors import ToolCallFailed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


# One worker for the module (each test's calls have their own ids); the tests that kill its pool child or
# stop its consumer leave it serving again.
@pytest.fixture(scope="module")
def flower_worker(redis_url: str) -> Iterator[WorkerHandle]:
    handle = start_worker(redis_url, ["tests.support.flower_tools"], queues=[FLOWER_QUEUE], concurrency=1)
    yield handle
    handle.stop()


@pytest.fixture
def flower(redis_url: str) -> Iterator[str]:
    port = find_free_port()
    # As the README starts it: `toolloop flower` finds the broker in TOOLLOOP_REDIS_URL, as the workers do.
    env = {
        **os.environ,
        "TOOLLOOP_REDIS_URL": redis_url,
        "FLOWER_BASIC_AUTH": f"{AUTH[0]}:{AUTH[1]}",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("TOOLLOOP_BROKER_URL", None)
    process = subprocess.Popen(
        [str(TOOLLOOP_BIN), "flower", f"--port={port}", "--address=127.0.0.1"],
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


def is_unacked(redis_url: str, task_id: str) -> bool:
    """True while kombu's Redis transport holds the task's message unacked (it would be delivered again)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return any(task_id.encode() in raw for raw in client.hvals("unacked"))
    finally:
        client.close()


def late_outcomes(redis_url: str, call_id: str) -> int:
    """How many outcomes came after the first (a second writer) for this call."""
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen(keys.late_outcomes(call_id)))
    finally:
        client.close()


def test_a_successful_call_is_a_success_listed_by_tool_name_with_secrets_hidden(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    assert httpx.get(f"{flower}/api/tasks", timeout=5).status_code == 401  # basic auth is on
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "lookup_account", account="acme")
    assert wait_for_outcome(redis_url, sent.call_id).ok

    task = wait_for_state(flower, sent.task_id, "SUCCESS")
    assert task["name"] == "tool.lookup_account" and task["exception"] is None
    assert task["args"] == "()"
    kwargs = json.loads(task["kwargs"])
    assert kwargs == {
        "turn_id": sent.turn_id,
        "call_id": sent.call_id,
        "attempt": 1,
        "arguments": {"account": "acme", "api_token": "***"},
        "context": {"user_email": "***"},
    }
    assert_flower_hides(flower, sent)


def test_a_failed_call_is_a_failure_with_its_kind_and_message_answered_once_and_acked(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "close_account", account="acme")
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.EXECUTION_ERROR and outcome.attempts == 1

    task = wait_for_state(flower, sent.task_id, "FAILURE")
    message = CLOSED_MESSAGE.format(account="acme")
    assert task["exception"] == f"ToolCallFailed('execution_error: ValueError: {message}')"
    assert f"ToolCallFailed: execution_error: ValueError: {message}" in task["traceback"]
    assert task["retries"] == 0 and task["result"] is None
    # Nothing else reacted to the failure: no Celery retry or redelivery (the message is acked), no second
    # outcome (a parent-side `worker_lost`), and Celery logged it as expected, in one line.
    time.sleep(1.0)
    again = wait_for_state(flower, sent.task_id, "FAILURE")
    assert again["received"] == task["received"] and again["retries"] == 0
    assert not is_unacked(redis_url, sent.task_id)
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert wait_for_outcome(redis_url, sent.call_id) == outcome
    log = flower_worker.log_text()
    log = log[log.index(f"[{sent.task_id}] received") :]  # this call's lines (the worker serves it alone)
    assert f"raised expected: ToolCallFailed('execution_error: ValueError: {message}')" in log
    assert "Traceback" not in log
    assert_flower_hides(flower, sent)


def test_a_retried_call_shows_retry_with_its_reason_until_a_worker_takes_the_retry(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    # The first attempt holds long enough for the worker to stop taking calls from the queue: the retry then
    # waits in the queue, as it does when every worker is busy, and Flower shows RETRY all that time.
    sent = send_call(redis_url, "flaky_account", account="acme", hold_s=1.5)
    wait_for_state(flower, sent.task_id, "STARTED")
    assert flower_get(flower, "/api/workers", refresh="1").status_code == 200  # Flower knows the worker
    worker_api = f"/api/worker/queue/%s/{flower_worker.hostname}"
    response = flower_post(flower, worker_api % "cancel-consumer", queue=FLOWER_QUEUE)
    assert response.status_code == 200, response.text
    try:
        task = wait_for_state(flower, sent.task_id, "RETRY")
        assert task["exception"] == "ToolCallRetried('transient failure: account service busy for acme')"
        time.sleep(2.5)  # past the retry's countdown: still RETRY while no worker has taken it
        assert wait_for_state(flower, sent.task_id, "RETRY")["retried"] == task["retried"]
        assert_flower_hides(flower, sent)
    finally:
        response = flower_post(flower, worker_api % "add-consumer", queue=FLOWER_QUEUE)
        assert response.status_code == 200, response.text
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.ok and outcome.attempts == 2
    task = wait_for_state(flower, sent.task_id, "SUCCESS")
    assert task["retries"] == 1 and task["retried"] is not None
    assert_flower_hides(flower, sent)


def test_a_hard_killed_call_is_a_failure_with_time_limit_exceeded(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "stuck_account", account="acme")
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.TIMEOUT and "hard limit" in (outcome.error or "")

    task = wait_for_state(flower, sent.task_id, "FAILURE")
    assert task["exception"] == "TimeLimitExceeded(2.0)"
    time.sleep(1.0)
    assert wait_for_state(flower, sent.task_id, "FAILURE")["received"] == task["received"]
    assert not is_unacked(redis_url, sent.task_id)
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert_flower_hides(flower, sent)


def test_a_call_revoked_from_flower_is_revoked_and_answered_cancelled(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "slow_account", account="acme", seconds=30.0)
    wait_for_state(flower, sent.task_id, "STARTED")
    response = flower_post(flower, f"/api/task/revoke/{sent.task_id}", terminate="true")
    assert response.status_code == 200, response.text
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.CANCELLED

    task = wait_for_state(flower, sent.task_id, "REVOKED")
    assert task["revoked"] is not None
    time.sleep(1.0)  # the killed child reports in: the task stays REVOKED, with no second outcome
    assert wait_for_state(flower, sent.task_id, "REVOKED")["exception"] is None
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert wait_for_outcome(redis_url, sent.call_id) == outcome
    assert_flower_hides(flower, sent)


def test_a_call_whose_worker_process_died_is_a_failure_with_worker_lost(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "slow_account", account="acme", seconds=30.0)
    wait_for_state(flower, sent.task_id, "STARTED")
    (child,) = flower_worker.child_pids()
    os.kill(child, signal.SIGKILL)
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.WORKER_LOST  # slow_account has no retries left

    # Celery requeues the lost message; its redelivery finds the outcome and reports it, not a success.
    task = wait_for_state(flower, sent.task_id, "FAILURE")
    assert task["exception"] == repr(ToolCallFailed("worker_lost", outcome.error or ""))
    assert not is_unacked(redis_url, sent.task_id)
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert_flower_hides(flower, sent)


def test_the_task_page_of_a_failed_call_in_a_browser_shows_failure_kind_and_message_and_no_secret(
    redis_url: str, flower_worker: WorkerHandle, flower: str, tmp_path: Path
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    sent = send_call(redis_url, "close_account", account="acme")
    wait_for_state(flower, sent.task_id, "FAILURE")
    shown = f"execution_error: ValueError: {CLOSED_MESSAGE.format(account='acme')}"

    with open_chromium(tmp_path / "profile", basic_auth=AUTH) as browser:
        page = browser.new_page()
        response = page.goto(f"{flower}/task/{sent.task_id}")
        assert response is not None and response.status == 200
        status = page.locator("dt", has_text="Status").locator("xpath=following-sibling::dd[1]")
        assert status.inner_text().strip() == "FAILURE"
        exception = page.locator("dt", has_text="Exception").locator("xpath=following-sibling::dd[1]")
        assert shown in exception.inner_text()
        kwargs = page.locator("dt", has_text="Keyword arguments").locator("xpath=following-sibling::dd[1]")
        assert '"api_token": "***"' in kwargs.inner_text()
        assert '"user_email": "***"' in kwargs.inner_text()
        page.screenshot(path=str(tmp_path / "flower-task-failed.png"), full_page=True)
        page_text = page.locator("body").inner_text() + page.content()

        # The task list as a person opens it: the row of this call, FAILED.
        page.goto(f"{flower}/tasks")
        row = page.locator(f'tr[id="{sent.task_id}"]')
        row.wait_for(timeout=15_000)
        assert "FAILURE" in row.inner_text() and "tool.close_account" in row.inner_text()
        page.screenshot(path=str(tmp_path / "flower-tasks.png"), full_page=True)
        page_text += page.locator("body").inner_text() + page.content()

    for secret in sent.secrets:
        assert secret not in page_text
    assert (tmp_path / "flower-task-failed.png").stat().st_size > 10_000
