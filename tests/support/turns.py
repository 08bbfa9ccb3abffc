"""Reading a turn as a test does: its events straight from its Redis stream, its outcome once it ends, and
the check that its history answers every call once.

    event_data(db, turn_id, "tool_started")      # the data of each such event so far (a snapshot)
    turn_events(db, turn_id)                     # every event so far: {"id", "name", "data"}, oldest first
    outcome = wait_outcome(client, turn_id)      # failing, the status and every event the turn got to
    assert_every_call_answered_once(outcome.messages)

`db` is any client of the turn's Redis, decoding or not.
"""

from __future__ import annotations

from typing import Any

import redis

from orchestrator.client.redis_client import Client
from orchestrator.model import Message, ToolMessage, TurnOutcome
from orchestrator.store import codec
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for
from workers import keys


def turn_events(db: redis.Redis, turn_id: str) -> list[dict[str, Any]]:
    """Every event of the turn's stream so far, oldest first: its stream id, name and data (parsed; a step's
    events share an entry, each with an id of its own: `codec.parse_entry`)."""
    entries = db.xrange(keys.turn_events(turn_id)) or []
    return [{"id": e.id, "name": e.name, "data": e.data} for e in codec.parse_entries(turn_id, entries)]


def event_data(db: redis.Redis, turn_id: str, name: str) -> list[dict[str, Any]]:
    """The data of every event `name` the turn has so far (a snapshot: it never waits for more)."""
    return [event["data"] for event in turn_events(db, turn_id) if event["name"] == name]


def event_ids(db: redis.Redis, turn_id: str) -> list[str]:
    """The stream id of every event the turn has so far, oldest first: what an SSE stream must send."""
    return [event["id"] for event in turn_events(db, turn_id)]


def wait_outcome(client: Client, turn_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> TurnOutcome:
    """The turn's outcome once it is terminal; failing, the status and every event the turn got to."""

    def story() -> str:
        listing = "\n".join(f"  {e['name']}: {e['data']}" for e in turn_events(client.redis, turn_id))
        return f"({client.get(turn_id).status}); events:\n{listing}"

    return wait_for(lambda: client.outcome(turn_id), f"turn {turn_id} to finish", timeout_s, detail=story)


def assert_every_call_answered_once(messages: list[Message]) -> None:
    """Every tool call in the history has exactly one tool message, right after its assistant message."""
    for index, message in enumerate(messages):
        if message.role != "assistant" or not message.tool_calls:
            continue
        expected = [call.id for call in message.tool_calls]
        following = messages[index + 1 : index + 1 + len(expected)]
        answered = [m.tool_call_id for m in following if isinstance(m, ToolMessage)]
        assert answered == expected, f"calls {expected} answered by {answered}"
    all_calls = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    all_answers = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(all_calls) == sorted(all_answers)
    assert len(set(all_answers)) == len(all_answers)
    if messages:
        last = messages[-1]
        assert last.role != "assistant" or not last.tool_calls, "history ends with unanswered tool calls"
