"""The recent turns, newest first, as `GET /v1/turns` and the `/ui` page list them (issue 14).

`submit.lua` adds every turn to `keys.TURNS_RECENT` (scored by its submit time, trimmed to the newest
`keys.RECENT_TURNS_MAX`). A listing reads, for the listed turns in one transaction (`read_turns`), each
one's status, its request and its events, and summarises them (`advance`, pure): the status from the status
key, the model from `turn_started` (what a tier or the default resolved to) or else the request, the times
from the `turn_queued`, `turn_started` and `turn_finished` events, and the tools used, counted from the
calls' outcomes (`tool_finished`, `tool_synthesized`). An id whose turn has expired (no status key) is
skipped and removed from the index by the same listing (`forget`).

A turn's stream is mostly text deltas, and parsing stream entries is what a listing costs, so a process
keeps what it has read (`RecentCache`): the next listing reads only the events added since, at most
`EVENTS_PER_READ` of them per turn (a longer stream is caught up over the next listings), and a finished
turn's summary costs one GET of its status.

A listing may keep only the turns a `TurnFilter` matches: one tenant's (from the request: a request stored
before tenants is "default"), one status, one model (the summary's: what `turn_started` resolved, else the
request's); it then reads on through the index, page by page, until it has `limit` of them or the index ends.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from orchestrator.model import TurnStatus
from orchestrator.store import codec
from orchestrator.store.effects import Batch, Flow, RedisCommand, Transaction, parse_reply
from orchestrator.store.runner import AsyncRunner
from workers import keys
from workers.contract import DEFAULT_TENANT

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# Events read per turn by one listing.
EVENTS_PER_READ = 1000
# The events a summary reads (only their data is parsed: a turn's text deltas are most of its stream).
_SUMMARY_EVENTS = frozenset(
    {"turn_queued", "turn_started", "tool_finished", "tool_synthesized", "turn_finished"}
)
_TOOL_OUTCOMES = frozenset({"tool_finished", "tool_synthesized"})
# Where a turn's events are read from when none were read yet.
_START = "-"


class RecentTurn(BaseModel):
    """One turn as the listing shows it. Times are epoch seconds; `duration_s` is from submit to finish (what
    its user waited), None until it finishes; `tools` counts the calls that have their outcome, per tool."""

    turn_id: str
    status: TurnStatus
    tenant: str = DEFAULT_TENANT
    model: str | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float | None = None
    stop_reason: str | None = None
    tools: dict[str, int] = Field(default_factory=dict)


@dataclass(frozen=True)
class TurnFilter:
    """Which turns a listing keeps: each field None for any."""

    tenant: str | None = None
    status: TurnStatus | None = None
    model: str | None = None

    @property
    def empty(self) -> bool:
        """True when it keeps every turn."""
        return self.tenant is None and self.status is None and self.model is None

    def matches(self, turn: RecentTurn) -> bool:
        """True when `turn` is one the listing keeps."""
        return (
            (self.tenant is None or turn.tenant == self.tenant)
            and (self.status is None or turn.status == self.status)
            and (self.model is None or turn.model == self.model)
        )


@dataclass(frozen=True)
class Read:
    """What a listing has read of one turn: its summary so far and the id of the last event read."""

    turn: RecentTurn
    cursor: str


class RecentCache:
    """The turns a process's listings have read, the `max_turns` most recently listed (a finished turn's
    events never change, a running turn's only grow, so a listing goes on from where the last one stopped)."""

    def __init__(self, max_turns: int = 2 * keys.RECENT_TURNS_MAX) -> None:
        self.max_turns = max_turns
        self._reads: OrderedDict[str, Read] = OrderedDict()

    def get(self, turn_id: str) -> Read | None:
        """What was read of the turn, if anything."""
        return self._reads.get(turn_id)

    def put(self, turn_id: str, read: Read, *, after: Read | None) -> None:
        """Keep `read`, made from `after`, unless another listing meanwhile kept a read made from it."""
        if self._reads.get(turn_id) is not after:
            return
        self._reads[turn_id] = read
        self._reads.move_to_end(turn_id)
        while len(self._reads) > self.max_turns:
            self._reads.popitem(last=False)

    def drop(self, turn_id: str) -> None:
        """Forget an expired turn."""
        self._reads.pop(turn_id, None)


def read_recent_ids(
    start: int, count: int
) -> RedisCommand[list[tuple[str, float]]] | Batch[list[tuple[str, float]]]:
    """`count` ids of the index from rank `start`, newest first, with their submit times (on a Redis Cluster,
    where each shard of the turn queue keeps its own index, the shards' first `start + count` merged)."""

    def parse(reply: Any) -> list[tuple[str, float]]:
        return [(codec.text(member), float(score)) for member, score in reply]

    if not keys.is_cluster_layout():
        return RedisCommand(("ZREVRANGE", keys.TURNS_RECENT, start, start + count - 1, "WITHSCORES"), parse)

    def merge(pages: list[list[tuple[str, float]]]) -> list[tuple[str, float]]:
        merged = sorted((entry for page in pages for entry in page), key=lambda e: (-e[1], e[0]))
        return merged[start : start + count]

    reads = tuple(
        RedisCommand(("ZREVRANGE", shard.recent, 0, start + count - 1, "WITHSCORES"), parse)
        for shard in keys.all_queue_shards()
    )
    return Batch(reads, merge)


def read_turns(
    cursors: Sequence[tuple[str, str]],
) -> Transaction[list[tuple[Any, Any, Any]]] | Batch[list[tuple[Any, Any, Any]]]:
    """For each (turn id, cursor): its status, its request (only when nothing was read of it yet, cursor "-")
    and up to `EVENTS_PER_READ` of its events after the cursor, in one round trip (on a Redis Cluster, where
    each turn is in a slot of its own, a pipeline: each turn read at its own moment)."""
    commands: list[tuple[str | int | float, ...]] = []
    for turn_id, cursor in cursors:
        commands.append(("GET", keys.turn_status(turn_id)))
        if cursor == _START:
            commands.append(("GET", keys.turn_request(turn_id)))
        after = cursor if cursor == _START else f"({cursor}"
        commands.append(("XRANGE", keys.turn_events(turn_id), after, "+", "COUNT", EVENTS_PER_READ))

    def parse(replies: list[Any]) -> list[tuple[Any, Any, Any]]:
        found, index = [], 0
        for _turn_id, cursor in cursors:
            if cursor == _START:
                found.append((replies[index], replies[index + 1], replies[index + 2]))
                index += 3
            else:
                found.append((replies[index], None, replies[index + 1]))
                index += 2
        return found

    if keys.is_cluster_layout():
        return Batch(tuple(RedisCommand(words, parse_reply) for words in commands), parse)
    return Transaction(tuple(commands), parse)


def forget(turn_ids: Sequence[str]) -> RedisCommand[Any] | Batch[Any]:
    """Remove these ids (turns that have expired) from the index (from every shard's, on a cluster)."""
    if not keys.is_cluster_layout():
        return RedisCommand(("ZREM", keys.TURNS_RECENT, *turn_ids), parse_reply)
    removals = tuple(
        RedisCommand(("ZREM", shard.recent, *turn_ids), parse_reply) for shard in keys.all_queue_shards()
    )
    return Batch(removals, parse_reply)


def _events(turn_id: str, entry_id: Any, fields: Mapping[Any, Any]) -> list[codec.TurnEvent]:
    # An entry this release cannot read is passed over: a listing never fails on one turn's events.
    try:
        return codec.parse_entry(turn_id, entry_id, fields)
    except ValueError:
        return []


def _start(turn_id: str, submitted_at: float, status: TurnStatus, request_raw: Any) -> RecentTurn:
    request = codec.parse_request(request_raw)
    if request is None:
        return RecentTurn(turn_id=turn_id, status=status, submitted_at=submitted_at)
    # A fallback list is listed by the model tried first, until `turn_started` names the one resolved.
    model = request.model[0] if isinstance(request.model, list) else request.model
    return RecentTurn(
        turn_id=turn_id, status=status, submitted_at=submitted_at, model=model, tenant=request.tenant
    )


def _apply(turn: RecentTurn, tools: Counter[str], event: codec.TurnEvent) -> None:
    # One summary event: its time, and what its data says.
    name, at, data = event.name, event.at, event.data
    if name == "turn_queued":
        turn.submitted_at = at
    elif name == "turn_started":
        turn.started_at = turn.started_at or at
        turn.model = str(data.get("model") or "") or turn.model
    elif name in _TOOL_OUTCOMES:
        tools[str(data.get("tool", "?"))] += 1
    else:
        turn.finished_at, turn.stop_reason = at, data.get("stop_reason")


def advance(previous: Read | None, listed: tuple[str, float], reply: tuple[Any, Any, Any]) -> Read | None:
    """The summary of the listed turn (id, submit time): `previous` (None: nothing read yet) and the
    (status, request, events) `read_turns` read after it; None when the turn has expired."""
    (turn_id, submitted_at), (status_raw, request_raw, entries) = listed, reply
    status = codec.parse_status(status_raw)
    if status is None:
        return None
    base = previous.turn if previous else _start(turn_id, submitted_at, status, request_raw)
    turn = base.model_copy(update={"status": status, "tools": dict(base.tools)})
    cursor = previous.cursor if previous else _START
    tools: Counter[str] = Counter(turn.tools)
    for entry_id, raw_fields in entries or []:
        cursor = codec.text(entry_id)
        for event in _events(turn_id, entry_id, raw_fields):
            if event.name in _SUMMARY_EVENTS:
                _apply(turn, tools, event)
    if turn.finished_at is not None and turn.submitted_at is not None:
        turn.duration_s = round(turn.finished_at - turn.submitted_at, 3)
    turn.tools = dict(sorted(tools.items()))
    return Read(turn, cursor)


def list_recent(
    limit: int = DEFAULT_LIMIT,
    cache: RecentCache | None = None,
    tenant: str | None = None,
    *,
    status: TurnStatus | None = None,
    model: str | None = None,
) -> Flow[list[RecentTurn]]:
    """Up to `limit` recent turns, newest first, of `tenant`, with `status`, of `model`, each only when
    given (`TurnFilter`); expired ones are skipped and removed from the index.

    With `cache`, only what was added since the listings that filled it is read."""
    cache = cache or RecentCache()
    kept = TurnFilter(tenant, status, model)
    found: dict[str, RecentTurn] = {}
    start = 0
    while len(found) < limit:
        # A filtered listing reads whole pages: the turns it does not keep in between are passed over.
        wanted = limit - len(found) if kept.empty else limit
        page: list[tuple[str, float]] = yield read_recent_ids(start, wanted)
        if not page:
            break
        start += len(page)
        before = [cache.get(turn_id) for turn_id, _ in page]
        cursors = [
            (turn_id, read.cursor if read else _START)
            for (turn_id, _), read in zip(page, before, strict=True)
        ]
        replies: list[tuple[Any, Any, Any]] = yield read_turns(cursors)
        expired: list[str] = []
        for listed, previous, reply in zip(page, before, replies, strict=True):
            turn_id = listed[0]
            read = advance(previous, listed, reply)
            if read is None:
                expired.append(turn_id)
                cache.drop(turn_id)
                continue
            cache.put(turn_id, read, after=previous)
            # setdefault: a turn submitted meanwhile shifts the ranks, so a page may repeat an id.
            if kept.matches(read.turn) and len(found) < limit:
                found.setdefault(turn_id, read.turn)
        if expired:
            yield forget(expired)
            start -= len(expired)  # the ranks after them moved up
    return list(found.values())


async def alist_recent(
    client: aioredis.Redis,
    limit: int = DEFAULT_LIMIT,
    cache: RecentCache | None = None,
    tenant: str | None = None,
    *,
    status: TurnStatus | None = None,
    model: str | None = None,
) -> list[RecentTurn]:
    """`list_recent` on an asyncio client."""
    return await AsyncRunner(client).run_flow(list_recent(limit, cache, tenant, status=status, model=model))
