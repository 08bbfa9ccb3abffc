"""Taking over a turn whose owner died between persisting a dispatch and publishing it (task R).

The old owner saves each step before performing its commands, so a SIGKILL can land after `tool_dispatched`
is in Redis and before the Celery message is. No worker then ever reports the call, and before the fix the
new owner waited for the turn's deadline. Here the first orchestrator's broker is a port nobody listens on:
it persists the dispatch, then cannot publish, and is killed while it tries — the very window of the bug,
without a race. The survivor must send the call again and complete the turn — not stop it at its deadline
— with the tool run exactly once.
"""

from __future__ import annotations

import uuid

import pytest

from orchestrator.redis_server import find_free_port
from tests.faults.env import FaultEnv, call, is_running
from tests.support.turns import event_data
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# A turn left to its deadline ends `stopped`, not `completed`: the outcome itself tells whether the survivor
# sent the call, so the waits below need no bound tighter than this.
DEADLINE_S = 60.0


def test_a_dispatch_that_died_unpublished_with_its_owner_is_sent_by_the_new_owner() -> None:
    with FaultEnv(lease_ttl_s=1.0) as env:
        env.start_worker(concurrency=1)
        dead_broker = f"redis://127.0.0.1:{find_free_port()}/0"
        victim = env.start_orchestrator(env={"TOOLLOOP_BROKER_URL": dead_broker})
        tag = uuid.uuid4().hex[:12]
        turn_id = env.submit([call("fault_work", tag=tag, seconds=0.2)], deadline_s=DEADLINE_S)
        wait_until(lambda: event_data(env.redis, turn_id, "tool_dispatched"), "the victim's dispatch")
        victim.kill()
        # The dispatch is persisted, and nothing reached the workers: no message, no start, no outcome.
        assert env.runs(tag) == (0, 0)
        assert not event_data(env.redis, turn_id, "tool_synthesized")

        survivor = env.start_orchestrator()
        outcome = env.client.wait(turn_id, DEADLINE_S + 60)
        assert (outcome.status, outcome.stop_reason) == ("completed", None), outcome.text
        assert env.runs(tag) == (1, 1)
        (resumed,) = event_data(env.redis, turn_id, "turn_resumed")
        (dispatched,) = event_data(env.redis, turn_id, "tool_dispatched")
        assert resumed["redispatched_call_ids"] == [dispatched["call_id"]]
        assert is_running(survivor)
