"""A team's archive worker: keeps every finished turn in SQLite (the other side of TOOLLOOP_ARCHIVE_TASK).

The orchestrator sends each finished turn's record (`orchestrator.archive.TurnRecord` as JSON) as the task
named by TOOLLOOP_ARCHIVE_TASK on the queue TOOLLOOP_ARCHIVE_QUEUE. This module is a plain Celery app with
that one task; it imports nothing from toolloop, so it can live in any codebase:

    export TOOLLOOP_REDIS_URL=redis://localhost:6379/0      # the broker the orchestrator publishes to
    export TOOLLOOP_ARCHIVE_TASK=myapp.archive_turn         # the same name the orchestrator is given
    export ARCHIVE_SQLITE_PATH=/var/lib/myapp/turns.sqlite3
    celery -A workers.examples.archive_sqlite worker -Q toolloop.archive --concurrency 1

Writing a record again replaces it (the turn id is the key), so a redelivered message is harmless.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from typing import Any

from celery import Celery

app = Celery("archive_sqlite", broker=os.environ.get("TOOLLOOP_REDIS_URL", "redis://localhost:6379/0"))
app.conf.update(
    accept_content=["json"],
    # Acknowledged once written: a worker that dies mid-write gets the record again.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id TEXT PRIMARY KEY,
    conversation_id TEXT,
    status TEXT NOT NULL,
    stop_reason TEXT,
    request TEXT NOT NULL,          -- JSON: the turn's request (sensitive values redacted)
    messages TEXT NOT NULL,         -- JSON: the whole history the turn ended with
    first_message_index INTEGER NOT NULL,
    usage TEXT NOT NULL,            -- JSON: the turn's summed usage
    llm_call_records TEXT NOT NULL, -- JSON: one entry per model call
    finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    turn_id TEXT NOT NULL REFERENCES turns (id),
    position INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    ok INTEGER NOT NULL,
    failure_kind TEXT,
    synthetic INTEGER NOT NULL,
    attempts INTEGER,
    duration_ms REAL,
    worker TEXT,
    finished_at REAL,
    PRIMARY KEY (turn_id, position)
);
"""


def write_record(db_path: str, record: dict[str, Any]) -> None:
    """Store one turn record (`TurnRecord` as JSON) and its calls, replacing an earlier copy, atomically."""
    if record.get("schema_version") != 1:
        raise ValueError(f"unknown archive record version {record.get('schema_version')!r}")
    outcome = record["outcome"]
    with contextlib.closing(sqlite3.connect(db_path, timeout=30)) as db:
        db.executescript(SCHEMA)
        with db:  # one transaction: the turn and its calls, or nothing
            db.execute(
                "INSERT OR REPLACE INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record["turn_id"],
                    record.get("conversation_id"),
                    outcome["status"],
                    outcome.get("stop_reason"),
                    json.dumps(record["request"]),
                    json.dumps(outcome["messages"]),
                    record.get("first_message_index", 0),
                    json.dumps(outcome["usage"]),
                    json.dumps(outcome.get("llm_call_records", [])),
                    record["finished_at"],
                ),
            )
            db.execute("DELETE FROM calls WHERE turn_id = ?", (record["turn_id"],))
            db.executemany(
                "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        record["turn_id"],
                        position,
                        call["call_id"],
                        call["tool"],
                        call["ok"],
                        call.get("failure_kind"),
                        call.get("synthetic", False),
                        call.get("attempts"),
                        call.get("duration_ms"),
                        call.get("worker"),
                        call.get("finished_at"),
                    )
                    for position, call in enumerate(record["calls"])
                ],
            )


@app.task(
    name=os.environ.get("TOOLLOOP_ARCHIVE_TASK", "myapp.archive_turn"),
    # A locked database is retried later, not lost.
    autoretry_for=(sqlite3.OperationalError,),
    retry_backoff=True,
    max_retries=None,
)
def archive_turn(record: dict[str, Any]) -> None:
    """Write the finished turn `record` into the SQLite file at ARCHIVE_SQLITE_PATH."""
    write_record(os.environ.get("ARCHIVE_SQLITE_PATH", "turns.sqlite3"), record)
