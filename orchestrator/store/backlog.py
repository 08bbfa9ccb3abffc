"""The fleet's backlog as Redis holds it: tool queues, turns by tenant and priority, throttled model calls.

What an autoscaler and an operator scale on, read on demand by the one process that exports it (the HTTP
API's `/metrics`, `orchestrator.metrics.render_latest`), never by every replica of everything:

- a tool queue's length and the age of its oldest message. A tool queue (`ToolSpec.queue`, `tool.<name>`)
  is a Redis list of kombu's Redis transport when the broker is the state Redis (no `TOOLLOOP_BROKER_URL`):
  kombu LPUSHes and its consumers BRPOP, so the oldest message is the list's last; a message published with
  a priority goes to a list of its own, `<queue>\\x06\\x16<step>` (`build_queue_lists`; a call's lane is its
  priority: interactive calls go to the queue's own list, normal ones to step 3, batch ones to step 6). The
  oldest message's age is read from the call itself: the orchestrator stamps every `ToolCallRequest` with
  `dispatched_at` when it sends it (so does a direct call), and the request is the task's kwargs, in the
  message's body. One LINDEX per list, one message decoded per queue: no header of our own, nothing added
  to the publish path. A call handed back to wait for a concurrency slot keeps its `dispatched_at`, so its
  age counts from its first dispatch — how long the call has waited, which is what the gauge is for.
- turns queued (submitted, no orchestrator yet) and running (held by an orchestrator), by tenant and
  priority: the statuses of the active turns (`keys.TURNS_ACTIVE`, one MGET per 1,000), and each turn's
  tenant and priority from its request, read once per turn and remembered while it is active (a turn's
  tenant never changes). Labels stay bounded: a tenant not in `tenants` (the configured ones) is "other", a
  priority the request model does not define is "other".
- model calls waiting in a line of a `TOOLLOOP_MODEL_LIMITS` budget (`keys.model_budget_line`: each call
  told to wait has a place there until it comes back), one ZCOUNT per budget; calls held by a provider's
  pause wait in no line and are counted only by `toolloop_model_throttled_total`.

`BacklogReader.read` reads all of it in a handful of round trips and keeps the result for
`BACKLOG_MAX_AGE_S`, so that Prometheus scraping often, or several Prometheus servers, cost one read.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, get_args, get_origin

import redis.asyncio as aioredis
from kombu.transport.redis import Channel

from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.store.catalogue import get_tool_catalogue
from orchestrator.store.codec import text
from orchestrator.store.runner import AsyncRunner
from workers import keys
from workers.app import PRIORITY_STEPS
from workers.contract import DEFAULT_TENANT

# A scrape every 15 s reads Redis at most once per this; several scrapers (or API replicas behind one
# Service) within it share the read.
BACKLOG_MAX_AGE_S = 5.0
# The label of a tenant no setting names, and of a priority the request model does not define.
OTHER = "other"
# The priority of a turn whose request has none (the model defines no priorities, or predates them).
DEFAULT_PRIORITY = "normal"
# What a waiter in a budget's line may be late by before it lost its place (`rate_limit.lua`'s LATE_MS).
_LINE_LATE_S = 2.0
_MGET_CHUNK = 1000
_REQUEST_CHUNK = 100


def build_queue_lists(queue: str, priority_steps: Sequence[int] = PRIORITY_STEPS) -> tuple[str, ...]:
    """The Redis lists kombu's Redis transport keeps a queue's messages in: the queue's own name (priority
    0, and every message published without one) and one per other priority step of the Celery app's
    (`workers.app.PRIORITY_STEPS`). An autoscaler watching a queue watches each of them."""
    return (queue, *(f"{queue}{Channel.sep}{step}" for step in priority_steps if step))


def parse_dispatched_at(raw: bytes | str | None) -> float | None:
    """When the call in a kombu message on Redis was dispatched (its `ToolCallRequest.dispatched_at`); None
    for a message that is not a tool call or carries no time."""
    if raw is None:
        return None
    try:
        message = json.loads(raw)
        body: Any = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _, kwargs, _ = json.loads(body)
        dispatched_at = kwargs.get("dispatched_at")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return float(dispatched_at) if isinstance(dispatched_at, int | float) else None


def build_priorities() -> tuple[str, ...]:
    """The priorities a turn may have, as labels: the values of the request model's `priority` field when it
    has one of a closed set (a `Literal` or an `Enum`), else just `DEFAULT_PRIORITY`."""
    found = TurnRequest.model_fields.get("priority")
    if found is None:
        return (DEFAULT_PRIORITY,)
    annotation: Any = found.annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return tuple(str(member.value) for member in annotation)
    if get_origin(annotation) is Literal:
        return tuple(str(value) for value in get_args(annotation))
    return (DEFAULT_PRIORITY,)


def build_turn_labels(
    raw_request: bytes | str | None, tenants: frozenset[str], priorities: Sequence[str]
) -> tuple[str, str]:
    """(tenant, priority) labels of a stored request: bounded by `tenants` and `priorities` ("other")."""
    request: Any = {}
    if raw_request is not None:
        try:
            request = json.loads(raw_request)
        except ValueError:
            request = {}
    if not isinstance(request, dict):
        request = {}
    tenant = request.get("tenant") or DEFAULT_TENANT
    priority = request.get("priority")
    priority = DEFAULT_PRIORITY if priority is None else str(getattr(priority, "value", priority))
    return (
        tenant if tenant in tenants else OTHER,
        priority if priority in priorities else OTHER,
    )


@dataclass(frozen=True)
class ToolQueue:
    """One tool queue's backlog: messages waiting in it, and how long its oldest has (0 when empty)."""

    queue: str
    length: int
    oldest_age_s: float


@dataclass(frozen=True)
class TurnCount:
    """Turns of one tenant and priority: queued (no orchestrator yet) and running (held by one)."""

    queued: int = 0
    running: int = 0


@dataclass(frozen=True)
class Backlog:
    """What `BacklogReader.read` found: tool queues by name (none when the broker is not the state Redis),
    turn counts by (tenant, priority) — every configured pair, 0 included — and model calls waiting in a
    line by `TOOLLOOP_MODEL_LIMITS` entry."""

    read_at: float
    tool_queues: dict[str, ToolQueue] = field(default_factory=dict)
    turns: dict[tuple[str, str], TurnCount] = field(default_factory=dict)
    model_calls_waiting: dict[str, int] = field(default_factory=dict)


def build_tool_queues(
    queues: Iterable[str], replies: Sequence[Any], now: float, priority_steps: Sequence[int] = PRIORITY_STEPS
) -> dict[str, ToolQueue]:
    """Each queue's `ToolQueue` from the replies of `LLEN list`, `LINDEX list -1` for each of its lists in
    order (`build_queue_lists`)."""
    found: dict[str, ToolQueue] = {}
    position = 0
    for queue in sorted(set(queues)):
        length, oldest = 0, None
        for _ in build_queue_lists(queue, priority_steps):
            length += int(replies[position] or 0)
            dispatched_at = parse_dispatched_at(replies[position + 1])
            if dispatched_at is not None:
                oldest = dispatched_at if oldest is None else min(oldest, dispatched_at)
            position += 2
        age_s = max(now - oldest, 0.0) if oldest is not None and length else 0.0
        found[queue] = ToolQueue(queue, length, age_s)
    return found


def count_turns(
    statuses: Mapping[str, TurnStatus | None],
    labels: Mapping[str, tuple[str, str]],
    tenants: Iterable[str],
    priorities: Sequence[str],
) -> dict[tuple[str, str], TurnCount]:
    """Queued and running turns by (tenant, priority): every pair of a configured tenant or "other" and a
    priority present, 0 or not (a dashboard's series never vanish)."""
    queued: dict[tuple[str, str], int] = {}
    running: dict[tuple[str, str], int] = {}
    for turn_id, status in statuses.items():
        label = labels.get(turn_id, (OTHER, OTHER))
        if status is TurnStatus.QUEUED:
            queued[label] = queued.get(label, 0) + 1
        elif status is TurnStatus.RUNNING:
            running[label] = running.get(label, 0) + 1
    pairs = {(tenant, priority) for tenant in (*tenants, OTHER) for priority in priorities}
    pairs |= set(queued) | set(running)
    return {pair: TurnCount(queued.get(pair, 0), running.get(pair, 0)) for pair in sorted(pairs)}


def _parse_status(raw: Any) -> TurnStatus | None:
    try:
        return TurnStatus(text(raw)) if raw is not None else None
    except ValueError:  # a status a newer release added
        return None


class BacklogReader:
    """Reads the backlog (`Backlog`) for one process, at most once per `max_age_s`.

    `tenants`: the configured tenants (the API's keys, "default"); `model_limit_keys`: the entries of
    `TOOLLOOP_MODEL_LIMITS`; `tool_queues`: False when the broker is not the state Redis (its queues are not
    Redis lists of this Redis). Concurrent reads wait for one."""

    def __init__(
        self,
        tenants: Iterable[str],
        model_limit_keys: Iterable[str] = (),
        *,
        tool_queues: bool = True,
        max_age_s: float = BACKLOG_MAX_AGE_S,
    ) -> None:
        self.tenants = frozenset({DEFAULT_TENANT, *tenants})
        self.model_limit_keys = tuple(sorted(model_limit_keys))
        self.priorities = build_priorities()
        self._tool_queues = tool_queues
        self._max_age_s = max_age_s
        self._last: Backlog | None = None
        # Labels of the active turns read so far: forgotten once a turn is no longer active.
        self._labels: dict[str, tuple[str, str]] = {}
        self._lock = asyncio.Lock()

    async def read(self, client: aioredis.Redis, now: float | None = None) -> Backlog:
        """The backlog, read from Redis unless the last read is younger than `max_age_s`. Raises the Redis
        client's errors."""
        async with self._lock:
            now = time.time() if now is None else now
            if self._last is not None and 0 <= now - self._last.read_at < self._max_age_s:
                return self._last
            tool_queues = await self._read_tool_queues(client, now) if self._tool_queues else {}
            turns = await self._read_turns(client)
            waiting = await self._read_model_lines(client, now)
            self._last = Backlog(now, tool_queues, turns, waiting)
            return self._last

    async def _read_tool_queues(self, client: aioredis.Redis, now: float) -> dict[str, ToolQueue]:
        catalogue = await AsyncRunner(client).run(get_tool_catalogue(now))
        queues = {spec.queue for spec in catalogue.live.values()}
        queues |= {spec.queue for _, spec in catalogue.served.values()}
        pipe = client.pipeline(transaction=False)
        for queue in sorted(queues):
            for name in build_queue_lists(queue):
                pipe.llen(name)
                pipe.lindex(name, -1)
        replies = await pipe.execute() if queues else []
        return build_tool_queues(queues, replies, now)

    async def _read_turns(self, client: aioredis.Redis) -> dict[tuple[str, str], TurnCount]:
        names = [shard.active for shard in keys.all_queue_shards()]
        ids = [text(turn_id) for reply in await _range_many(client, names) for turn_id in reply]
        statuses: dict[str, TurnStatus | None] = {}
        for start in range(0, len(ids), _MGET_CHUNK):
            chunk = ids[start : start + _MGET_CHUNK]
            replies = await _get_many(client, [keys.turn_status(turn_id) for turn_id in chunk])
            statuses.update(zip(chunk, map(_parse_status, replies), strict=True))
        counted = {TurnStatus.QUEUED, TurnStatus.RUNNING}
        unknown = [turn_id for turn_id, s in statuses.items() if s in counted and turn_id not in self._labels]
        for start in range(0, len(unknown), _REQUEST_CHUNK):
            chunk = unknown[start : start + _REQUEST_CHUNK]
            requests = await _get_many(client, [keys.turn_request(turn_id) for turn_id in chunk])
            for turn_id, raw in zip(chunk, requests, strict=True):
                self._labels[turn_id] = build_turn_labels(raw, self.tenants, self.priorities)
        self._labels = {turn_id: label for turn_id, label in self._labels.items() if turn_id in statuses}
        return count_turns(statuses, self._labels, self.tenants, self.priorities)

    async def _read_model_lines(self, client: aioredis.Redis, now: float) -> dict[str, int]:
        if not self.model_limit_keys:
            return {}
        since_ms = int((now - _LINE_LATE_S) * 1000)
        pipe = client.pipeline(transaction=False)
        for key in self.model_limit_keys:
            pipe.zcount(keys.model_budget_line(key), since_ms, "+inf")
        replies = await pipe.execute()
        return {key: int(count) for key, count in zip(self.model_limit_keys, replies, strict=True)}


async def _range_many(client: aioredis.Redis, names: list[str]) -> list[Any]:
    # Each sorted set's members: one ZRANGE on one Redis; a pipeline of them over a cluster's shards.
    if len(names) == 1:
        return [await client.zrange(names[0], 0, -1)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.zrange(name, 0, -1)
    return list(await pipe.execute())


async def _get_many(client: aioredis.Redis, names: list[str]) -> list[Any]:
    # One MGET; on a Redis Cluster, where each turn's keys are in a slot of their own, a pipeline of GETs.
    if not keys.is_cluster_layout():
        return list(await client.mget(names))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return list(await pipe.execute())
