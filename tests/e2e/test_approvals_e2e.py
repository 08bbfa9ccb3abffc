"""Approvals that wait for days and cost nothing meanwhile, end to end (docs/guides/approvals.md).

Real processes only: a Redis of the module's own, a prefork `toolloop worker` serving `e2e_transfer` (a tool
that requires confirmation), `toolloop orchestrator` with TOOLLOOP_ATTENTION_TASK set, the scripted model
over HTTP, and a plain Celery prefork worker running the team's attention task
(`tests.support.attention_tasks`), which records every notice it gets.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support.attention_tasks import ATTENTION_TASK, RECEIVED
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.plans import marked_plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle
from tests.support.turns import wait_outcome
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CELERY_BIN = Path(sys.executable).parent / "celery"


@pytest.fixture(scope="module")
def attention_worker(module_redis: RedisServer) -> Iterator[subprocess.Popen[bytes]]:
    """The team's Celery worker, prefork, on the attention queue only."""
    log = Path(tempfile.mkstemp(prefix="toolloop-attention-worker-", suffix=".log")[1])
    env = {**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)}
    command = [
        str(CELERY_BIN),
        "-A",
        "tests.support.attention_tasks",
        "worker",
        "-Q",
        "toolloop.attention",
        "--pool=prefork",
        "--concurrency=1",
        f"--hostname=attention-{uuid.uuid4().hex[:8]}@localhost",
        "--without-mingle",
        "--without-gossip",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    yield process
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=5)
    log.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def attending_orchestrator(
    module_redis: RedisServer,
    model_server: RecordingModelServer,
    e2e_worker: WorkerHandle,
    attention_worker: subprocess.Popen[bytes],
) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(
        module_redis.url,
        model_base_url=model_server.base_url,
        env={"TOOLLOOP_ATTENTION_TASK": ATTENTION_TASK},
    )
    yield handle
    handle.stop()


def transfer_prompt(to: str, amount: float = 5) -> tuple[str, str]:
    call = {"name": "e2e_transfer", "arguments": {"amount": amount, "to": to}}
    return marked_plan_prompt([{"calls": [call]}])


def wait_waiting(client: Client, turn_id: str) -> None:
    wait_until(lambda: client.get(turn_id).pending_approvals, f"turn {turn_id} to wait for a person")


def notices_of(module_redis_client: redis.Redis, turn_id: str) -> list[dict[str, Any]]:
    received = [json.loads(n) for n in module_redis_client.lrange(RECEIVED, 0, -1)]
    return [n for n in received if n["turn_id"] == turn_id]


def test_the_wait_for_a_person_does_not_count_against_the_deadline(
    client: Client, module_redis_client: redis.Redis
) -> None:
    # As the new user saw it: deadline_s=5, the approval 15 s later. The turn completes, the tool ran.
    prompt, _ = transfer_prompt(f"alice-{uuid.uuid4().hex[:8]}")
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits={"deadline_s": 5})
    wait_waiting(client, turn_id)
    view = client.get(turn_id)
    (pending,) = view.pending_approvals
    assert view.paused_at is not None and view.deadline_at is not None
    assert pending.wait_deadline == pytest.approx(pending.since + 86_400)  # type: ignore[operator]
    # Parked: no orchestrator holds it, no lease.
    wait_until(lambda: module_redis_client.zscore(keys.TURNS_PARKED, turn_id), "the turn to be parked")
    assert not module_redis_client.exists(keys.turn_lease(turn_id))
    time.sleep(15)
    assert client.approve(turn_id, pending.call_id, True, decided_by="ana@example.com", reason="known payee")
    outcome = wait_outcome(client, turn_id, timeout_s=20)
    assert (outcome.status, outcome.stop_reason) == ("completed", None)
    (decision,) = outcome.approvals
    assert (decision.decided_by, decision.reason, decision.approved) == (
        "ana@example.com",
        "known payee",
        True,
    )
    assert decision.waited_s >= 15
    # Who decided, in `toolloop show` and in the events.
    shown = subprocess.run(
        [str(TOOLLOOP_BIN), "show", turn_id],
        capture_output=True,
        text=True,
        env={**os.environ, "TOOLLOOP_REDIS_URL": client.redis_url},
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert json.loads(shown.stdout)["approvals"][0]["decided_by"] == "ana@example.com"
    given = [e for e in client.events(turn_id) if e.name == "approval_given"]
    assert given[0].data["decided_by"] == "ana@example.com"


def test_a_wait_past_its_limit_is_a_denial_the_model_reads(
    client: Client, model_server: RecordingModelServer
) -> None:
    prompt, marker = transfer_prompt(f"bob-{uuid.uuid4().hex[:8]}")
    turn_id = client.submit(prompt=prompt, model="scripted:plan", limits={"approval_timeout_s": 3})
    outcome = wait_outcome(client, turn_id, timeout_s=30)
    assert (outcome.status, outcome.stop_reason) == ("completed", None)
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.failure_kind is FailureKind.CONFIRMATION_DENIED
    assert answer.content == "Error: no one approved the call within 3 s; it was not run"
    # The model's second request carries that answer.
    bodies = [json.dumps(body) for body in model_server.requests() if marker in json.dumps(body)]
    assert len(bodies) == 2 and "no one approved the call within 3 s" in bodies[1]
    (decision,) = outcome.approvals
    assert (decision.timed_out, decision.approved, decision.decided_by) == (True, False, None)


def test_each_waiting_call_is_told_to_the_attention_task_once(
    client: Client, module_redis_client: redis.Redis
) -> None:
    alice, bob = f"alice-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    calls = [
        {"name": "e2e_transfer", "arguments": {"amount": 5, "to": alice}},
        {"name": "e2e_transfer", "arguments": {"amount": 7, "to": bob}},
    ]
    prompt, _ = marked_plan_prompt([{"calls": calls}])
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    notices = wait_for(
        lambda: found if len(found := notices_of(module_redis_client, turn_id)) == 2 else None,
        "both calls told to the attention task",
    )
    assert sorted(n["call_id"] for n in notices) == ["call_r0_0", "call_r0_1"]
    first = next(n for n in notices if n["call_id"] == "call_r0_0")
    assert first["tool"] == "e2e_transfer" and first["waiting_for"] == "approval"
    assert first["arguments"] == {"amount": 5, "to": alice}
    assert first["approve_command"] == f"toolloop approve {turn_id} call_r0_0"
    assert first["tenant"] == "default" and first["wait_deadline"] > time.time()
    # Answering one call wakes the turn in an orchestrator, which parks it again: nobody is told twice.
    assert client.approve(turn_id, "call_r0_0", True)
    wait_until(lambda: len(client.get(turn_id).pending_approvals) == 1, "the first call answered")
    wait_until(lambda: module_redis_client.zscore(keys.TURNS_PARKED, turn_id), "the turn parked again")
    assert client.approve(turn_id, "call_r0_1", False, reason="not today")
    wait_outcome(client, turn_id, timeout_s=20)
    time.sleep(1)
    assert len(notices_of(module_redis_client, turn_id)) == 2


def test_submit_stream_says_how_to_approve_and_pending_lists_the_call(client: Client) -> None:
    prompt, _ = transfer_prompt(f"carol-{uuid.uuid4().hex[:8]}")
    env = {**os.environ, "TOOLLOOP_REDIS_URL": client.redis_url}
    streaming = subprocess.Popen(
        [str(TOOLLOOP_BIN), "submit", "--prompt", prompt, "--model", "scripted:plan", "--stream"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert streaming.stderr is not None
        turn_line = streaming.stderr.readline()
        lines = [turn_line]
        while "toolloop approve" not in lines[-1]:
            lines.append(streaming.stderr.readline())
        waits = lines[-1]
        turn_id = waits.split("toolloop approve ")[1].split()[0]
        assert "e2e_transfer waits for a person's approval" in waits
        assert waits.rstrip().endswith(f"toolloop approve {turn_id} call_r0_0 [--deny]")
        pending = subprocess.run(
            [str(TOOLLOOP_BIN), "pending"],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=True,
        )
        assert f"toolloop approve {turn_id} call_r0_0 [--deny]" in pending.stdout
        approved = subprocess.run(
            [str(TOOLLOOP_BIN), "approve", turn_id, "call_r0_0", "--by", "carol", "--reason", "ok"],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=True,
        )
        assert approved.stdout.strip() == "approved"
        assert streaming.wait(timeout=30) == 0
    finally:
        if streaming.poll() is None:
            streaming.kill()
        streaming.communicate()
    assert client.get(turn_id).approvals[0].decided_by == "carol"


def test_toolloop_cancel_stops_a_waiting_turn_once(client: Client) -> None:
    prompt, _ = transfer_prompt(f"dave-{uuid.uuid4().hex[:8]}")
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    wait_waiting(client, turn_id)
    env = {**os.environ, "TOOLLOOP_REDIS_URL": client.redis_url}

    def cancel(turn: str) -> subprocess.CompletedProcess[str]:
        command = [str(TOOLLOOP_BIN), "cancel", turn]
        return subprocess.run(
            command, check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
        )

    first = cancel(turn_id)
    assert (first.returncode, first.stdout, first.stderr) == (0, "cancelling\n", "")
    assert wait_outcome(client, turn_id).status == "cancelled"
    again = cancel(turn_id)
    assert (again.returncode, again.stderr) == (1, f"error: turn {turn_id} has already ended\n")
    unknown = cancel("turn_nobody")
    assert (unknown.returncode, unknown.stderr) == (1, "error: unknown turn 'turn_nobody'\n")
