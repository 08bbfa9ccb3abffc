"""Upgrading through the real system: turns written by the previous layout (state version 2, history inline).

The fixtures (`tests/fixtures/v2_*.json`) were written by the code before the history lists, against a real
Redis: a turn killed mid-round (one round answered, the second's call dispatched), and a finished turn of a
conversation (its head the bare turn id, its outcome holding the messages). Loaded into a fresh Redis, the
first is taken over by a real orchestrator and completes, its whole history now in its list; a new turn of
the old conversation sees the old history and continues it in the conversation's list.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, start_orchestrator
from tests.support.processes import start_worker
from tests.support.turns import assert_every_call_answered_once, wait_outcome
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
FIXTURES = Path(__file__).parent.parent / "fixtures"


def read_fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


def moved_to_now(state_json: str) -> str:
    """The fixture's state as if written a moment ago: its times (epoch seconds) moved by the same offset."""
    state = json.loads(state_json)
    shift = time.time() - state["started_at"]
    state["started_at"] += shift
    state["deadline_at"] += shift
    state["timers"] = {name: at + shift for name, at in state["timers"].items()}
    for call in state["current"]["calls"]:
        for field in ("dispatched_at", "started_at"):
            if call[field] is not None:
                call[field] += shift
    return json.dumps(state)


def test_turns_of_the_previous_layout_are_taken_over_and_continued(own_redis: RedisServer) -> None:
    midround = read_fixture("v2_midround_turn.json")
    conversation = read_fixture("v2_conversation_turn.json")
    client = Client(own_redis.url)
    redis = client.redis
    # The previous layout, as it was in Redis: an orphaned running turn, and a finished conversation turn.
    turn_id = midround["turn_id"]
    assert json.loads(midround["state"])["version"] == 2
    redis.set(keys.turn_request(turn_id), midround["request"])
    redis.set(keys.turn_status(turn_id), "running")
    redis.set(keys.turn_state(turn_id), moved_to_now(midround["state"]))
    redis.zadd(keys.TURNS_ACTIVE, {turn_id: time.time()})
    old = conversation["turn_id"]
    for key, value in (
        (keys.turn_request(old), conversation["request"]),
        (keys.turn_status(old), conversation["status"]),
        (keys.turn_outcome(old), conversation["outcome"]),
        (keys.conversation_head(conversation["conversation_id"]), conversation["head"]),
    ):
        redis.set(key, value)
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=2)
    with RecordingModelServer() as model:
        orchestrator = start_orchestrator(own_redis.url, model_base_url=model.base_url)
        try:
            outcome = wait_outcome(client, turn_id, 40)
            assert (outcome.status, outcome.text) == ("completed", "all done")
            answers = [m.content for m in outcome.messages if isinstance(m, ToolMessage)]
            # The answered round kept, the dispatched call sent again.
            assert answers == ["2.0", "slept 1.0 s"]
            assert_every_call_answered_once(outcome.messages)
            # Upgraded: the state is version 3 without its history, which is in the turn's list, once.
            state = json.loads(redis.get(keys.turn_state(turn_id)) or "{}")
            assert state["version"] == 3 and "history" not in state
            assert redis.llen(keys.turn_history(turn_id)) == len(outcome.messages)

            old_messages = client.outcome(old)
            assert old_messages is not None and len(old_messages.messages) == 4
            next_turn = client.submit(
                prompt="what was it?", model="scripted:plan", conversation_id=conversation["conversation_id"]
            )
            continued = wait_outcome(client, next_turn, 40)
            assert (continued.status, continued.text) == ("completed", "I remember: five")
            assert continued.messages[:4] == old_messages.messages
            conversation_list = keys.conversation_history(conversation["conversation_id"])
            assert redis.llen(conversation_list) == len(continued.messages) == 6
            assert "messages" not in json.loads(redis.get(keys.turn_outcome(next_turn)) or "{}")
        finally:
            client.redis.close()
            orchestrator.stop()
            worker.stop()
