"""Resuming through the real system: an orchestrator SIGKILLed while its model call is in flight.

The replacement must send the very same model request again — the same call, not a new one nor a retry —
so the turn completes within `max_llm_calls` equal to the number of answers it needs, and the tool that
already ran is not sent again. The model is the scripted one over HTTP, holding one chosen request until the
test lets it go, so the kill surely lands while that request is open.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.processes import start_worker
from tests.support.turns import assert_every_call_answered_once, event_data, wait_outcome
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


class HoldingModelServer(RecordingModelServer):
    """The recording scripted model, holding the `hold`-th request carrying `marker` open."""

    def __init__(self, marker: str, hold: int) -> None:
        super().__init__()
        self.marker = marker
        self.hold = hold

    def should_hold(self, body: str, bodies: list[str]) -> bool:
        return self.marker in body and sum(1 for b in bodies if self.marker in b) == self.hold

    def count(self) -> int:
        """How many requests carried the marker so far."""
        return self.requests_with(self.marker)

    def marked_requests(self) -> list[dict[str, Any]]:
        """Every request body carrying the marker so far, decoded, in arrival order."""
        return [body for body in self.requests() if self.marker in json.dumps(body)]


def test_an_orchestrator_killed_during_a_model_call_is_replaced_and_the_call_is_made_again(
    own_redis: RedisServer,
) -> None:
    marker = f"resume-{uuid.uuid4().hex}"
    key = f"resume-{uuid.uuid4().hex[:8]}"
    plan = [{"calls": [{"name": "e2e_counted", "arguments": {"key": key}}]}, {"text": "all done"}]
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=1)
    client = Client(own_redis.url)
    second: OrchestratorHandle | None = None
    # The second model call (after the tool's answer) is held until the first orchestrator is dead.
    with HoldingModelServer(marker, hold=2) as model:
        first = start_orchestrator(own_redis.url, model_base_url=model.base_url)
        try:
            turn_id = client.submit(
                prompt=f"{marker} " + json.dumps({"plan": plan}),
                model="scripted:plan",
                limits={"max_llm_calls": 2},
            )
            wait_until(lambda: model.count() == 2, "the second model call to reach the model")
            first.kill()
            model.released.set()  # the held answer now goes to a dead socket
            second = start_orchestrator(own_redis.url, model_base_url=model.base_url)
            outcome = wait_outcome(client, turn_id)

            # Two answers needed, two model calls counted: the repeated request is not a new call, and
            # with max_llm_calls=2 a call counted twice would have stopped the turn instead.
            assert (outcome.status, outcome.stop_reason, outcome.text) == ("completed", None, "all done")
            assert outcome.llm_calls == 2
            assert [r.error for r in outcome.llm_call_records] == [None, None]
            requests = model.marked_requests()
            assert len(requests) == 3
            assert requests[2] == requests[1], "the new owner sent a different request for the same call"
            assert not event_data(client.redis, turn_id, "model_failed")
            # Resumed once (by the second owner: the first is dead), at the model call it had in flight.
            resumed = event_data(client.redis, turn_id, "turn_resumed")
            assert [e["llm_call_index"] for e in resumed] == [1]
            # The tool that already ran was neither sent again nor run again.
            assert len(event_data(client.redis, turn_id, "tool_dispatched")) == 1
            assert int(client.redis.get(f"{COUNTER_PREFIX}{key}") or 0) == 1
            answer = next(m for m in outcome.messages if isinstance(m, ToolMessage))
            assert answer.content == f"run 1 of {key}"
            assert_every_call_answered_once(outcome.messages)
        finally:
            client.redis.close()
            for process in (first, second):
                if process is not None:
                    process.stop()
            worker.stop()
