"""A tool call as a test drives it: published as the orchestrator publishes it, its outcome read back from
Redis (`keys.outcome`), and the runs of a tool that records them in a file (Redis may be down meanwhile).

    call_id = publish_call(settings, db, "outage_work", {"runs_file": ...}, prefix="outage")
    outcome = wait_tool_outcome(db, call_id)   # once written; fails naming the call if it never is
    stored_outcome(db, call_id)                # what is there now, or None
    record_run(runs_file, "start"); read_runs(Path(runs_file))   # in the tool; in the test
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import redis

from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.store.catalogue import read_catalogue
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for
from workers import keys
from workers.contract import ToolCallRequest, ToolOutcome, parse_tool_outcome
from workers.settings import WorkerSettings


def publish_call(
    settings: WorkerSettings,
    catalogue_source: redis.Redis,
    tool: str,
    arguments: dict[str, Any],
    *,
    prefix: str,
) -> str:
    """Publish one call of `tool` (its spec read from `catalogue_source`) as `<prefix>-<hex>`; its id."""
    request = ToolCallRequest(call_id=f"{prefix}-{uuid.uuid4().hex}", tool=tool, arguments=arguments)
    dispatch_call(get_producer_app(settings), read_catalogue(catalogue_source)[tool], request)
    return request.call_id


def stored_outcome(db: redis.Redis, call_id: str) -> ToolOutcome | None:
    """The call's outcome in Redis now, or None while none is written."""
    raw = db.get(keys.outcome(call_id))
    return parse_tool_outcome(raw) if raw is not None else None


def wait_tool_outcome(db: redis.Redis, call_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ToolOutcome:
    """The call's outcome in Redis, once written."""
    return wait_for(lambda: stored_outcome(db, call_id), f"the outcome of {call_id}", timeout_s)


def record_run(runs_file: str, event: str) -> None:
    """In a tool: note `event` (a start, an end) in `runs_file`, one word a line."""
    with Path(runs_file).open("a") as out:
        out.write(event + "\n")


def read_runs(runs_file: Path) -> list[str]:
    """In the test: the events the tool noted so far, in order."""
    return runs_file.read_text().split() if runs_file.exists() else []
