"""The sync turn store: what a web app without an event loop needs of turns (`Client`).

The same operations and flows as the async `TurnStore` (`orchestrator.store.operations`, `flows`), performed
by a `SyncRunner` on the sync `redis` client: submitting, reading a turn, waiting for it, following its
events, cancel and approval requests. The guarantees are `TurnStore`'s, block caps included.

Unlike the runtime's store, it rides out a Redis restart or failover (`runner.Patience`): `wait_outcome`
retries until its own timeout, `iter_events` for as long as it takes (resuming after the last event it
yielded), every other call for `retry_s` (`DEFAULT_RETRY_S`); `ping` never retries: it says whether Redis
answers now.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import codec, flows, history, operations, turn_stream
from orchestrator.store.agents import get_agents, put_agent
from orchestrator.store.catalogue import RecentCatalogue
from orchestrator.store.codec import TurnEvent
from orchestrator.store.connection import block_cap_ms, build_shown_url, connect_sync
from orchestrator.store.runner import DEFAULT_RETRY_S, Patience, SyncRunner
from orchestrator.store.turn_stream import StreamEvent
from orchestrator.store.turn_view import TurnView
from workers.agents import AgentSpec
from workers.keys import TOOL_GONE_AFTER_S


class SyncTurnStore:
    """Sync access to turns in Redis: submit, read, wait, follow, cancel, approve."""

    def __init__(
        self, redis: redis.Redis, *, where: str = "Redis", retry_s: float | None = DEFAULT_RETRY_S
    ) -> None:
        self.redis = redis
        self.block_cap_ms = block_cap_ms(redis)
        self.retry_s = retry_s
        self._runner = SyncRunner(redis, where=where)
        # The catalogue a submit read last: a burst of submits naming the same tools costs one read.
        self._recent_catalogue = RecentCatalogue()

    @classmethod
    def from_url(
        cls, redis_url: str, *, ssl_cert_reqs: str = "required", retry_s: float | None = DEFAULT_RETRY_S
    ) -> SyncTurnStore:
        """A store on a new connection pool for `redis_url` (close it with `close`)."""
        return cls(connect_sync(redis_url, ssl_cert_reqs), where=build_shown_url(redis_url), retry_s=retry_s)

    def _patience(self) -> Patience:
        # A call without a deadline of its own waits for Redis `retry_s` from when it starts.
        return Patience.for_s(self.retry_s)

    def read_agents(self) -> dict[str, AgentSpec]:
        """Every named agent (`workers.agents`), by name."""
        return self._runner.run(get_agents(), self._patience())

    def register_agent(self, spec: AgentSpec) -> None:
        """Register (or replace) a named agent."""
        self._runner.run(put_agent(spec), self._patience())

    def close(self) -> None:
        """Close the underlying connection pool."""
        self.redis.close()

    def submit(
        self,
        request: TurnRequest,
        *,
        turn_id: str | None = None,
        check: flows.SubmitCheck | None = None,
        tool_gone_after_s: float = TOOL_GONE_AFTER_S,
    ) -> str:
        """Store a turn and queue it (or park it behind its conversation's running turn); returns its id.

        Submitting again with the same `turn_id` is a no-op that returns the id. Its models are checked by
        `check` (`orchestrator.submit_checks`); its tools must have been served within `tool_gone_after_s`
        (TOOLLOOP_TOOL_GONE_AFTER_S)."""
        flow = flows.submit(
            request,
            turn_id,
            codec.now_s(),
            check=check,
            recent=self._recent_catalogue,
            tool_gone_after_s=tool_gone_after_s,
        )
        return self._runner.run_flow(flow, self._patience())

    def get_status(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, or None for an unknown turn."""
        return self._runner.run(operations.get_status(turn_id), self._patience())

    def get_outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome, or None while the turn runs (or when unknown)."""
        return self._runner.run(history.get_outcome(turn_id), self._patience())

    def require_view(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far and outcome in one read; UnknownTurnError if unknown."""
        return self._runner.run(operations.require_view(turn_id), self._patience())

    def wait_outcome(self, turn_id: str, timeout_s: float) -> TurnOutcome:
        """Block until the turn is terminal; else TimeoutError (as `TurnStore.wait_outcome`)."""
        flow = flows.wait_outcome(turn_id, timeout_s, cap_ms=self.block_cap_ms, clock=time.monotonic)
        return self._runner.run_flow(flow, Patience.for_s(timeout_s))

    def iter_events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> Iterator[TurnEvent]:
        """Every event from `after` on, as they come, ending after `turn_finished` (as `TurnStore`'s)."""
        flow = flows.follow_events(turn_id, after, block_ms=block_ms, cap_ms=self.block_cap_ms)
        return self._runner.iter_flow(flow, Patience.for_s(None))

    def iter_stream(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> Iterator[StreamEvent]:
        """The turn's events as typed events, `TurnFinishedEvent` last (`store.turn_stream`)."""
        flow = turn_stream.stream_turn(turn_id, after, block_ms=block_ms, cap_ms=self.block_cap_ms)
        return self._runner.iter_flow(flow, Patience.for_s(None))

    def request_cancel(self, turn_id: str) -> bool:
        """Ask the turn's owner to cancel it. False when already terminal; UnknownTurnError when unknown."""
        flow = flows.send_control(turn_id, "cancel", None, None, codec.now_s())
        return self._runner.run_flow(flow, self._patience())

    def request_approval(
        self,
        turn_id: str,
        call_id: str,
        approved: bool,
        *,
        arguments: Mapping[str, Any] | None = None,
        reason: str | None = None,
        decided_by: str | None = None,
    ) -> bool:
        """Approve (with edited `arguments`) or deny (with a `reason`) a call waiting for confirmation, as
        `decided_by` (`flows.send_approval`). False if terminal; UnknownTurnError if unknown."""
        now = codec.now_s()
        flow = flows.send_approval(
            turn_id, call_id, approved, now, arguments=arguments, reason=reason, decided_by=decided_by
        )
        return self._runner.run_flow(flow, self._patience())

    def request_client_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of a client-side tool with its result or an error (`flows.send_client_result`).
        False if terminal; UnknownTurnError if unknown."""
        flow = flows.send_client_result(turn_id, call_id, codec.now_s(), result=result, error=error)
        return self._runner.run_flow(flow, self._patience())

    def ping(self) -> bool:
        """True when Redis answers."""
        return self._runner.run(operations.ping())
