"""Tool-call messages built with Celery's own protocol and published in batches through one kombu producer.

Why: `Celery.send_task` costs far more CPU than the message it sends. For every message it looks the task
up in the registry, routes, builds options dicts twice over, acquires a producer, wraps the publish in
kombu's retrying `Connection.ensure`, re-declares the queue and the event exchange (binding a copy of each
to the channel), and publishes the `task-sent` event through a dispatcher that does all of that again. A
round of tool calls pays it once per call. `TaskSender` does once per batch what only needs doing once —
resolve each queue's route, declare it and the event exchange, acquire the producer and open kombu's
publish batch (one pipeline: every LPUSH and every `task-sent` PUBLISH in one round trip) — and per
message only what `send_task` does that makes the message: `app.amqp.as_task_v2`, the
`before_task_publish`/`after_task_publish` signals, `Producer.publish`, and the `task-sent` event with
the fields, headers and clock Celery's dispatcher gives it.

The messages are exactly `send_task`'s for the same options (`build_send_options`'s keys; a test compares
them header by header), with two differences that are not in the message: the publish is not retried by
kombu (`Publisher` retries the batch, with backoff, for as long as Redis is away), and the task registry
is not consulted for execution options (the orchestrator's app registers no tool task: `create_app`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery, signals
from celery.events.event import Event
from celery.utils.nodenames import anon_nodename
from celery.utils.time import utcoffset
from kombu import Queue
from kombu.entity import maybe_delivery_mode

# kombu flushes a batch early once it holds `max_size` Redis commands; a message costs at most this many (its
# LPUSH, a PEXPIRE per priority level of a queue that expires, its event's PUBLISH). A failed early flush
# would be reported on one message only, so a batch is sized never to need one.
_COMMANDS_PER_MESSAGE = 8


@dataclass(frozen=True)
class TaskRoute:
    """Where a queue's messages go, as `amqp.send_task_message` works it out from the queue."""

    queue: Queue
    exchange: str
    routing_key: str
    delivery_mode: int | None


@dataclass(frozen=True)
class TaskMessage:
    """One task message ready to publish: Celery's protocol-2 parts and what `send_task` hands kombu."""

    task_id: str
    name: str
    route: TaskRoute
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: tuple[Any, ...]
    sent_event: dict[str, Any] | None
    serializer: str | None


class TaskSender:
    """Builds and publishes task messages for one Celery app; long-lived (routes are resolved once).

    Thread-safe: the route cache is only ever added to, and each publish uses the caller's producer.
    """

    def __init__(self, app: Celery) -> None:
        self._app = app
        conf = app.conf
        self._default_serializer: str | None = conf.task_serializer
        self._default_compression: str | None = conf.task_compression
        self._default_delivery_mode = conf.task_default_delivery_mode
        self._send_sent_event = bool(conf.task_send_sent_event)
        self._retry_policy = dict(conf.task_publish_retry_policy or {})
        # A dispatcher like the one `send_task` publishes `task-sent` through (not enabled: it lends its
        # exchange, hostname, headers and the app's clock; the producer is the batch's).
        self._events: Any = app.events.Dispatcher(enabled=False)
        self._routes: dict[str, TaskRoute] = {}
        self._lock = threading.Lock()

    def route(self, queue_name: str) -> TaskRoute:
        """The route of a queue, resolved once (by Celery's router: a missing queue is created as it does)."""
        route = self._routes.get(queue_name)
        if route is None:
            with self._lock:
                route = self._routes.get(queue_name) or self._build_route(queue_name)
                self._routes[queue_name] = route
        return route

    def _build_route(self, queue_name: str) -> TaskRoute:
        queue = self._app.amqp.router.expand_destination({"queue": queue_name})["queue"]
        exchange: Any = queue.exchange
        delivery_mode = exchange.delivery_mode or self._default_delivery_mode
        if exchange.type == "direct":
            # Celery's "anon exchange": the routing key names the queue itself.
            return TaskRoute(queue, "", queue.name, maybe_delivery_mode(delivery_mode))
        exchange_name = exchange.name or self._app.amqp.default_exchange.name
        routing_key = queue.routing_key or self._app.conf.task_default_routing_key
        return TaskRoute(queue, exchange_name, routing_key, maybe_delivery_mode(delivery_mode))

    def build(self, options: Mapping[str, Any], *, origin: str | None = None) -> TaskMessage:
        """The message `send_task(**options)` would publish (`publish.build_send_options`'s keys).

        `origin` (the `origin` header, this process's node name) is taken once per batch by the caller.
        """
        name: str = options["name"]
        task_id: str = options["task_id"]
        expires = options.get("expires")
        headers, properties, body, sent_event = self._app.amqp.as_task_v2(
            task_id,
            name,
            args=None,
            kwargs=options["kwargs"],
            expires=expires,
            reply_to=self._app.thread_oid,
            time_limit=options.get("time_limit"),
            soft_time_limit=options.get("soft_time_limit"),
            create_sent_event=self._send_sent_event,
            origin=origin,
            ignore_result=options.get("ignore_result", False),
            argsrepr=options.get("argsrepr"),
            kwargsrepr=options.get("kwargsrepr"),
        )
        headers.update(options.get("headers") or {})
        # What `send_task` leaves over for kombu becomes message properties there: the reprs, `expiration`.
        for key in ("argsrepr", "kwargsrepr"):
            if key in options:
                properties[key] = options[key]
        if expires is not None:
            properties["expiration"] = _expiration_s(expires)
        if options.get("priority") is not None:
            # kombu files it by priority: the list of its step on Redis, the queue's order on AMQP.
            properties["priority"] = options["priority"]
        return TaskMessage(
            task_id=task_id,
            name=name,
            route=self.route(options["queue"]),
            headers=headers,
            properties=properties,
            body=body,
            sent_event=sent_event,
            serializer=options.get("serializer"),
        )

    def declare(self, producer: Any, routes: Iterable[TaskRoute]) -> None:
        """Declare the queues of `routes` and the event exchange on `producer`'s connection (cached by kombu:
        a no-op once declared there), as `send_task` does before every message."""
        for queue in {route.queue.name: route.queue for route in routes}.values():
            producer.maybe_declare(queue)
        if self._send_sent_event:
            producer.maybe_declare(self._events.exchange)

    def publish(self, producer: Any, message: TaskMessage) -> None:
        """Publish `message` and its `task-sent` event through `producer` (inside its batch: buffered).

        The queue and the event exchange must be declared on the producer's connection first (`declare`).
        """
        route = message.route
        signals.before_task_publish.send(
            sender=message.name,
            body=message.body,
            exchange=route.exchange,
            routing_key=route.routing_key,
            declare=[route.queue],
            headers=message.headers,
            properties=message.properties,
            retry_policy=self._retry_policy,
        )
        producer.publish(
            message.body,
            exchange=route.exchange,
            routing_key=route.routing_key,
            serializer=message.serializer or self._default_serializer,
            compression=self._default_compression,
            retry=False,
            delivery_mode=route.delivery_mode,
            declare=[],
            headers=message.headers,
            **message.properties,
        )
        signals.after_task_publish.send(
            sender=message.name,
            body=message.body,
            headers=message.headers,
            exchange=route.exchange,
            routing_key=route.routing_key,
        )
        if message.sent_event is not None:
            self._publish_sent_event(producer, message)

    def _publish_sent_event(self, producer: Any, message: TaskMessage) -> None:
        # `EventDispatcher.publish` with its own producer argument, minus the per-event declare and retry.
        events, route = self._events, message.route
        assert message.sent_event is not None
        fields = {
            **message.sent_event,
            "queue": route.queue.name,
            "exchange": route.exchange,
            "routing_key": route.routing_key,
        }
        event = Event(
            "task-sent",
            hostname=events.hostname,
            utcoffset=utcoffset(),
            pid=events.pid,
            clock=events.clock.forward(),
            **fields,
        )
        producer.publish(
            event,
            routing_key="task.sent",
            exchange=events.exchange.name,
            retry=False,
            declare=[],
            serializer=events.serializer,
            headers=events.headers,
            delivery_mode=events.delivery_mode,
        )

    def send_batch(self, messages: Sequence[TaskMessage]) -> dict[str, Exception]:
        """Publish `messages` on one producer of the app's pool in one kombu batch (one pipelined round trip
        on Redis). Returns the error of each message that failed, by task id; raises when the batch as a
        whole failed (its flush: any message of it may be lost)."""
        errors: dict[str, Exception] = {}
        if not messages:
            return errors
        max_commands = _COMMANDS_PER_MESSAGE * len(messages)
        with self._app.producer_or_acquire() as producer:
            self.declare(producer, (message.route for message in messages))
            with producer.batch(max_size=max(max_commands, 1000)):
                for message in messages:
                    try:
                        self.publish(producer, message)
                    except Exception as exc:
                        errors[message.task_id] = exc
        return errors


def _expiration_s(expires: datetime) -> float:
    # `send_task`'s `expires - app.now()` in seconds (both aware: the same instant difference), 0 once past
    # (Celery logs a warning there; a call whose deadline passed while its publish was retried is answered
    # by the turn's deadline anyway).
    return max(expires.timestamp() - time.time(), 0)


def current_origin() -> str:
    """The `origin` header of this process's messages (Celery's: `gen<pid>@<host>`)."""
    return str(anon_nodename())
