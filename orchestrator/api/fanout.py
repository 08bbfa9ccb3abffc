"""The API's one reader of turns' events: every open SSE stream follows its turn through it (issue 12).

One task XREADs the event streams of every followed turn in one blocking call, on a connection of its own,
and hands each event to the subscriptions of its turn: N open streams cost one Redis connection, not N.

- A subscription has a cursor (the id of the last event handed to it) and a bounded queue. The reader reads
  each turn from the oldest cursor of its subscriptions and hands an event only to those whose cursor is
  older than the event and no older than where that read started: no subscription gets an event twice or
  skips one.
- A subscription whose queue is full (a client reading slower than its turn writes) is detached, never
  waited for, so one slow client cannot hold up the others or grow the process's memory: its follower
  (`api_sse.follow_turn`) drains what the queue holds, catches up from its own cursor with paged reads and
  subscribes again.
- A Redis error stops nobody: the reader waits with capped, jittered backoff (`workers.redis_errors.Backoff`)
  and reads again from the cursors, so the
  subscriptions see a pause, never a gap or a repeat. `outage` says why it is waiting, for keep-alives.
- A new subscription joins the next read at once: when the read under way does not cover it, subscribing
  adds an entry to the reader's own wake stream (`keys.api_wake`, part of every read), which ends that read;
  the next covers the new turn, so a stream that opens right after its turn was submitted sees the first
  text delta as soon as it is written. Without a waker (or when the wake cannot be written) the read under way
  ends within `READ_BLOCK_MS`.
- On a Redis Cluster one XREAD cannot span slots, and every turn's stream is in a slot of its own: each
  followed turn then has a reader task of its own (blocking on its stream alone, on a connection of its node),
  started by its first subscription and stopped with its last; the cursors and hand-out are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.typing import KeyT, StreamIdT

from orchestrator import metrics
from orchestrator.store import codec
from orchestrator.store.codec import StreamId, TurnEvent, parse_stream_id
from orchestrator.store.connection import block_cap_ms
from workers import keys
from workers.redis_errors import REDIS_ERRORS, Backoff

log = logging.getLogger("toolloop.api")

# The longest one shared read blocks, so a stream that subscribes meanwhile joins within it.
READ_BLOCK_MS = 250
# Entries read per turn per read: a turn with a longer backlog continues at the next read.
READ_COUNT = 100


@dataclass(eq=False)
class Subscription:
    """One stream's place in the fan-out: the events handed to it wait in `queue` for its follower."""

    turn_id: str
    cursor: StreamId
    queue: asyncio.Queue[TurnEvent]
    # Set when its queue was full: nothing more is handed to it; its follower catches up by itself.
    detached: bool = False
    # Set once `turn_finished` was handed to it: its stream ends there.
    finished: bool = False


@dataclass
class _Read:
    """One shared read: for each turn read, the cursor it was read from."""

    starts: dict[str, StreamId] = field(default_factory=dict)

    def build_streams(self) -> dict[KeyT, StreamIdT]:
        """XREAD's streams: each turn's events key and the id it is read after."""
        return {keys.turn_events(t): f"{ms}-{seq}" for t, (ms, seq) in self.starts.items()}


def parse_xread_groups(reply: Any) -> list[tuple[str, Sequence[tuple[Any, Mapping[Any, Any]]]]]:
    """An XREAD reply of several streams as (stream key, entries) pairs: RESP2's `[[key, entries], …]`
    or RESP3's `{key: [entries]}`; [] for nothing read."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else ((group[0], group[1]) for group in reply)
    return [(codec.text(key), entries) for key, entries in pairs]


class EventFanout:
    """The reader task and the subscriptions it serves; `start()` it, `aclose()` it (closing `redis`)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        buffer_events: int,
        block_ms: int = READ_BLOCK_MS,
        waker: aioredis.Redis | None = None,
    ) -> None:
        self._redis = redis
        # Another connection (the reader's own blocks), which writes the wake entries; None: no waking.
        self._waker = waker
        self._wake_key = keys.api_wake(uuid.uuid4().hex)
        self._wake_cursor = "0-0"
        self._current: _Read | None = None
        self._wakes: set[asyncio.Task[None]] = set()
        self.buffer_events = buffer_events
        # Under the client's socket timeout, as every blocking read (store.connection).
        self.block_ms = max(1, min(block_ms, block_cap_ms(redis)))
        self._subscriptions: dict[str, set[Subscription]] = {}
        # On a Redis Cluster: the reader task of each followed turn.
        self._per_turn = keys.is_cluster_layout()
        self._turn_readers: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The first pause short: a reader is what every open stream waits on.
        self._backoff = Backoff(first_s=0.05)
        # Why the reader is waiting for Redis (None: it is not).
        self.outage: str | None = None
        # Subscriptions detached so far for a full queue (slow clients).
        self.detached_total = 0

    @property
    def following(self) -> int:
        """How many subscriptions the reader serves now."""
        return sum(len(subs) for subs in self._subscriptions.values())

    def start(self) -> None:
        """Start the reader task (on the running event loop)."""
        if self._task is None and not self._per_turn:
            self._task = asyncio.create_task(self._run(), name="toolloop-api-events")

    async def aclose(self) -> None:
        """Stop the reader and close its connection; never waits on Redis."""
        readers = list(self._turn_readers.values())
        self._turn_readers.clear()
        for reader in readers:
            reader.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(*REDIS_ERRORS):
            await self._redis.aclose()

    def subscribe(self, turn_id: str, after: str) -> Subscription:
        """Follow `turn_id` from the event after `after`: its events come into the subscription's queue."""
        subscription = Subscription(turn_id, parse_stream_id(after), asyncio.Queue(self.buffer_events))
        self._subscriptions.setdefault(turn_id, set()).add(subscription)
        if self._per_turn:
            if turn_id not in self._turn_readers:
                reader = asyncio.create_task(self._run_turn(turn_id), name=f"toolloop-api-events-{turn_id}")
                self._turn_readers[turn_id] = reader
            return subscription
        self._changed.set()
        current = self._current
        start = current.starts.get(turn_id) if current is not None else None
        if current is not None and (start is None or subscription.cursor < start):
            self._wake()
        return subscription

    def _wake(self) -> None:
        # Ends the blocking read under way, so that the next one covers the new subscription.
        if self._waker is None:
            return
        task = asyncio.create_task(self._write_wake())
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _write_wake(self) -> None:
        assert self._waker is not None
        try:
            pipe = self._waker.pipeline(transaction=False)
            pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1, approximate=False)
            pipe.expire(self._wake_key, keys.API_WAKE_TTL_S)
            await pipe.execute()
        except REDIS_ERRORS:
            pass  # the read under way ends within its block anyway

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop handing events to `subscription` (its stream ended or its client left)."""
        subs = self._subscriptions.get(subscription.turn_id)
        if subs is not None:
            subs.discard(subscription)
            if not subs:
                del self._subscriptions[subscription.turn_id]
                reader = self._turn_readers.pop(subscription.turn_id, None)
                if reader is not None and reader is not asyncio.current_task():
                    reader.cancel()

    async def _run(self) -> None:
        while True:
            if not self._subscriptions:
                self._changed.clear()
                await self._changed.wait()
                continue
            read = _Read({t: min(s.cursor for s in subs) for t, subs in self._subscriptions.items()})
            streams = read.build_streams()
            if self._waker is not None:
                streams[self._wake_key] = self._wake_cursor
            self._current = read
            try:
                reply = await self._redis.xread(streams, count=READ_COUNT, block=self.block_ms)
            except REDIS_ERRORS as exc:
                self._failed(exc)
                await asyncio.sleep(self._backoff.next_s())
                continue
            finally:
                self._current = None
            groups = parse_xread_groups(reply)
            for key, entries in groups:
                if key == self._wake_key and entries:
                    self._wake_cursor = codec.text(entries[-1][0])
            groups = [(key, entries) for key, entries in groups if key != self._wake_key]
            self._succeeded()
            try:
                self._hand_out(read, groups)
            except Exception:
                # A bug here must not end every stream of the process: say it loudly and read again.
                log.exception("events reader: could not hand out what it read")
                await asyncio.sleep(self._backoff.next_s())

    async def _run_turn(self, turn_id: str) -> None:
        # One turn's reader on a Redis Cluster: as `_run`, for its stream alone, until its last subscription
        # goes (its end handed out, or its clients gone).
        key = keys.turn_events(turn_id)
        backoff = Backoff(first_s=0.05)
        try:
            while subs := self._subscriptions.get(turn_id):
                read = _Read({turn_id: min(s.cursor for s in subs)})
                try:
                    reply = await self._redis.xread(
                        read.build_streams(), count=READ_COUNT, block=self.block_ms
                    )
                except REDIS_ERRORS as exc:
                    self._failed(exc)
                    await asyncio.sleep(backoff.next_s())
                    continue
                backoff.reset()
                self._succeeded()
                try:
                    self._hand_out(read, [(k, e) for k, e in parse_xread_groups(reply) if k == key])
                except Exception:
                    log.exception("events reader of %s: could not hand out what it read", turn_id)
                    await asyncio.sleep(backoff.next_s())
        finally:
            if self._turn_readers.get(turn_id) is asyncio.current_task():
                del self._turn_readers[turn_id]

    def _hand_out(
        self, read: _Read, groups: list[tuple[str, Sequence[tuple[Any, Mapping[Any, Any]]]]]
    ) -> None:
        turn_of_key = {keys.turn_events(t): t for t in read.starts}
        for key, entries in groups:
            turn_id = turn_of_key[key]
            events = codec.parse_entries(turn_id, entries)
            start = read.starts[turn_id]
            for subscription in list(self._subscriptions.get(turn_id, ())):
                # One that subscribed during the read from further back would miss what lies between.
                if subscription.cursor >= start:
                    self._give(subscription, events)

    def _give(self, subscription: Subscription, events: list[TurnEvent]) -> None:
        for event in events:
            event_id = parse_stream_id(event.id)
            if event_id <= subscription.cursor:
                continue
            try:
                subscription.queue.put_nowait(event)
            except asyncio.QueueFull:
                subscription.detached = True
                self.detached_total += 1
                self.unsubscribe(subscription)
                return
            subscription.cursor = event_id
            if event.name == codec.TURN_FINISHED:
                subscription.finished = True
                self.unsubscribe(subscription)
                return

    def _failed(self, exc: BaseException) -> None:
        metrics.record_redis_error("api_events", exc)
        if self.outage is None:
            log.warning("events reader: Redis failed (%s); SSE streams wait and resume", exc)
        self.outage = f"{type(exc).__name__}: {exc}"

    def _succeeded(self) -> None:
        if self.outage is not None:
            log.info("events reader: Redis answers again; SSE streams resume")
            self.outage = None
        self._backoff.reset()
