"""The async turn store: every Redis read and write of turns, leases, events, control and tool outcomes.

On `redis.asyncio.Redis`, whether or not the client decodes responses. Each method performs operations of
`orchestrator.store.operations` (or a flow of `orchestrator.store.flows`) with an `AsyncRunner`; the sync
`SyncTurnStore` (`orchestrator.store.sync_turns`) performs the same ones for the sync `Client`. The layout is
drawn in `orchestrator.store.codec`, the scripts and their results in `orchestrator.store.scripts`.

Guarantees:
- `submit` writes the request, status `queued`, the active-turn index and the queue entry in one script: the
  turn is in Redis (durable as far as Redis is configured to be) before it returns.
- A turn is owned by whoever sets its lease with SET NX (`claim`, `take_over`); `renew_leases` reports leases
  lost, and `save_step(..., orchestrator_id=...)` refuses a writer that no longer owns the turn.
- `save_step` writes a step's state, status, the messages it added to the history (appended once to the
  turn's history list, `orchestrator.store.history`) and the events it emitted in one script (one round trip):
  a refused step writes none, so the events stream never tells of a step that was not kept.
- `save_outcome` is the first terminal write; it publishes `turn_finished` atomically with the outcome (the
  runtime never appends that event itself: `append_event` ignores it) and queues the conversation's next turn.
- Turns of one conversation run one at a time: a later turn is only queued when the previous one is terminal,
  so a claimer blocks on the queue and never polls.
- No blocking read (XREAD BLOCK, BLMOVE) blocks longer than `block_cap_ms` of the client, well under its
  socket timeout (`orchestrator.store.connection`); whoever waits longer loops until its own deadline.

Design notes: docs/design/storage.md, "Saving a step".
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from orchestrator.errors import UnknownTurnError
from orchestrator.model import ChildReport, ParentLink, TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import cluster, codec, flows, history, operations
from orchestrator.store.agents import get_agents
from orchestrator.store.catalogue import RecentCatalogue
from orchestrator.store.codec import ClaimedTurn, ControlRequest, TurnEvent
from orchestrator.store.connection import (
    MAX_BLOCK_MS,
    block_cap_ms,
    build_block_ms,
    connect_async,
    connect_sync,
)
from orchestrator.store.flows import UNREAD, Unread
from orchestrator.store.history import Appended, Prior, StoredState
from orchestrator.store.runner import AsyncRunner
from orchestrator.store.scripts import FinishResult, ParkResult, SaveResult, TakeOverResult
from orchestrator.store.turn_view import TurnView
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from workers import keys
from workers.agents import AgentSpec
from workers.contract import ToolOutcome
from workers.keys import DEFAULT_RETENTION, TOOL_GONE_AFTER_S, Retention

__all__ = [
    "MAX_BLOCK_MS",
    "UNREAD",
    "ControlRequest",
    "TurnEvent",
    "TurnStore",
    "TurnView",
    "UnknownTurnError",
    "Unread",
    "block_cap_ms",
    "build_block_ms",
    "connect_async",
    "connect_sync",
]

DEFAULT_LEASE_TTL_S = 15.0


class TurnStore:
    """Async access to turns in Redis for the orchestrator runtime, the async client and the HTTP API."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        retention: Retention = DEFAULT_RETENTION,
    ) -> None:
        self.redis = redis
        self.lease_ttl_s = lease_ttl_s
        self.retention = retention
        self.block_cap_ms = block_cap_ms(redis)
        self._runner = AsyncRunner(redis)
        # The catalogue a submit read last: a burst of submits naming the same tools costs one read.
        self._recent_catalogue = RecentCatalogue()

    @classmethod
    def from_url(
        cls,
        redis_url: str,
        *,
        ssl_cert_reqs: str = "required",
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        retention: Retention = DEFAULT_RETENTION,
        max_connections: int | None = None,
    ) -> TurnStore:
        """A store on a new connection pool for `redis_url` (close it with `aclose`), of at most
        `max_connections` (default: redis-py's)."""
        client = connect_async(redis_url, ssl_cert_reqs, max_connections=max_connections)
        return cls(client, lease_ttl_s=lease_ttl_s, retention=retention)

    async def aclose(self) -> None:
        """Close the underlying connection pool."""
        await self.redis.aclose()

    # --- submitting and claiming -------------------------------------------------------------------------

    async def submit(
        self,
        request: TurnRequest,
        *,
        turn_id: str | None = None,
        tool_gone_after_s: float = TOOL_GONE_AFTER_S,
    ) -> str:
        """Store a turn and queue it (or park it behind its conversation's running turn); returns its id.

        Submitting again with the same `turn_id` is a no-op that returns the id: a web app may retry safely.
        Its tools must have been served within `tool_gone_after_s` (TOOLLOOP_TOOL_GONE_AFTER_S).
        """
        flow = flows.submit(
            request,
            turn_id,
            codec.now_s(),
            recent=self._recent_catalogue,
            tool_gone_after_s=tool_gone_after_s,
        )
        return await self._runner.run_flow(flow)

    async def claim(
        self, orchestrator_id: str, *, timeout_s: float, lease_ttl_s: float | None = None
    ) -> str | None:
        """The id of the next queued turn, leased to `orchestrator_id` (`claim_turn`)."""
        claimed = await self.claim_turn(orchestrator_id, timeout_s=timeout_s, lease_ttl_s=lease_ttl_s)
        return None if claimed is None else claimed.turn_id

    async def claim_turn(
        self,
        orchestrator_id: str,
        *,
        timeout_s: float,
        lease_ttl_s: float | None = None,
        caps: RunningCaps = NO_CAPS,
    ) -> ClaimedTurn | None:
        """The next queued turn — by lane, then tenant by tenant, a tenant at its cap in `caps` passed over —
        leased to `orchestrator_id`, with its request read in the same script; None when none came within
        `timeout_s` (`flows.claim`)."""
        ttl_ms = int((lease_ttl_s or self.lease_ttl_s) * 1000)
        flow = flows.claim(
            orchestrator_id,
            timeout_s=timeout_s,
            ttl_ms=ttl_ms,
            cap_ms=self.block_cap_ms,
            clock=time.monotonic,
            caps=caps,
        )
        return await self._runner.run_flow(flow)

    async def renew_leases(self, orchestrator_id: str, turn_ids: Collection[str], ttl_s: float) -> set[str]:
        """Extend this orchestrator's leases; returns the ids whose lease it no longer holds (to drop)."""
        if not turn_ids:
            return set()
        if keys.is_cluster_layout():
            return await self._runner.run(
                cluster.renew_leases(orchestrator_id, list(turn_ids), int(ttl_s * 1000))
            )
        return await self._runner.run(
            operations.renew_leases(orchestrator_id, list(turn_ids), int(ttl_s * 1000))
        )

    async def keep_inbox(self, orchestrator_id: str, ttl_s: float) -> bool:
        """Keep this orchestrator's inbox for `ttl_s` more (`keys.build_inbox_ttl_s`): a dead orchestrator's
        inbox expires. Forgets the orchestrators not seen for as long. True when the inbox was missing."""
        if keys.is_cluster_layout():
            return await self._runner.run(
                cluster.keep_inbox(orchestrator_id, int(ttl_s * 1000), codec.now_s())
            )
        keep = operations.keep_inbox(orchestrator_id, int(ttl_s * 1000), codec.now_s())
        return await self._runner.run(keep)

    async def release(self, orchestrator_id: str, turn_id: str) -> None:
        """Give up the lease on a turn (only if this orchestrator holds it)."""
        await self._runner.run(operations.release(orchestrator_id, turn_id))

    async def park(
        self, orchestrator_id: str, turn_id: str, look_at: float, control_after: str
    ) -> ParkResult:
        """Give up the lease of a turn that only waits for people, parked until an answer or `look_at`
        (epoch s) queues it; UNREAD when a control request past `control_after` came first (`park.lua`)."""
        if keys.is_cluster_layout():
            return await self._runner.run_flow(cluster.park(orchestrator_id, turn_id, look_at, control_after))
        return await self._runner.run(operations.park(orchestrator_id, turn_id, look_at, control_after))

    async def wake_parked(self, due_by: float, limit: int = 100) -> list[str]:
        """Queue the parked turns to be looked at by `due_by` (epoch s); their ids."""
        if keys.is_cluster_layout():
            return await self._runner.run_flow(cluster.wake_parked(due_by, limit))
        return await self._runner.run(operations.wake_parked(due_by, limit))

    async def find_orphans(self, limit: int = 100) -> list[str]:
        """Non-terminal turns that nobody leases: running/waiting ones, and ids a dead claimer left behind."""
        if keys.is_cluster_layout():
            return await self._runner.run_flow(cluster.find_orphans(limit, codec.now_s()))
        return await self._runner.run(operations.find_orphans(limit))

    async def take_over(self, orchestrator_id: str, turn_id: str, ttl_s: float) -> bool:
        """Lease an orphaned turn; False when it is terminal, still queued normally, or already leased."""
        if keys.is_cluster_layout():
            result = await self._runner.run_flow(
                cluster.take_over(orchestrator_id, turn_id, int(ttl_s * 1000))
            )
        else:
            result = await self._runner.run(operations.take_over(orchestrator_id, turn_id, int(ttl_s * 1000)))
        return result is TakeOverResult.TAKEN

    # --- state -------------------------------------------------------------------------------------------

    async def load_request(self, turn_id: str) -> TurnRequest | None:
        """The submitted request."""
        return await self._runner.run(operations.get_request(turn_id))

    async def load_state_and_request(self, turn_id: str) -> tuple[StoredState | None, TurnRequest | None]:
        """The state with its history, and the request, in one round trip (what adopting a turn reads)."""
        return await self._runner.run(history.get_state_and_request(turn_id))

    async def load_request_text(self, turn_id: str) -> str | None:
        """The request as stored, unparsed, or None."""
        return await self._runner.run(operations.get_request_text(turn_id))

    async def load_state(self, turn_id: str) -> str | None:
        """The serialised machine state last saved (without its history), or None before the first save."""
        return await self._runner.run(operations.get_state(turn_id))

    async def save_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        orchestrator_id: str | None = None,
        append: Appended | None = None,
    ) -> bool:
        """`write_step`: True when saved."""
        result = await self.write_step(
            turn_id, state_json, status, events, orchestrator_id=orchestrator_id, append=append
        )
        return result is SaveResult.SAVED

    async def write_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        orchestrator_id: str | None = None,
        append: Appended | None = None,
        lists_kept: bool = False,
    ) -> SaveResult:
        """Persist a step's state and status, append its new messages (`append`) to the turn's history list,
        and `append_event` each `(name, data)` in `events`, atomically, in one round trip. `lists_kept`: the
        caller, the turn's owner, saved into its lists before (they carry no TTL to remove).

        Not SAVED (and nothing written) when the turn is already terminal, when, given `orchestrator_id`, that
        orchestrator no longer holds the lease, or when the list lacks messages before `append.start`
        (HISTORY_GAP: save again with the whole history). `turn_finished` is skipped, as by `append_event`."""
        operation = operations.save_step(
            turn_id,
            state_json,
            status,
            events,
            orchestrator_id=orchestrator_id,
            now=codec.now_s(),
            append=append,
            audit_ttl_s=self.retention.audit_ttl_s,
            lists_kept=lists_kept,
        )
        return await self._runner.run(operation)

    async def finish_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        outcome: TurnOutcome,
        conversation_id: str | None,
        orchestrator_id: str,
        append: Appended | None = None,
        lists_kept: bool = False,
        tenant: str | None = None,
    ) -> SaveResult:
        """`write_step` and `save_outcome` in one round trip, for a turn's last step: SAVED when both are
        stored (and the lease released); the step's refusal otherwise, with nothing written. One Redis only
        (`operations.finish_step`)."""
        now = codec.now_s()
        step = operations.save_step(
            turn_id,
            state_json,
            status,
            events,
            orchestrator_id=orchestrator_id,
            now=now,
            append=append,
            audit_ttl_s=self.retention.audit_ttl_s,
            lists_kept=lists_kept,
        )
        end = operations.save_outcome(
            turn_id,
            outcome,
            conversation_id,
            now,
            self.retention,
            orchestrator_id=orchestrator_id,
            tenant=tenant,
        )
        return await self._runner.run(operations.finish_step(step, end))

    async def save_outcome(
        self,
        turn_id: str,
        outcome: TurnOutcome,
        *,
        conversation_id: str | Unread | None = UNREAD,
        orchestrator_id: str | None = None,
        tenant: str | None = None,
    ) -> bool:
        """The terminal write: outcome, status, `turn_finished` event, TTLs, conversation head and next turn.

        The outcome's messages must be in the turn's history list (`save_step` put them there): the stored
        outcome and the head reference them. `conversation_id` is the turn's (None: it has none), when the
        caller knows it already; otherwise it is read from the request. With `orchestrator_id`, its lease on
        the turn is released in the same round trip, whichever write won. Returns False when the turn was
        already terminal (the first terminal write wins).
        """
        flow = flows.save_outcome(
            turn_id,
            outcome,
            conversation_id,
            codec.now_s(),
            self.retention,
            orchestrator_id=orchestrator_id,
            tenant=tenant,
        )
        return await self._runner.run_flow(flow) is FinishResult.FINISHED

    async def resave_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        orchestrator_id: str | None = None,
        append: Appended | None = None,
        lists_kept: bool = False,
    ) -> SaveResult:
        """`save_step` again after a try whose reply was lost: SAVED at once if that try saved `state_json`.

        Saving twice would append the step's events twice; the state stored is the proof that the first try
        landed, as a step's state differs from every other (it carries the step's times). The messages could
        not be appended twice either way: `save_step.lua` appends after the length the state had before."""
        if await self.load_state(turn_id) == state_json:
            return SaveResult.SAVED
        return await self.write_step(
            turn_id,
            state_json,
            status,
            events,
            orchestrator_id=orchestrator_id,
            append=append,
            lists_kept=lists_kept,
        )

    async def get_status(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, or None for an unknown turn."""
        return await self._runner.run(operations.get_status(turn_id))

    async def get_outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome, or None while the turn runs (or when unknown)."""
        return await self._runner.run(history.get_outcome(turn_id))

    async def get_view(self, turn_id: str) -> TurnView | None:
        """Status, request, transcript so far and outcome in one read; None for an unknown turn."""
        return await self._runner.run(operations.get_view(turn_id))

    async def require_view(self, turn_id: str) -> TurnView:
        """`get_view` of a turn that must exist: UnknownTurnError for an unknown turn."""
        return await self._runner.run(operations.require_view(turn_id))

    async def conversation_history(self, conversation_id: str) -> Prior:
        """The history of the conversation's last finished turn (none for a new conversation), and how much
        of it the conversation's list holds."""
        return await self._runner.run_flow(flows.conversation_history(conversation_id))

    # --- events and control ------------------------------------------------------------------------------

    async def append_event(self, turn_id: str, name: str, data: Mapping[str, Any]) -> str | None:
        """Publish one progress event (sensitive values redacted); returns its stream id.

        `turn_finished` is ignored here: `save_outcome` publishes it atomically with the outcome.
        """
        return await self.append_events(turn_id, [(name, data)])

    async def append_events(
        self, turn_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> str | None:
        """Publish progress events (sensitive values redacted), in order, in one round trip; the last one's
        stream id (None when there was none to publish: `turn_finished` is ignored, as by `append_event`)."""
        if not any(name != codec.TURN_FINISHED for name, _ in events):
            return None
        return await self._runner.run(operations.append_events(turn_id, events, codec.now_s()))

    async def read_events(
        self, turn_id: str, after: str = "0", block_ms: float | None = None, count: int | None = None
    ) -> list[TurnEvent]:
        """Events after the stream id `after`; with `block_ms`, waits up to that long (at most `block_cap_ms`)
        for the first one, and may return [] before anything came."""
        block = None if block_ms is None else build_block_ms(block_ms, self.block_cap_ms)
        return await self._runner.run(operations.read_events(turn_id, after, block, count))

    def iter_events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[TurnEvent]:
        """Every event from `after` on, as they come, ending after `turn_finished` (UnknownTurnError).

        However long the turn stays silent: each read blocks at most `block_ms` (default and cap:
        `block_cap_ms`), then the turn's status is checked and the next read starts."""
        flow = flows.follow_events(turn_id, after, block_ms=block_ms, cap_ms=self.block_cap_ms)
        return self._runner.iter_flow(flow)

    async def wait_outcome(self, turn_id: str, timeout_s: float) -> TurnOutcome:
        """Block on the events stream (no tight polling) until the turn is terminal; else TimeoutError.

        Each read blocks at most `block_cap_ms`, so a turn silent for longer (a long tool, a wait for
        approval) never trips the Redis client's socket timeout."""
        flow = flows.wait_outcome(turn_id, timeout_s, cap_ms=self.block_cap_ms, clock=time.monotonic)
        return await self._runner.run_flow(flow)

    async def request_cancel(self, turn_id: str) -> bool:
        """Ask the turn's owner to cancel it. False when already terminal; UnknownTurnError when unknown."""
        return await self._runner.run_flow(flows.send_control(turn_id, "cancel", None, None, codec.now_s()))

    async def request_approval(
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
        return await self._runner.run_flow(flow)

    async def request_client_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of a client-side tool with its result or an error (`flows.send_client_result`).
        False if terminal; UnknownTurnError if unknown."""
        flow = flows.send_client_result(turn_id, call_id, codec.now_s(), result=result, error=error)
        return await self._runner.run_flow(flow)

    async def read_agents(self) -> dict[str, AgentSpec]:
        """Every named agent (`workers.agents`), by name."""
        return await self._runner.run(get_agents())

    async def report_to_parent(self, parent: ParentLink, report: ChildReport) -> bool:
        """Tell a child turn's parent that it ended (`flows.send_child_result`); False when the parent ended
        already, or was told before (a second report after a takeover changes nothing)."""
        flow = flows.send_child_result(parent, report, codec.now_s())
        return await self._runner.run_flow(flow)

    async def read_control(self, turn_id: str, after: str = "0") -> list[ControlRequest]:
        """Cancel/approval requests after the stream id `after` (read them all on claim or take-over)."""
        return await self._runner.run(operations.read_control(turn_id, after))

    # --- tool outcomes and the orchestrator's inbox ------------------------------------------------------

    async def read_outcomes(self, calls: Mapping[str, str | None]) -> dict[str, ToolOutcome]:
        """The stored outcomes of these calls (wire id -> its turn id), those that have one, in one round
        trip."""
        if not calls:
            return {}
        return await self._runner.run(operations.read_outcomes(calls))

    async def write_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        """First writer wins: returns the outcome stored for the call — ours or an earlier one."""
        return await self._runner.run_flow(flows.write_outcome(outcome, self.retention))

    async def read_inbox(
        self, orchestrator_id: str, after: str, block_ms: int, count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """Notifications for this orchestrator after `after`: kind=outcome|started|control, turn, call, …

        Blocks up to `block_ms`, at most `block_cap_ms`: [] means nothing came yet, read again."""
        block = build_block_ms(block_ms, self.block_cap_ms)
        return await self._runner.run(operations.read_inbox(orchestrator_id, after, block, count))

    async def ack_inbox(self, orchestrator_id: str, up_to_id: str) -> None:
        """Trim the inbox up to and including `up_to_id` (notifications already handled)."""
        await self._runner.run(operations.ack_inbox(orchestrator_id, up_to_id))

    async def register_orchestrator(self, orchestrator_id: str) -> None:
        """Announce a live orchestrator (its heartbeat time in `keys.ORCHESTRATORS`)."""
        await self.heartbeat(orchestrator_id)

    async def heartbeat(self, orchestrator_id: str) -> None:
        """Record that the orchestrator is alive now."""
        await self._runner.run(operations.heartbeat(orchestrator_id, codec.now_s()))

    async def unregister(self, orchestrator_id: str) -> None:
        """Remove a stopping orchestrator and its inbox."""
        if keys.is_cluster_layout():
            await self._runner.run(cluster.unregister(orchestrator_id))
        else:
            await self._runner.run(operations.unregister(orchestrator_id))

    async def ping(self) -> bool:
        """True when Redis answers."""
        return await self._runner.run(operations.ping())
