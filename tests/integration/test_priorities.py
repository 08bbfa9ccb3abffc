"""Priority lanes on real processes: an interactive turn's tool call overtakes a batch backlog on the same
tool (one worker process, a slow tool), as kombu's Redis transport keeps a list per priority step and the
orchestrator writes each call into its lane's (`publishing.publisher.REDIS_PRIORITIES`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import Client
from orchestrator.redis_server import RedisServer
from tests.support.concurrency_tools import read_notes
from tests.support.e2e_processes import start_orchestrator
from tests.support.processes import start_worker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUEUE = "toolloop.priority_test"
BATCH = 20
SLOW_S = 0.4


def call_turn(client: Client, runs_file: Path, label: str, priority: str) -> str:
    arguments = {"runs_file": str(runs_file), "label": label, "seconds": SLOW_S}
    plan = {"plan": [{"calls": [{"name": "slow_note", "arguments": arguments}]}, {"text": "done"}]}
    return client.submit(
        prompt=json.dumps(plan),
        tools=["slow_note"],
        model="scripted:plan",
        priority=priority,  # type: ignore[arg-type]
        limits={"deadline_s": 90},
    )


def test_an_interactive_call_overtakes_a_batch_backlog_on_the_same_tool(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    runs_file = tmp_path / "runs"
    worker = start_worker(own_redis.url, ["tests.support.priority_tools"], queues=[QUEUE], concurrency=1)
    orchestrator = start_orchestrator(own_redis.url)
    client = Client(own_redis.url)
    try:
        batch = [call_turn(client, runs_file, f"batch-{n}", "batch") for n in range(BATCH)]
        # Every batch call is in the queue's batch list (step 6) but the one running.
        batch_list = f"{QUEUE}\x06\x166"
        wait_until(lambda: client.redis.llen(batch_list) >= BATCH - 2, "the batch calls to be queued")
        started_before = len(read_notes(runs_file))
        interactive = call_turn(client, runs_file, "interactive", "interactive")
        for turn_id in [interactive, *batch]:
            assert client.wait(turn_id, 90).status == "completed"
        labels = [label for _, _, label in read_notes(runs_file)]
        position = labels.index("interactive")
        print(
            f"\ninteractive call started {position - started_before + 1}th after it was submitted, "
            f"{len(labels) - position - 1} batch calls after it"
        )
        # The call running when it came goes on; the interactive one is next.
        assert position <= started_before + 1
        assert len(labels) - position - 1 >= BATCH - started_before - 2
    finally:
        orchestrator.stop()
        worker.stop()
        client.close()
