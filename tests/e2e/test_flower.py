"""A real Flower against the test Redis tells how each tool call ended, read through Flower's
HTTP API with basic auth, and never shows a secret.

Each call ends one way — success, a raised error, a retry, a hard kill, a revoke — and Flower's state must
say so (SUCCESS, FAILURE with "<kind>: <message>", RETRY with its reason, FAILURE with TimeLimitExceeded,
REVOKED) while the outcome in Redis stays the record. Every call carries a secret argument and a secret
context value; neither may appear in any Flower answer (task list, task info, the task page, the table
behind the tasks page). The last test opens the task page of a failed call in a real browser.

"Nothing else happened" (no redelivery, no second outcome) is checked once the worker is done with the call:
its message acked and, where its pool process was killed, that process reaped and replaced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from orchestrator.redis_server import find_free_port
from tests.support import broker
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
from tests.support.waiting import wait_for, wait_until
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
    # As docs/operations/monitoring.md starts it: `toolloop flower` finds the broker in TOOLLOOP_REDIS_URL,
    # as the workers do.
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

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"flower exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            return httpx.get(f"{base}/healthcheck", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(answers, "Flower to answer")
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
        return broker.is_unacked(client, task_id)
    finally:
        client.close()


def queued_retry_eta(redis_url: str, task_id: str) -> datetime | None:
    """When the task's retry is due, while its message waits in the queue (no worker took it yet)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for raw in client.lrange(FLOWER_QUEUE, 0, -1):
            headers = json.loads(raw).get("headers", {})
            if headers.get("id") == task_id and headers.get("eta"):
                return datetime.fromisoformat(headers["eta"])
        return None
    finally:
        client.close()


def pool_process(worker: WorkerHandle) -> int:
    """The pid of the worker's one pool process (once a killed one is replaced, if it was)."""

    def only_one() -> int | None:
        pids = worker.child_pids()
        return pids[0] if len(pids) == 1 else None

    return wait_for(only_one, "the worker's one pool process")


def wait_replaced(worker: WorkerHandle, pid: int) -> None:
    """Until the worker has reaped its pool process `pid` and started another: it has dealt with its end."""
    wait_until(lambda: [p for p in worker.child_pids() if p != pid], f"pool process {pid} replaced")
    wait_until(lambda: pid not in worker.child_pids(), f"pool process {pid} reaped")


def wait_acked(redis_url: str, task_id: str) -> None:
    """Until the task's message is acked: the broker will not deliver it again."""
    wait_until(lambda: not is_unacked(redis_url, task_id), f"the message of task {task_id} acked")


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
        "tenant": "default",
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
    # Once the worker is done with the call (it logged the failure, as expected, and acked the message),
    # nothing else reacted to it: no Celery retry or redelivery, no second outcome (a parent-side
    # `worker_lost`), and Celery logged it in one line.
    expected = f"raised expected: ToolCallFailed('execution_error: ValueError: {message}')"

    def this_call_log() -> str:
        log = flower_worker.log_text()
        start = log.find(f"[{sent.task_id}] received")  # this call's lines (the worker serves it alone)
        return log[start:] if start >= 0 else ""

    wait_until(lambda: expected in this_call_log(), "the worker to log the failure")
    wait_acked(redis_url, sent.task_id)
    again = wait_for_state(flower, sent.task_id, "FAILURE")
    assert again["received"] == task["received"] and again["retries"] == 0
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert wait_for_outcome(redis_url, sent.call_id) == outcome
    log = this_call_log()
    assert "Traceback" not in log
    assert_flower_hides(flower, sent)


def test_a_retried_call_shows_retry_with_its_reason_until_a_worker_takes_the_retry(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    assert flower_get(flower, "/api/workers", refresh="1").status_code == 200  # Flower knows the worker
    # The first attempt holds until the worker stops taking calls from the queue: the retry then waits in
    # the queue, as it does when every worker is busy, and Flower shows RETRY all that time.
    release = f"flower-test:release:{uuid.uuid4().hex}"
    sent = send_call(redis_url, "flaky_account", account="acme", hold_until=release)
    wait_for_state(flower, sent.task_id, "STARTED")
    worker_api = f"/api/worker/queue/%s/{flower_worker.hostname}"
    response = flower_post(flower, worker_api % "cancel-consumer", queue=FLOWER_QUEUE)
    assert response.status_code == 200, response.text
    release_client = redis.Redis.from_url(redis_url)
    try:
        release_client.set(release, "1", ex=600)
    finally:
        release_client.close()
    try:
        task = wait_for_state(flower, sent.task_id, "RETRY")
        assert task["exception"] == "ToolCallRetried('transient failure: account service busy for acme')"
        # Past the retry's countdown, its message still in the queue: still RETRY while no worker takes it.
        due = wait_for(lambda: queued_retry_eta(redis_url, sent.task_id), "the retry in the queue")
        wait_until(lambda: datetime.now(UTC) >= due, "the retry's countdown to pass")
        assert wait_for_state(flower, sent.task_id, "RETRY")["retried"] == task["retried"]
        assert queued_retry_eta(redis_url, sent.task_id) == due
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
    child = pool_process(flower_worker)
    sent = send_call(redis_url, "stuck_account", account="acme")
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.TIMEOUT and "hard limit" in (outcome.error or "")

    task = wait_for_state(flower, sent.task_id, "FAILURE")
    assert task["exception"] == "TimeLimitExceeded(2.0)"
    # The worker is done with the call once it reaped the killed process: then nothing else came of it.
    wait_replaced(flower_worker, child)
    wait_acked(redis_url, sent.task_id)
    assert wait_for_state(flower, sent.task_id, "FAILURE")["received"] == task["received"]
    assert late_outcomes(redis_url, sent.call_id) == 0
    assert_flower_hides(flower, sent)


def test_a_call_revoked_from_flower_is_revoked_and_answered_cancelled(
    redis_url: str, flower_worker: WorkerHandle, flower: str
) -> None:
    wait_for_flower_events(flower, flower_worker.hostname)
    child = pool_process(flower_worker)
    sent = send_call(redis_url, "slow_account", account="acme", seconds=30.0)
    wait_for_state(flower, sent.task_id, "STARTED")
    response = flower_post(flower, f"/api/task/revoke/{sent.task_id}", terminate="true")
    assert response.status_code == 200, response.text
    outcome = wait_for_outcome(redis_url, sent.call_id)
    assert outcome.failure_kind is FailureKind.CANCELLED

    task = wait_for_state(flower, sent.task_id, "REVOKED")
    assert task["revoked"] is not None
    # Once the terminated process is reaped: the task stays REVOKED, with no second outcome.
    wait_replaced(flower_worker, child)
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
    child = pool_process(flower_worker)
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
