"""The archive hook end to end: finished turns land in a team's SQLite through its own Celery worker.

Real processes only: a Redis of the module's own, a prefork `toolloop worker` serving the e2e tools,
`toolloop orchestrator` with TOOLLOOP_ARCHIVE_TASK set, the scripted model over HTTP, and a plain Celery
prefork worker (`celery -A workers.examples.archive_sqlite worker -Q toolloop.archive`) running the very
module docs/operations/durability.md shows, writing into a SQLite file of the test's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import AssistantMessage, TurnOutcome
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, WorkerHandle
from tests.support.turns import wait_outcome
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ARCHIVE_TASK = "teamapp.archive_turn"
CELERY_BIN = Path(sys.executable).parent / "celery"


@pytest.fixture(scope="module")
def archive_db() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="toolloop-archive-") as folder:
        yield Path(folder) / "turns.sqlite3"


@pytest.fixture(scope="module")
def archive_worker(module_redis: RedisServer, archive_db: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The team's Celery worker, prefork, on the archive queue only."""
    log = Path(tempfile.mkstemp(prefix="toolloop-archive-worker-", suffix=".log")[1])
    env = {
        **os.environ,
        "TOOLLOOP_REDIS_URL": module_redis.url,
        "TOOLLOOP_ARCHIVE_TASK": ARCHIVE_TASK,
        "ARCHIVE_SQLITE_PATH": str(archive_db),
        "PYTHONPATH": str(ROOT),
    }
    command = [
        str(CELERY_BIN),
        "-A",
        "workers.examples.archive_sqlite",
        "worker",
        "-Q",
        "toolloop.archive",
        "--pool=prefork",
        "--concurrency=1",
        f"--hostname=archive-{uuid.uuid4().hex[:8]}@localhost",
        "--without-mingle",
        "--without-gossip",
        "--loglevel=INFO",
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


@pytest.fixture(scope="module")
def archiving_orchestrator(
    module_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(
        module_redis.url, model_base_url=model_server.base_url, env={"TOOLLOOP_ARCHIVE_TASK": ARCHIVE_TASK}
    )
    yield handle
    handle.stop()


def read_archived(db: Path, turn_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The turns row and the calls rows of `turn_id`, or None while it is not archived."""
    if not db.exists():
        return None
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        try:
            turn = conn.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
        except sqlite3.OperationalError:  # the worker has not created the tables yet
            return None
        if turn is None:
            return None
        calls = conn.execute("SELECT * FROM calls WHERE turn_id = ? ORDER BY position", (turn_id,))
        return dict(turn), [dict(row) for row in calls]


def wait_archived(db: Path, turn_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return wait_for(lambda: read_archived(db, turn_id), f"turn {turn_id} in the archive")


def assert_archived_whole(
    row: tuple[dict[str, Any], list[dict[str, Any]]], outcome: TurnOutcome, prompt: str
) -> None:
    turn, _ = row
    assert turn["status"] == outcome.status == "completed"
    assert json.loads(turn["request"])["prompt"] == prompt
    assert json.loads(turn["messages"]) == [m.model_dump(mode="json") for m in outcome.messages]
    assert json.loads(turn["usage"]) == outcome.usage.model_dump(mode="json")
    assert outcome.usage.total_tokens > 0
    assert len(json.loads(turn["llm_call_records"])) == outcome.llm_calls


@pytest.mark.usefixtures("archive_worker", "archiving_orchestrator")
def test_a_finished_turn_is_archived_whole(client: Client, archive_db: Path) -> None:
    prompt = plan_prompt(
        [
            {
                "calls": [
                    {"name": "e2e_add", "arguments": {"a": 6, "b": 7}},
                    {"name": "e2e_multiply", "arguments": {"a": 6, "b": 7}},
                ]
            }
        ]
    )
    turn_id = client.submit(prompt=prompt, model="scripted:plan")
    outcome = wait_outcome(client, turn_id)

    row = wait_archived(archive_db, turn_id)
    assert_archived_whole(row, outcome, prompt)
    turn, calls = row
    assert turn["first_message_index"] == 0
    assert [(c["call_id"], c["tool"], c["ok"]) for c in calls] == [
        ("call_r0_0", "e2e_add", 1),
        ("call_r0_1", "e2e_multiply", 1),
    ]
    for call in calls:
        # What the outcome envelope says: who ran it, how often, how long, when.
        assert call["attempts"] == 1
        assert call["worker"]
        assert call["duration_ms"] is not None
        assert call["finished_at"] is not None
        assert call["failure_kind"] is None


@pytest.mark.usefixtures("archive_worker", "archiving_orchestrator")
def test_a_conversation_turn_archives_its_own_calls_only(client: Client, archive_db: Path) -> None:
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    # The plan model plays the rounds of the conversation's first user message: this turn the call and an
    # answer, the next turn (whatever it asks) the round after them.
    script = plan_prompt(
        [
            {"calls": [{"name": "e2e_add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "first turn done"},
            {"calls": [{"name": "e2e_multiply", "arguments": {"a": 3, "b": 4}}]},
        ]
    )
    first = client.submit(prompt=script, model="scripted:plan", conversation_id=conversation)
    wait_outcome(client, first)
    prompt = f"and now the next round {uuid.uuid4().hex}"
    second = client.submit(prompt=prompt, model="scripted:plan", conversation_id=conversation)
    outcome = wait_outcome(client, second)

    row = wait_archived(archive_db, second)
    assert_archived_whole(row, outcome, prompt)
    turn, calls = row
    assert turn["conversation_id"] == conversation
    own = outcome.messages[turn["first_message_index"] :]
    assert turn["first_message_index"] > 0
    assert own[0].role == "user" and own[0].content == prompt
    assert [(c["call_id"], c["tool"], c["ok"]) for c in calls] == [("call_r2_0", "e2e_multiply", 1)]
    earlier = [m for m in outcome.messages[: turn["first_message_index"]] if isinstance(m, AssistantMessage)]
    assert any(call.name == "e2e_add" for m in earlier for call in m.tool_calls)
