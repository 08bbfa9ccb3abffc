"""The worker's broker connection: kombu's Redis channels, made to ride out a Redis restart, calls running.

Why (kombu #582, #970; celery #10205). When Redis goes away under a worker whose tool calls are running,
Celery's consumer gives up its connection in two steps: `Connection.collect()`, then `Connection.close()`.
`collect` closes the channels best effort — the consumer's channel was waiting on BRPOP, so its `close` reads
the dead socket first and raises before it marks itself closed — and then detaches the transport from its
connection (`transport.client = None`). `close` then closes that channel again: it drops its connection pools
and restores its unacked messages (the calls running here, and those received but not started) through a
fresh pool, whose parameters kombu reads from `transport.client`: None, so `AttributeError`, which is no
connection error, escapes Celery's cleanup — "Unrecoverable error", and the worker exits once its running
calls are over. The ack of a call that ends after that fails the same way (the closed channel has no
transport at all), in the event loop.

What changes (`RestartSafeChannel`, `RestartSafeQoS`; Celery's consumer puts them on its connection,
`RestartSafeConsumer`, the `worker_consumer` setting):
- a channel keeps what it needs to open a connection pool of its own (`_Kept`), so the restore at close and
  the ack of a call that ends later go to Redis through a fresh client instead of failing;
- a restore Redis refuses (it is still down) keeps the delivery tags (`PENDING`), the messages themselves
  staying in Redis's unacked hash, and the next live channel restores them as soon as it consumes, and on
  each of kombu's periodic unacked sweeps (`unacked_restore_interval`), instead of leaving them to the
  visibility timeout (hours). Restoring is one transaction per tag on Redis's unacked hash, the same one an
  ack removes the message from: a call acked in between is not restored, one restored and still running
  here is redelivered and meets its running guard (`workers.execution`), so none runs twice;
- a closed channel never restores itself (it could no longer route the message, and kombu would drop it
  from the unacked hash unrouted): a reject with requeue that arrives after the close goes to `PENDING` too.

Every channel the worker opens through its consumer (the consuming one, the task events' one) sends its
commands through one Redis client (`SharedClientChannel`), where kombu builds a new one per command.

The same consumer refuses what it cannot read instead of dying of it (`workers.poison`): a list item that is
no kombu envelope is checked as the channel takes it (`RestartSafeChannel`), a message Celery could not take
as a task as the consumer receives it (`RestartSafeConsumer.create_task_handler`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.sentinel
from celery.worker import state as worker_state
from celery.worker.consumer.consumer import Consumer
from kombu import Connection
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.transport.base import Transport

from workers.connect import MasterCheckingPool
from workers.redis_errors import REDIS_ERRORS, classify
from workers.redis_retry import build_backoff_s

if TYPE_CHECKING:
    from workers.poison import MessageGuard, Refusal

logger = logging.getLogger(__name__)


class PendingRestores:
    """Delivery tags whose restore Redis refused, per broker, until a live channel restores them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: dict[str, list[str]] = {}

    def keep(self, broker: str, tags: Iterable[str]) -> int:
        """Keep `tags` for `broker`; returns how many are kept for it now."""
        with self._lock:
            kept = self._tags.setdefault(broker, [])
            kept.extend(tag for tag in tags if tag not in kept)
            return len(kept)

    def take(self, broker: str) -> list[str]:
        """The tags kept for `broker`, no longer kept."""
        with self._lock:
            return self._tags.pop(broker, [])

    def count(self, broker: str) -> int:
        """How many tags are kept for `broker`."""
        with self._lock:
            return len(self._tags.get(broker, []))

    def clear(self) -> None:
        """Forget every kept tag (a forked pool process: the restores are its parent's)."""
        with self._lock:
            self._tags.clear()


PENDING = PendingRestores()
os.register_at_fork(after_in_child=PENDING.clear)


@dataclass(frozen=True)
class _Kept:
    """What kombu's channel reads of its transport to build a connection pool, kept for when it has none."""

    client: Connection
    default_port: int | None


def build_broker_key(conninfo: Connection, unacked_key: str) -> str:
    """Which broker a delivery tag belongs to: the connection's URL (no password) and its unacked hash."""
    return f"{conninfo.as_uri()}|{unacked_key}"


class RestartSafeQoS(kombu_redis.QoS):
    """kombu's Redis QoS whose restore keeps what Redis refuses, for the next live channel."""

    def _broker(self) -> str:
        return cast(RestartSafeChannel, self.channel).broker_key

    def append(self, message: Any, delivery_tag: str) -> None:
        """Record a message just taken off its queue as unacked, again while Redis refuses the write.

        A Redis out of memory (or refusing writes: MISCONF) refuses the record of a message BRPOP already
        removed: raised, the error ends the worker ("Unrecoverable error") and the message is lost. The
        consumer waits instead — nothing progresses while Redis refuses writes. A lost connection or a
        read-only replica is raised as before (`RedisErrorClass.reconnect`): kombu reconnects, to the current
        master.
        """
        failures = 0
        while True:
            try:
                super().append(message, delivery_tag)
                return
            except redis.RedisError as exc:
                meaning = classify(exc)
                if meaning is None or meaning.reconnect or not meaning.transient:
                    raise
                failures += 1
                if failures == 1:
                    logger.warning("Redis refuses to record a received message (%r); retrying", exc)
                time.sleep(build_backoff_s(failures))

    def restore_unacked(self, client: Any | None = None) -> None:
        """Restore this channel's unacked messages; those Redis refuses are kept (`PENDING`), and, Redis
        answering, the ones kept by earlier channels are restored too (a warm shutdown after an outage)."""
        try:
            super().restore_unacked(client)
        except REDIS_ERRORS as exc:  # down, loading, out of memory, a replica…
            tags = list(self._delivered or ())
            if self._delivered is not None:
                self._delivered.clear()
            kept = PENDING.keep(self._broker(), tags)
            logger.warning(
                "could not restore %d unacked message(s), Redis refused: %r; %d kept until it answers",
                len(tags),
                exc,
                kept,
            )
            return
        if self.channel.connection is not None:
            restore_pending(self)

    def restore_by_tag(self, tag: str, client: Any | None = None, leftmost: bool = False) -> None:
        """kombu's restore of one message, unless this channel is closed: then a live channel restores it."""
        if self.channel.connection is None:
            PENDING.keep(self._broker(), [tag])
            return
        super().restore_by_tag(tag, client, leftmost)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """kombu's periodic sweep of messages unacked past the visibility timeout, after the kept restores."""
        restore_pending(self)
        super().restore_visible(start, num, interval)


def restore_pending(qos: RestartSafeQoS) -> None:
    """Restore the tags kept for `qos`'s broker through its (live) channel; keep what Redis still refuses."""
    broker = qos._broker()
    tags = PENDING.take(broker)
    for done, tag in enumerate(tags):
        try:
            qos.restore_by_tag(tag)
        except REDIS_ERRORS as exc:  # down, loading, out of memory, a replica…
            PENDING.keep(broker, tags[done:])
            logger.warning("%d unacked message(s) still to restore, Redis refused: %r", len(tags) - done, exc)
            return
    if tags:
        logger.warning("restored %d unacked message(s) kept while Redis was away", len(tags))


class SharedClientChannel(kombu_redis.Channel):
    """kombu's Redis channel with one synchronous client, not a new one per command.

    kombu builds a fresh `redis.Redis` (its response-callback table filled anew) for every publish, ack and
    unacked record (`conn_or_acquire`); with task events on, a worker's parent did so for each event it
    published, about 17 % of its CPU under load. One client over the channel's pool sends the same commands:
    redis-py takes a connection from the pool per command (thread-safe), a forked process's pool drops its
    parent's connections by itself, and a pool kombu builds again (a channel's pools dropped at close) gets a
    client of its own.
    """

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            # kombu keeps that one already (`Channel.client`, its BRPOP and LISTEN).
            return super()._create_client(asynchronous=True)  # type: ignore[misc]  # kombu's, untyped
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client


class RestartSafeChannel(SharedClientChannel):
    """kombu's Redis channel that can still reach Redis after its connection let go of it (module doc), with
    one synchronous client (`SharedClientChannel`: an ack and an unacked record per call)."""

    QoS = RestartSafeQoS
    broker_key: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        transport: Transport = args[0] if args else kwargs["connection"]
        assert transport.client is not None  # a channel is only opened on a connected transport
        self._kept = _Kept(transport.client, transport.default_port)
        super().__init__(*args, **kwargs)
        self.broker_key = build_broker_key(transport.client, self.unacked_key)

    @property
    def pool(self) -> Any:
        """kombu's connection pool; built from the kept connection parameters once the transport let go of
        them (a closed or closing channel restoring or acking, module doc)."""
        transport = self.connection
        if transport is not None and transport.client is not None:
            return super().pool
        self.connection = cast(Any, self._kept)
        try:
            return super().pool
        finally:
            self.connection = transport

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """kombu's consume; a consuming channel is live, and restores what earlier channels kept. Each
        envelope of `queue` is checked before kombu builds a message of it (`_admit`)."""
        consumer_tag = super().basic_consume(queue, *args, **kwargs)
        callbacks: dict[str, Callable[[Any], Any]] = cast(Any, self.connection)._callbacks
        deliver = callbacks[queue]

        def admit_then_deliver(payload: Any) -> Any:
            self._delivering = True
            refused = self._admit(payload, queue)
            # The list it was read from, for a refusal further on (`RestartSafeConsumer._refuse`): the
            # envelope's routing key is only what its sender claims.
            self.delivering_queue = queue
            return None if refused else deliver(payload)

        callbacks[queue] = admit_then_deliver
        restore_pending(cast(RestartSafeQoS, self.qos))
        return consumer_tag

    _delivering = False
    # The queue of the message being handed to the consumer (set for each, read while it is handled).
    delivering_queue: str | None = None

    def _brpop_read(self, **options: Any) -> Any:
        """kombu's read of a BRPOP reply; a list item that is not JSON is refused instead of raised.

        kombu parses the item before it hands it on: raised, the error would end the worker, the item
        already gone from its list. An error raised once the item was handed on is not the item's: raised.
        """
        self._delivering = False
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]  # kombu's, untyped
        except (ValueError, UnicodeDecodeError) as exc:
            if self._delivering:
                raise
            raw = exc.doc if isinstance(exc, json.JSONDecodeError) else b""
            # kombu rotated the item's queue to the end of its cycle before parsing the item.
            queues: list[str] = getattr(getattr(self, "_queue_cycle", None), "items", None) or [""]
            self._admit(raw, queues[-1] or None)
            return True

    def _admit(self, payload: Any, queue: str | None) -> bool:
        """Refuse `payload` (a parsed envelope, or a list item that did not parse) when kombu could not build
        a message of it; True when refused (the item is gone from its list: there is nothing to ack)."""
        from workers.poison import build_preview, inspect_envelope, parse_envelope

        if isinstance(payload, bytes | str):
            envelope_refusal = parse_envelope(payload)[1]
        else:
            envelope_refusal = inspect_envelope(payload)
        if envelope_refusal is None:
            return False
        headers = payload.get("headers") if isinstance(payload, dict) else None
        body = payload.get("body") if isinstance(payload, dict) else payload
        preview = build_preview(headers, body if isinstance(body, bytes | str) else None)
        guard: MessageGuard | None = getattr(self.connection, "message_guard", None)
        if guard is not None:
            guard.refuse(envelope_refusal, queue=queue, preview=preview)
        else:
            logger.warning("refused a message on %s (%s); preview: %s", queue, envelope_refusal, preview)
        return True


class MasterCheckingSentinelChannel(kombu_redis.SentinelChannel):
    """kombu's Sentinel channel whose connection pool asks the sentinels where the master is at least every
    `MASTER_CHECK_S` while in use (`workers.connect.MasterCheckingPool`).

    kombu's pool asks only when it opens a connection: after SENTINEL FAILOVER a publisher's warm connection
    would go on writing tool-call messages to the old master until the sentinels demote it, about ten
    seconds on, and the demoted master drops them.
    """

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        pool = super()._sentinel_managed_pool(asynchronous)  # type: ignore[misc]
        # kombu builds redis-py's pool through `Sentinel.master_for` with no way to name its class; ours adds
        # only the check before handing out a connection, no state of its own.
        if type(pool) is redis.sentinel.SentinelConnectionPool:
            pool.__class__ = MasterCheckingPool
        return pool


class MasterCheckingSentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with `MasterCheckingSentinelChannel`s (`use_master_checking_sentinels`)."""

    Channel = MasterCheckingSentinelChannel


def use_master_checking_sentinels() -> None:
    """Make every `sentinel://` kombu connection of this process a `MasterCheckingSentinelTransport`: the
    orchestrator's publisher, the worker's consumer, retries and events, Flower's broker.

    By the alias kombu resolves the URL scheme with, not the `broker_transport` setting: the connection still
    calls itself `sentinel`, as Flower expects of it."""
    TRANSPORT_ALIASES["sentinel"] = f"{__name__}:{MasterCheckingSentinelTransport.__name__}"


class SharedClientSentinelChannel(SharedClientChannel, MasterCheckingSentinelChannel):
    """`SharedClientChannel` for a `sentinel://` broker: its pool asks the sentinels for the master."""


def use_shared_clients(transport: Transport) -> None:
    """Open `transport`'s channels as `SharedClientChannel`s (a Redis or Sentinel transport; others as they
    are): the worker's event connection, which publishes every task event."""
    if isinstance(transport, kombu_redis.SentinelTransport):
        transport.Channel = SharedClientSentinelChannel
    elif isinstance(transport, kombu_redis.Transport):
        transport.Channel = SharedClientChannel


class RestartSafeSentinelChannel(RestartSafeChannel, MasterCheckingSentinelChannel):
    """`RestartSafeChannel` for a `sentinel://` broker: its pool asks the sentinels for the master."""


def use_restart_safe_channels(transport: Transport) -> None:
    """Open `transport`'s channels as restart-safe ones (a Redis or Sentinel transport; others as they are).

    Set on the transport instance, not by naming a transport class in `broker_transport`: kombu names a
    connection's URL scheme after that setting, and Flower picks its broker by that scheme."""
    if isinstance(transport, kombu_redis.SentinelTransport):
        transport.Channel = RestartSafeSentinelChannel
    elif isinstance(transport, kombu_redis.Transport):
        transport.Channel = RestartSafeChannel


class RestartSafeConsumer(Consumer):
    """Celery's worker consumer on a connection whose channels ride out a Redis restart (module doc).

    Only the consumer's connection holds unacked deliveries; the event connection Celery opens through the
    consumer shares one client per channel (`SharedClientChannel`), and the producer pool keeps kombu's
    channels."""

    # Celery's (untyped in celery-types): set once the consumer connects, and its task strategies by name.
    connection_errors: tuple[type[BaseException], ...]
    channel_errors: tuple[type[BaseException], ...]
    strategies: dict[str, Any]

    def connection_for_read(self, heartbeat: float | None = None) -> Connection:
        """Celery's consuming connection, its transport's channels made restart-safe before it connects,
        and refusing envelopes kombu could not read (`RestartSafeChannel._admit`)."""
        connection = self.app.connection_for_read(heartbeat=heartbeat)
        use_restart_safe_channels(connection.transport)
        cast(Any, connection.transport).message_guard = self.message_guard
        return self.ensure_connected(connection)

    def connection_for_write(self, url: str | None = None, heartbeat: float | None = None) -> Connection:
        """Celery's writing connection (the task events' dispatcher), its channels each publishing through
        one client (`SharedClientChannel`)."""
        connection = self.app.connection_for_write(url=url, heartbeat=heartbeat)
        use_shared_clients(connection.transport)
        return self.ensure_connected(connection)

    @cached_property
    def message_guard(self) -> MessageGuard:
        """What this consumer does with a message it refuses (`workers.poison`)."""
        from workers.call_store import get_store
        from workers.poison import MessageGuard
        from workers.settings import get_worker_settings

        settings = getattr(self.app, "settings", None) or get_worker_settings()
        return MessageGuard(
            lambda: get_store(settings.redis_url, settings.redis_ssl_cert_reqs),
            worker=self.hostname,
            queues=lambda: set(self.app.amqp.queues.consume_from or self.app.amqp.queues),
        )

    def create_task_handler(self, promise: Any = None) -> Callable[[Any], Any]:
        """Celery's handler of a received task message, behind a check of what Celery and the tool task
        read of it (`workers.poison.inspect_task_message`): a message either would raise on is refused —
        acked, its call answered `invalid_request` or the message logged — instead of ending the worker.

        What still raises in Celery's handler, short of a connection error, refuses the message the same
        way, unless Celery took it on already (then the error is Celery's own to report)."""
        from workers.poison import Refusal, RefusalReason, find_named_call

        handle = super().create_task_handler() if promise is None else super().create_task_handler(promise)
        recoverable = (*self.connection_errors, *self.channel_errors)
        inspect = self._build_inspector()

        def on_task_received(message: Any) -> Any:
            refusal = inspect(message)
            if refusal is not None:
                return self._refuse(message, refusal)
            try:
                return handle(message)
            except recoverable:
                raise
            except Exception as exc:
                task_id = message.headers.get("id") if isinstance(message.headers, dict) else None
                if message.acknowledged or task_id in worker_state.requests:
                    raise
                logger.exception("could not take a message as a task; refusing it")
                detail = f"the worker could not take it as a task: {type(exc).__name__}"
                call = find_named_call(message.headers, None)
                return self._refuse(message, Refusal(RefusalReason.UNREADABLE, detail, call))

        return on_task_received

    def _build_inspector(self) -> Callable[[Any], Refusal | None]:
        from workers.contract import TASK_NAME_PREFIX
        from workers.poison import TaskMessage, inspect_task_message
        from workers.tools import registry

        strategies = self.strategies

        def spec_of(name: str) -> Any:
            tool = registry.get(name.removeprefix(TASK_NAME_PREFIX))
            return tool.spec if tool is not None and name in strategies else None

        def inspect(message: Any) -> Refusal | None:
            view = TaskMessage(
                headers=message.headers,
                body=message.body,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                decode=message.decode,
            )
            return inspect_task_message(view, is_registered=strategies.__contains__, spec_of=spec_of)

        return inspect

    def _refuse(self, message: Any, refusal: Refusal) -> None:
        """Answer or log a refused message, then ack it (a failed ack is tried again, `workers.acks`)."""
        from workers.acks import ensure_acked
        from workers.poison import build_preview

        # The list the message came from; the routing key its envelope claims only when that is unknown.
        queue = getattr(message.channel, "delivering_queue", None)
        if queue is None:
            delivery = message.delivery_info if isinstance(message.delivery_info, dict) else {}
            queue = delivery.get("routing_key")
        try:
            body: Any = message.decode() if refusal.reason.value != "not_json" else message.body
        except Exception:  # the preview shows what it can: the raw body
            body = message.body
        preview = build_preview(message.headers, body)
        self.message_guard.refuse(refusal, queue=queue if isinstance(queue, str) else None, preview=preview)
        message.ack_log_error(logger, (*self.connection_errors, redis.RedisError))
        ensure_acked(message)
