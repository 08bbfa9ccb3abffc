"""RabbitMQ as the broker (TOOLLOOP_BROKER_URL=amqp://…), Redis for state, end to end on real processes.

A `rabbitmq-server` of the tests' own (`tests.support.rabbitmq`), real prefork workers, a real orchestrator:

- parallel calls and a hard kill (the hard limit) give every call its real outcome, and leave nothing queued;
- a worker SIGKILLed mid-call: RabbitMQ redelivers its calls at once to the other worker, which takes each
  over (`workers.fence`) and runs its body once more, to its real outcome — no `cancelled`, no third run;
- Flower, on the same broker, sees the tasks through their events;
- the broker stopped mid-stream of turns: the orchestrator says "the broker at amqp://… is unreachable"
  (password hidden), not Redis, and every turn finishes once it is back; the queues are durable.

The project routes with no priorities: its queues carry no `x-max-priority` (checked).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from kombu import Connection

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.flower_client import AUTH, flower_get
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.rabbitmq import RabbitServer, own_rabbitmq, rabbitmq_server
from tests.support.rabbitmq_tools import COUNTER_PREFIX, KILL_QUEUE, RABBIT_QUEUE
from tests.support.turns import assert_every_call_answered_once, event_data, wait_outcome
from tests.support.waiting import wait_until

__all__ = ["own_rabbitmq", "rabbitmq_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOOLS = "tests.support.rabbitmq_tools"


def broker_env(rabbit: RabbitServer) -> dict[str, str]:
    return {"TOOLLOOP_BROKER_URL": rabbit.url}


@pytest.fixture(scope="module")
def rabbit_workers(module_redis: RedisServer, rabbitmq_server: RabbitServer) -> Iterator[list[WorkerHandle]]:
    env = broker_env(rabbitmq_server)
    handles = [
        start_worker(module_redis.url, [TOOLS], queues=[RABBIT_QUEUE], concurrency=3, env=env)
        for _ in range(2)
    ]
    yield handles
    for handle in handles:
        handle.stop()


@pytest.fixture(scope="module")
def rabbit_orchestrator(
    module_redis: RedisServer,
    rabbitmq_server: RabbitServer,
    model_server: RecordingModelServer,
    rabbit_workers: list[WorkerHandle],
) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(
        module_redis.url, model_base_url=model_server.base_url, env=broker_env(rabbitmq_server)
    )
    yield handle
    handle.stop()


def contents(messages: Sequence[object]) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


def queue_depth(rabbit: RabbitServer, queue: str) -> int:
    """How many messages wait in `queue`, as the broker has it (a passive declare)."""
    with Connection(rabbit.url) as connection:
        channel: Any = connection.default_channel  # py-amqp's channel (kombu types it as its StdChannel)
        _, ready, _ = channel.queue_declare(queue, passive=True)
        return int(ready)


@pytest.mark.usefixtures("rabbit_orchestrator")
def test_parallel_calls_and_a_hard_kill_get_their_real_outcomes(
    client: Client, rabbitmq_server: RabbitServer
) -> None:
    keys = [f"par-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    calls = [{"name": "rabbit_counted", "arguments": {"key": key, "first_run_s": 0.5}} for key in keys]
    calls.append({"name": "rabbit_stubborn", "arguments": {"seconds": 30}})
    turn_id = client.submit(prompt=plan_prompt([{"calls": calls}]), model="scripted:plan")
    outcome = wait_outcome(client, turn_id)
    assert outcome.status == "completed", outcome
    assert contents(outcome.messages)[:5] == [f"run 1 of {key}" for key in keys]
    assert "timed out after 2 s (hard limit" in contents(outcome.messages)[5]
    assert_every_call_answered_once(outcome.messages)
    assert queue_depth(rabbitmq_server, RABBIT_QUEUE) == 0


@pytest.mark.usefixtures("rabbit_workers")
def test_the_queues_are_durable_and_carry_no_priority(rabbitmq_server: RabbitServer) -> None:
    # RabbitMQ refuses a declaration that differs from the queue's own (PRECONDITION_FAILED, the channel
    # closed): this one passes only while the workers' queue is durable and has no `x-max-priority`.
    with Connection(rabbitmq_server.url) as connection:
        channel: Any = connection.default_channel
        channel.queue_declare(RABBIT_QUEUE, durable=True, auto_delete=False)


def test_a_worker_killed_mid_call_is_taken_over_and_each_body_runs_once_more(
    module_redis: RedisServer,
    rabbitmq_server: RabbitServer,
    model_server: RecordingModelServer,
    client: Client,
    rabbit_orchestrator: OrchestratorHandle,
) -> None:
    env = broker_env(rabbitmq_server)
    workers = [
        start_worker(module_redis.url, [TOOLS], queues=[KILL_QUEUE], concurrency=3, env=env) for _ in range(2)
    ]
    try:
        keys = [f"kill-{uuid.uuid4().hex[:8]}" for _ in range(6)]
        names = ["rabbit_kill_counted", "rabbit_kill_once"]
        calls = [
            {"name": names[i % 2], "arguments": {"key": key, "first_run_s": 4}} for i, key in enumerate(keys)
        ]
        turn_id = client.submit(prompt=plan_prompt([{"calls": calls}]), model="scripted:plan")
        wait_until(lambda: len(event_data(client.redis, turn_id, "tool_started")) == 6, "every call to start")
        started = event_data(client.redis, turn_id, "tool_started")
        victim = next(w for w in workers if w.hostname == started[0]["worker"])
        killed = {s["call_id"] for s in started if s["worker"] == victim.hostname}
        os.killpg(victim.pid, signal.SIGKILL)  # the main process and its pool: nobody answers for its calls
        outcome = wait_outcome(client, turn_id)
        assert outcome.status == "completed", outcome
        assert_every_call_answered_once(outcome.messages)
        answers = {m.tool_call_id: str(m.content) for m in outcome.messages if isinstance(m, ToolMessage)}
        for index, key in enumerate(keys):
            call_id = f"call_r0_{index}"  # the scripted model's ids
            runs = 2 if call_id in killed else 1
            assert answers[call_id] == f"run {runs} of {key}", (call_id, answers)
            assert int(client.redis.get(f"{COUNTER_PREFIX}{key}") or 0) == runs
        # Taken over by the redelivered delivery, not sent again by the orchestrator.
        assert event_data(client.redis, turn_id, "tool_redispatched") == []
        survivor = next(w for w in workers if w is not victim)
        assert survivor.log_text().count("taking over from") == len(killed)
    finally:
        for worker in workers:
            worker.stop()


@pytest.mark.usefixtures("rabbit_orchestrator")
def test_flower_sees_the_tasks_over_amqp(
    module_redis: RedisServer,
    rabbitmq_server: RabbitServer,
    rabbit_workers: list[WorkerHandle],
    client: Client,
) -> None:
    port = find_free_port()
    env = {
        **os.environ,
        "TOOLLOOP_REDIS_URL": module_redis.url,
        **broker_env(rabbitmq_server),
        "FLOWER_BASIC_AUTH": f"{AUTH[0]}:{AUTH[1]}",
        "PYTHONPATH": str(ROOT),
    }
    process = subprocess.Popen(
        [str(TOOLLOOP_BIN), "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def sees_worker() -> bool:
        try:
            return bool(
                flower_get(base, "/api/workers", status="true").json().get(rabbit_workers[0].hostname)
            )
        except (httpx.TransportError, ValueError):
            return False

    try:
        wait_until(sees_worker, "Flower to receive the workers' events over AMQP")
        key = f"flower-{uuid.uuid4().hex[:8]}"
        call = {"name": "rabbit_counted", "arguments": {"key": key}}
        turn_id = client.submit(prompt=plan_prompt([{"calls": [call]}]), model="scripted:plan")
        assert wait_outcome(client, turn_id).status == "completed"
        [dispatched] = event_data(client.redis, turn_id, "tool_dispatched")

        def state() -> str | None:
            task = flower_get(base, "/api/tasks").json().get(dispatched["task_id"])
            return task.get("state") if task else None

        wait_until(lambda: state() == "SUCCESS", "Flower to show the task SUCCESS")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def test_a_broker_stopped_mid_stream_is_named_and_ridden_out(
    own_redis: RedisServer, own_rabbitmq: RabbitServer, model_server: RecordingModelServer
) -> None:
    env = broker_env(own_rabbitmq)
    worker = start_worker(own_redis.url, [TOOLS], queues=[RABBIT_QUEUE], concurrency=3, env=env)
    orchestrator = start_orchestrator(own_redis.url, model_base_url=model_server.base_url, env=env)
    client = Client(own_redis.url)
    try:
        call = {"name": "rabbit_counted", "arguments": {"key": f"before-{uuid.uuid4().hex[:8]}"}}
        first = client.submit(prompt=plan_prompt([{"calls": [call]}]), model="scripted:plan")
        assert wait_outcome(client, first).status == "completed"
        own_rabbitmq.stop()
        keys = [f"restart-{uuid.uuid4().hex[:8]}" for _ in range(3)]
        turns = [
            client.submit(
                prompt=plan_prompt([{"calls": [{"name": "rabbit_counted", "arguments": {"key": key}}]}]),
                model="scripted:plan",
            )
            for key in keys
        ]
        shown = own_rabbitmq.url.replace(own_rabbitmq.password, "**")
        wait_until(
            lambda: f"the broker at {shown} is unreachable" in orchestrator.log_text(),
            "the orchestrator to name the broker's outage",
            detail=orchestrator.log_text,
        )
        own_rabbitmq.start()
        for turn_id, key in zip(turns, keys, strict=True):
            outcome = wait_outcome(client, turn_id)
            assert outcome.status == "completed", outcome
            assert contents(outcome.messages) == [f"run 1 of {key}"]
        log = orchestrator.log_text()
        assert own_rabbitmq.password not in log
        assert "Redis at" not in log
        assert f"the broker at {shown} is back" in log
    finally:
        client.redis.close()
        orchestrator.stop()
        worker.stop()
