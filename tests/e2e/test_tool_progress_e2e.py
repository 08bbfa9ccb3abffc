"""`ctx.progress` through a real turn: an orchestrator (the scripted `plan` model), a prefork
worker and Redis as processes, the events read with `Client.events` as a web app reads them.

The tool's `tool_progress` events carry the model's call id and the tool's name, come in the order reported,
after the call's `tool_dispatched` and before its `tool_finished`, and never show the sensitive argument.
`tool_started` is written by the orchestrator when it reads the worker's notice, so a report made in the
first milliseconds of a call may come before it: the page shows progress under the dispatched call.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.store.codec import TurnEvent
from tests.faults.env import FaultEnv, call
from workers.contract import REDACTED

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SECRET = "sk-live-e2e-7c1f0a9b"
STEPS = 4


def _index(events: list[TurnEvent], name: str, call_id: str) -> int:
    found = [i for i, e in enumerate(events) if e.name == name and e.data.get("call_id") == call_id]
    assert len(found) == 1, (name, call_id, [e.name for e in events])
    return found[0]


def test_progress_arrives_between_dispatch_and_finish_under_the_models_call_id() -> None:
    with FaultEnv() as env:
        env.start_worker(concurrency=2, modules=("tests.support.progress_tools",))
        env.start_orchestrator()
        planned = call("progress_steps", api_key=SECRET, steps=STEPS, pause_s=0.3)
        turn_id = env.submit([planned, planned])  # two calls of one tool at once: told apart by call id
        events = list(env.client.events(turn_id))
    assert events[-1].name == "turn_finished" and events[-1].data.get("status") == "completed", events[-1]
    dispatched = [e.data["call_id"] for e in events if e.name == "tool_dispatched"]
    assert len(dispatched) == 2 and len(set(dispatched)) == 2
    for call_id in dispatched:
        progress = [
            i for i, e in enumerate(events) if e.name == "tool_progress" and e.data["call_id"] == call_id
        ]
        assert _index(events, "tool_dispatched", call_id) < progress[0]
        assert progress[-1] < _index(events, "tool_finished", call_id)
        assert _index(events, "tool_started", call_id) < _index(events, "tool_finished", call_id)
        assert [events[i].data for i in progress] == [
            {
                "call_id": call_id,
                "tool": "progress_steps",
                "message": f"step {step} of {STEPS} with key {REDACTED}",
                "fraction": step / STEPS,
            }
            for step in range(1, STEPS + 1)
        ]
    assert SECRET not in json.dumps([e.model_dump() for e in events])
