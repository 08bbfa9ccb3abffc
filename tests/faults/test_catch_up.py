"""Redis restarted with its data, an outcome notice lost (issue 12, items 3 and 7): the turn catches up.

A failover or an AOF fsynced every second can keep a call's outcome and lose the notice that told its
orchestrator — or a writer still on the old master can put the notice where nobody reads it. Without a
catch-up the call would wait for the turn's deadline. Here the outcome is written with no notice at all (as
if the notice were the write lost), Redis is restarted with its data, and the orchestrator, seeing the new
run id, reads the outcome and completes the turn long before its deadline. No worker runs: the tool's
catalogue entry is written by the test, and the call's message stays on its queue.
"""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.model import ToolMessage
from orchestrator.runtime.inbox import build_wire_call_id
from tests.faults.env import FaultEnv, call, is_running
from tests.faults.fault_tools import fault_work
from tests.support.waiting import wait_for
from workers import keys
from workers.catalogue import build_catalogue_entry
from workers.contract import ToolOutcome

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DEADLINE_S = 45.0


def _dispatched_call(env: FaultEnv, turn_id: str) -> tuple[str, str]:
    """(call id, wire id) of the turn's call once its dispatch is saved in the turn's state."""

    def dispatched() -> tuple[str, str] | None:
        raw = env.redis.get(keys.turn_state(turn_id))
        current = json.loads(raw).get("current") if raw else None
        for state in (current or {}).get("calls", []):
            if state.get("attempt", 0) > 0:
                return state["call_id"], build_wire_call_id(turn_id, state["call_id"])
        return None

    return wait_for(dispatched, f"turn {turn_id} to dispatch its call")


def test_an_outcome_whose_notice_was_lost_is_read_after_a_restart() -> None:
    with FaultEnv() as env:
        # The tool is catalogued but served by nobody: its call waits on its queue.
        entry = build_catalogue_entry([fault_work.spec], time.time())
        env.redis.hset(keys.CATALOGUE, "nobody@test", entry)
        orchestrator = env.start_orchestrator()
        turn_id = env.submit([call("fault_work", tag="lost-notice")], deadline_s=DEADLINE_S)
        call_id, wire_id = _dispatched_call(env, turn_id)

        outcome = ToolOutcome(
            call_id=wire_id, tool="fault_work", turn_id=turn_id, ok=True, result="done", content="done"
        )
        env.redis.set(keys.outcome(wire_id), outcome.model_dump_json())
        env.server.stop(keep_data=True)  # SHUTDOWN writes the append-only file: the data comes back
        env.server.start()

        finished = env.client.wait(turn_id, DEADLINE_S + 10)
        logs = orchestrator.log_text()
        assert finished.status == "completed", (finished.status, finished.stop_reason, logs)
        answers = [m for m in finished.messages if isinstance(m, ToolMessage)]
        assert [(m.tool_call_id, m.content) for m in answers] == [(call_id, "done")]
        assert is_running(orchestrator)
