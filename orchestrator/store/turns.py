"""The turn store: every Redis read and write of turns, leases, events, control requests and tool outcomes.

Async, on `redis.asyncio.Redis`; it works whether or not the client decodes responses (values are decoded
here). The layout and the atomic scripts are in `orchestrator/store_codec.py`, shared with the sync `Client`.

Guarantees:
- `submit` writes the request, status `queued`, the active-turn index and the queue entry in one script: the
  turn is in Redis (durable as far as Redis is configured to be) before it returns.
- A turn is owned by whoever sets its lease with SET NX (`claim`, `take_over`); `renew_leases` reports leases
  lost, `save_state(..., orchestrator_id=...)` refuses a writer that no longer owns the turn.
- `save_step` writes a step's state and the events it emitted in one script (one round trip), fenced like
  `save_state`: a refused step writes neither, so the events stream never tells of a step that was not kept.
- `save_outcome` is the first terminal write; it publishes `turn_finished` atomically with the outcome (the
  runtime never appends that event itself: `append_event` ignores it) and queues the conversation's next turn.
- Turns of one conversation run one at a time: a later turn is only queued when the previous one is terminal,
  so a claimer blocks on the queue and never polls.
- No blocking read (XREAD BLOCK, BLMOVE) here or in the sync `Client` blocks longer than `block_cap_ms` of its
  client, well under the client's socket timeout; whoever waits longer loops until its own deadline.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from orchestrator.errors import UnknownTurnError
from orchestrator.model import Message, TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import codec, turn_view
from orchestrator.store.codec import ControlRequest, TurnEvent
from orchestrator.store.turn_view import TurnView
from workers import keys
from workers.connect import connect_redis, connect_redis_async
from workers.contract import ToolOutcome

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
    "socket_timeout_s",
]

DEFAULT_LEASE_TTL_S = 15.0

# KEYS: state, status, lease, events. ARGV: state JSON, status, orchestrator id ('' = no fencing), events
# maxlen, then (name, at, data JSON) per event. Returns what SAVE_STATE_LUA returns: 1 written, 0 terminal,
# -1 another orchestrator holds the lease.
SAVE_STEP_LUA = (
    "local terminal = {"
    + ", ".join(f"['{s}'] = true" for s in codec.TERMINAL_STATUSES)
    + "}"
    + """
local st = redis.call('GET', KEYS[2])
if st and terminal[st] then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
for i = 5, #ARGV, 3 do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'name', ARGV[i], 'at', ARGV[i + 1],
             'data', ARGV[i + 2])
end
return 1
"""
)

# redis-py (8: `socket_timeout` defaults to 5 s) gives up on a reply that takes longer than the socket
# timeout, and a server-side block of the same length hits it exactly: a blocking read must end well before.
MAX_BLOCK_MS = 2000
_SOCKET_TIMEOUT_SHARE = 0.4
_ASSUMED_SOCKET_TIMEOUT_S = 5.0


def connect_sync(redis_url: str, ssl_cert_reqs: str = "required") -> redis.Redis:
    """The sync Redis client every sync reader uses (`Client`, direct calls): decoded replies, and for
    `rediss://` the explicit certificate policy (SPEC §8.1); redis-py's default socket timeout."""
    return connect_redis(redis_url, ssl_cert_reqs)


def connect_async(redis_url: str, ssl_cert_reqs: str = "required") -> aioredis.Redis:
    """`connect_sync` for asyncio: the client of `TurnStore.from_url` and async direct calls."""
    return connect_redis_async(redis_url, ssl_cert_reqs)


def socket_timeout_s(client: Any) -> float | None:
    """The read timeout redis-py applies on `client`'s connections (sync or asyncio); None: no timeout."""
    pool = client.connection_pool
    if "socket_timeout" in pool.connection_kwargs:
        value = pool.connection_kwargs["socket_timeout"]
    else:
        value = _default_socket_timeout(pool.connection_class)
    return None if value is None else float(value)


def _default_socket_timeout(connection_class: type) -> Any:
    # The connection class's own default, which is what an URL without `socket_timeout` gets.
    for cls in connection_class.__mro__:
        init = vars(cls).get("__init__")
        parameter = inspect.signature(init).parameters.get("socket_timeout") if init else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return _ASSUMED_SOCKET_TIMEOUT_S


def block_cap_ms(client: Any) -> int:
    """How long one blocking read on `client` may block: `MAX_BLOCK_MS`, less for a short socket timeout."""
    timeout = socket_timeout_s(client)
    if timeout is None or timeout <= 0:
        return MAX_BLOCK_MS
    return max(1, min(MAX_BLOCK_MS, int(timeout * 1000 * _SOCKET_TIMEOUT_SHARE)))


def build_block_ms(wanted_ms: float, cap_ms: int) -> int:
    """The BLOCK of one read: what the caller wants, capped, and at least 1 ms (BLOCK 0 waits forever)."""
    return max(1, min(cap_ms, int(wanted_ms)))


class Unread:
    """The type of `UNREAD`."""


# A value not read yet (as opposed to None, a value known to be absent).
UNREAD = Unread()


class TurnStore:
    """Async access to turns in Redis for the orchestrator runtime, the async client and the HTTP API."""

    def __init__(self, redis: aioredis.Redis, *, lease_ttl_s: float = DEFAULT_LEASE_TTL_S) -> None:
        self.redis = redis
        self.lease_ttl_s = lease_ttl_s
        self.block_cap_ms = block_cap_ms(redis)
        self._submit = redis.register_script(codec.SUBMIT_LUA)
        self._claim = redis.register_script(codec.CLAIM_LUA)
        self._take_over = redis.register_script(codec.TAKE_OVER_LUA)
        self._find_orphans = redis.register_script(codec.FIND_ORPHANS_LUA)
        self._renew = redis.register_script(codec.RENEW_LUA)
        self._release = redis.register_script(codec.RELEASE_LUA)
        self._save_state = redis.register_script(codec.SAVE_STATE_LUA)
        self._save_step = redis.register_script(SAVE_STEP_LUA)
        self._save_outcome = redis.register_script(codec.SAVE_OUTCOME_LUA)
        self._control = redis.register_script(codec.CONTROL_LUA)
        self._write_outcome = redis.register_script(keys.WRITE_OUTCOME_LUA)
        self._command: Callable[..., Awaitable[Any]] = redis.execute_command

    @classmethod
    def from_url(
        cls, redis_url: str, *, ssl_cert_reqs: str = "required", lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    ) -> TurnStore:
        """A store on a new connection pool for `redis_url` (close it with `aclose`)."""
        return cls(connect_async(redis_url, ssl_cert_reqs), lease_ttl_s=lease_ttl_s)

    async def aclose(self) -> None:
        """Close the underlying connection pool."""
        await self.redis.aclose()

    # --- submitting and claiming -------------------------------------------------------------------------

    async def submit(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Store a turn and queue it (or park it behind its conversation's running turn); returns its id.

        Submitting again with the same `turn_id` is a no-op that returns the id: a web app may retry safely.
        """
        codec.check_turn_request(request)
        tid = codec.validate_turn_id(turn_id) if turn_id else codec.new_turn_id()
        keys_, args = codec.build_submit_call(request, tid, codec.now_s())
        await self._submit(keys=keys_, args=args)
        return tid

    async def claim(
        self, orchestrator_id: str, *, timeout_s: float, lease_ttl_s: float | None = None
    ) -> str | None:
        """The next queued turn, leased to `orchestrator_id`; None when none came within `timeout_s`.

        Blocks on the queue (BLMOVE into the claiming list, so a claimer dying here leaves a trace that
        `find_orphans` reports), in steps of at most `block_cap_ms`; terminal or leased ids are skipped.
        """
        ttl_ms = str(int((lease_ttl_s or self.lease_ttl_s) * 1000))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            step_s = build_block_ms(remaining * 1000, self.block_cap_ms) / 1000
            # BLMOVE by hand: redis-py types the timeout as int, Redis takes fractional seconds.
            raw = await self._command(
                "BLMOVE", keys.TURN_QUEUE, keys.TURNS_CLAIMING, "LEFT", "RIGHT", f"{step_s:.3f}"
            )
            if raw is None:
                continue
            turn_id = codec.text(raw)
            keys_ = [keys.TURNS_CLAIMING, keys.turn_lease(turn_id), keys.turn_status(turn_id)]
            if await self._claim(keys=keys_, args=[turn_id, orchestrator_id, ttl_ms]):
                return turn_id

    async def renew_leases(self, orchestrator_id: str, turn_ids: Collection[str], ttl_s: float) -> set[str]:
        """Extend this orchestrator's leases; returns the ids whose lease it no longer holds (to drop)."""
        ids = list(turn_ids)
        if not ids:
            return set()
        lost = await self._renew(
            keys=[keys.turn_lease(t) for t in ids], args=[orchestrator_id, str(int(ttl_s * 1000))]
        )
        return {ids[int(i) - 1] for i in lost}

    async def release(self, orchestrator_id: str, turn_id: str) -> None:
        """Give up the lease on a turn (only if this orchestrator holds it)."""
        await self._release(keys=[keys.turn_lease(turn_id)], args=[orchestrator_id])

    async def lease_owner(self, turn_id: str) -> str | None:
        """The orchestrator id holding the turn's lease, or None."""
        raw = await self.redis.get(keys.turn_lease(turn_id))
        return None if raw is None else codec.text(raw)

    async def find_orphans(self, limit: int = 100) -> list[str]:
        """Non-terminal turns that nobody leases: running/waiting ones, and ids a dead claimer left behind."""
        found = await self._find_orphans(
            keys=[keys.TURNS_ACTIVE, keys.TURNS_CLAIMING], args=codec.build_orphan_args(limit)
        )
        return [codec.text(t) for t in found]

    async def take_over(self, orchestrator_id: str, turn_id: str, ttl_s: float) -> bool:
        """Lease an orphaned turn; False when it is terminal, still queued normally, or already leased."""
        keys_ = [keys.turn_lease(turn_id), keys.turn_status(turn_id), keys.TURNS_CLAIMING]
        return bool(
            await self._take_over(keys=keys_, args=[turn_id, orchestrator_id, str(int(ttl_s * 1000))])
        )

    # --- state -------------------------------------------------------------------------------------------

    async def load_request(self, turn_id: str, *, with_history: bool = False) -> TurnRequest | None:
        """The submitted request; `with_history` prefixes its messages with its conversation's history."""
        request = codec.parse_request(await self.redis.get(keys.turn_request(turn_id)))
        if request is None or not with_history or not request.conversation_id:
            return request
        history = await self.conversation_history(request.conversation_id)
        return request.model_copy(update={"messages": [*history, *request.messages]})

    async def load_state_and_request(self, turn_id: str) -> tuple[str | None, TurnRequest | None]:
        """`load_state` and `load_request` in one round trip (what adopting a turn reads)."""
        raw_state, raw_request = await self.redis.mget([keys.turn_state(turn_id), keys.turn_request(turn_id)])
        state = None if raw_state is None else codec.text(raw_state)
        return state, codec.parse_request(raw_request)

    async def load_state(self, turn_id: str) -> str | None:
        """The serialised machine state last saved, or None before the first save."""
        raw = await self.redis.get(keys.turn_state(turn_id))
        return None if raw is None else codec.text(raw)

    async def save_state(
        self, turn_id: str, state_json: str, status: TurnStatus, *, orchestrator_id: str | None = None
    ) -> bool:
        """Persist the state after a step. False when the turn is already terminal or, given
        `orchestrator_id`, when that orchestrator no longer holds the lease (it must drop the turn)."""
        keys_ = [keys.turn_state(turn_id), keys.turn_status(turn_id), keys.turn_lease(turn_id)]
        result = await self._save_state(keys=keys_, args=[state_json, status.value, orchestrator_id or ""])
        return int(result) == 1

    async def save_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        orchestrator_id: str | None = None,
    ) -> bool:
        """`save_state` and `append_event` of each `(name, data)` in `events`, atomically, in one round trip.

        False (and nothing written) when the turn is already terminal or, given `orchestrator_id`, when that
        orchestrator no longer holds the lease. `turn_finished` is skipped, as by `append_event`."""
        now = codec.now_s()
        args = [state_json, status.value, orchestrator_id or "", str(keys.EVENTS_MAXLEN)]
        for name, data in events:
            if name != codec.TURN_FINISHED:
                fields = codec.build_event_fields(name, data, now)
                args += [fields["name"], fields["at"], fields["data"]]
        keys_ = [
            keys.turn_state(turn_id),
            keys.turn_status(turn_id),
            keys.turn_lease(turn_id),
            keys.turn_events(turn_id),
        ]
        return int(await self._save_step(keys=keys_, args=args)) == 1

    async def save_outcome(
        self, turn_id: str, outcome: TurnOutcome, *, conversation_id: str | Unread | None = UNREAD
    ) -> bool:
        """The terminal write: outcome, status, `turn_finished` event, TTLs, conversation head and next turn.

        `conversation_id` is the turn's (None: it has none), when the caller knows it already; otherwise it
        is read from the request. Returns False when the turn was already terminal (the first terminal
        write wins).
        """
        if isinstance(conversation_id, Unread):
            request = await self.load_request(turn_id)
            conversation_id = request.conversation_id if request else None
        keys_, args = codec.build_save_outcome_call(turn_id, outcome, conversation_id, codec.now_s())
        return bool(await self._save_outcome(keys=keys_, args=args))

    async def get_status(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, or None for an unknown turn."""
        return codec.parse_status(await self.redis.get(keys.turn_status(turn_id)))

    async def get_outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome, or None while the turn runs (or when unknown)."""
        return codec.parse_outcome(await self.redis.get(keys.turn_outcome(turn_id)))

    async def get_view(self, turn_id: str) -> TurnView | None:
        """Status, request, transcript so far and outcome in one read; None for an unknown turn."""
        raw = await self.redis.mget(turn_view.view_keys(turn_id))
        return turn_view.build_turn_view(turn_id, *raw)

    async def conversation_history(self, conversation_id: str) -> list[Message]:
        """The whole history of the conversation's last finished turn ([] for a new conversation)."""
        head = await self.redis.get(keys.conversation_head(conversation_id))
        if head is None:
            return []
        outcome = await self.get_outcome(codec.text(head))
        return list(outcome.messages) if outcome else []

    # --- events and control ------------------------------------------------------------------------------

    async def append_event(self, turn_id: str, name: str, data: Mapping[str, Any]) -> str | None:
        """Publish one progress event (sensitive values redacted); returns its stream id.

        `turn_finished` is ignored here: `save_outcome` publishes it atomically with the outcome.
        """
        if name == codec.TURN_FINISHED:
            return None
        fields: dict[Any, Any] = codec.build_event_fields(name, data, codec.now_s())
        entry = await self.redis.xadd(
            keys.turn_events(turn_id), fields, maxlen=keys.EVENTS_MAXLEN, approximate=True
        )
        return codec.text(entry)

    async def read_events(
        self, turn_id: str, after: str = "0", block_ms: float | None = None, count: int | None = None
    ) -> list[TurnEvent]:
        """Events after the stream id `after`; with `block_ms`, waits up to that long (at most `block_cap_ms`)
        for the first one, and may return [] before anything came."""
        block = None if block_ms is None else build_block_ms(block_ms, self.block_cap_ms)
        reply = await self.redis.xread({keys.turn_events(turn_id): after}, count=count, block=block)
        return [codec.parse_event(turn_id, i, f) for i, f in codec.parse_stream_reply(reply)]

    async def last_event_id(self, turn_id: str) -> str:
        """The id of the newest event, or "0" when there is none."""
        newest = await self.redis.xrevrange(keys.turn_events(turn_id), count=1)
        return codec.text(newest[0][0]) if newest else "0"

    async def iter_events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[TurnEvent]:
        """Every event from `after` on, as they come, ending after `turn_finished` (UnknownTurnError).

        However long the turn stays silent: each read blocks at most `block_ms` (default and cap:
        `block_cap_ms`), then the turn's status is checked and the next read starts."""
        if await self.get_status(turn_id) is None:
            raise UnknownTurnError(turn_id)
        while True:
            # Checked before the read: the terminal status and `turn_finished` are written together, so a
            # turn that had ended already has all its events in the stream for this read to return.
            ended = (status := await self.get_status(turn_id)) is None or status.terminal
            block = None if ended else (block_ms or self.block_cap_ms)
            batch = await self.read_events(turn_id, after, block_ms=block)
            for event in batch:
                yield event
                if event.name == codec.TURN_FINISHED:
                    return
            if batch:
                after = batch[-1].id
            elif ended:
                return  # ended (or expired) and its turn_finished is not in the stream any more

    async def wait_outcome(self, turn_id: str, timeout_s: float) -> TurnOutcome:
        """Block on the events stream (no tight polling) until the turn is terminal; else TimeoutError.

        Each read blocks at most `block_cap_ms`, so a turn silent for longer (a long tool, a wait for
        approval) never trips the Redis client's socket timeout."""
        deadline = time.monotonic() + timeout_s
        after = await self.last_event_id(turn_id)
        while True:
            outcome = await self.get_outcome(turn_id)
            if outcome is not None:
                return outcome
            if await self.get_status(turn_id) is None:
                raise UnknownTurnError(turn_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"turn {turn_id} did not finish within {timeout_s:g} s")
            batch = await self.read_events(turn_id, after, block_ms=remaining * 1000)
            if batch:
                after = batch[-1].id

    async def request_cancel(self, turn_id: str) -> bool:
        """Ask the turn's owner to cancel it. False when already terminal; UnknownTurnError when unknown."""
        return await self._send_control(turn_id, "cancel", None, None)

    async def request_approval(self, turn_id: str, call_id: str, approved: bool) -> bool:
        """Approve or deny a call waiting for confirmation. False if terminal; UnknownTurnError if unknown."""
        if not call_id:
            raise ValueError("call_id must not be empty")
        return await self._send_control(turn_id, "approval", call_id, approved)

    async def _send_control(
        self, turn_id: str, kind: str, call_id: str | None, approved: bool | None
    ) -> bool:
        keys_, args = codec.build_control_call(turn_id, kind, call_id, approved, codec.now_s())
        result = int(await self._control(keys=keys_, args=args))
        if result < 0:
            raise UnknownTurnError(turn_id)
        return result == 1

    async def read_control(self, turn_id: str, after: str = "0") -> list[ControlRequest]:
        """Cancel/approval requests after the stream id `after` (read them all on claim or take-over)."""
        reply = await self.redis.xread({keys.turn_control(turn_id): after})
        return [codec.parse_control(i, f) for i, f in codec.parse_stream_reply(reply)]

    # --- tool outcomes and the orchestrator's inbox ------------------------------------------------------

    async def read_outcomes(self, call_ids: Sequence[str]) -> dict[str, ToolOutcome]:
        """The stored outcomes of these calls (those that have one), in one MGET."""
        if not call_ids:
            return {}
        raw = await self.redis.mget([keys.outcome(c) for c in call_ids])
        found = {c: codec.parse_tool_outcome(v) for c, v in zip(call_ids, raw, strict=True)}
        return {c: o for c, o in found.items() if o is not None}

    async def write_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        """First writer wins (SPEC §4.9): returns the outcome stored for the call — ours or an earlier one."""
        keys_, args = keys.build_write_outcome_call(
            outcome.call_id, outcome.turn_id, outcome.model_dump_json()
        )
        if await self._write_outcome(keys=keys_, args=args):
            return outcome
        winner = codec.parse_tool_outcome(await self.redis.get(keys.outcome(outcome.call_id)))
        return winner if winner is not None else outcome

    async def read_inbox(
        self, orchestrator_id: str, after: str, block_ms: int, count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """Notifications for this orchestrator after `after`: kind=outcome|started|control, turn, call, …

        Blocks up to `block_ms`, at most `block_cap_ms`: [] means nothing came yet, read again."""
        block = build_block_ms(block_ms, self.block_cap_ms)
        reply = await self.redis.xread({keys.inbox(orchestrator_id): after}, count=count, block=block)
        return [(i, codec.parse_fields(f)) for i, f in codec.parse_stream_reply(reply)]

    async def ack_inbox(self, orchestrator_id: str, up_to_id: str) -> None:
        """Trim the inbox up to and including `up_to_id` (notifications already handled)."""
        await self.redis.xtrim(keys.inbox(orchestrator_id), minid=codec.build_inbox_ack_id(up_to_id))

    async def register_orchestrator(self, orchestrator_id: str) -> None:
        """Announce a live orchestrator (its heartbeat time in `keys.ORCHESTRATORS`)."""
        await self.heartbeat(orchestrator_id)

    async def heartbeat(self, orchestrator_id: str) -> None:
        """Record that the orchestrator is alive now."""
        await self.redis.zadd(keys.ORCHESTRATORS, {orchestrator_id: codec.now_s()})

    async def unregister(self, orchestrator_id: str) -> None:
        """Remove a stopping orchestrator and its inbox."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(keys.ORCHESTRATORS, orchestrator_id)
            pipe.delete(keys.inbox(orchestrator_id))
            await pipe.execute()

    async def live_orchestrators(self, max_age_s: float) -> list[str]:
        """Orchestrators whose last heartbeat is at most `max_age_s` old."""
        ids = await self.redis.zrangebyscore(keys.ORCHESTRATORS, codec.now_s() - max_age_s, "+inf")
        return [codec.text(i) for i in ids]

    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self.redis.ping())
