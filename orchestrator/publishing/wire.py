"""Tool-task messages as the Redis commands kombu would run for them, run by the orchestrator's own client.

Why: publishing through kombu costs the orchestrator a thread hop per batch, a Redis client kombu builds per
batch, and a blocking round trip in a thread that fights the event loop for the GIL — more than the messages
themselves. When the broker is the state Redis, the orchestrator already holds a client of it.

How, without writing kombu's wire format a second time: a `TaskWire` publishes each message (`TaskSender`,
so Celery's protocol, signals and `task-sent` event are what they were) through a kombu `Producer` whose
channel is a `_Recorder` in front of a real kombu Redis channel. kombu's own routing and envelope code runs
(serialisation, base64 body, delivery tag, priority and expiring queues, the fanout topic of the event
exchange), and kombu 5.7's publish-batch protocol (`basic_publish(..., _publish_batch=)`) hands the
recorder the final commands instead of pipelining them. The event loop then runs them as one script call
(`orchestrator.store.task_queue`): one round trip.

Only the declarations do I/O through kombu (a queue's bindings, once per queue, in the publishing thread).
A broker kombu would publish to otherwise — not Redis, a `global_keyprefix` (applied by kombu's client, not
its commands) — gets no wire (`open_task_wire` returns None) and keeps kombu's path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from celery import Celery
from kombu import Producer
from kombu.transport import redis as kombu_redis

from orchestrator.publishing.messages import TaskMessage, TaskRoute, TaskSender
from orchestrator.store.task_queue import BrokerCommand, is_writable


class _Recorder:
    """A kombu Redis channel that records, instead of running, the commands a publish comes to."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        # Everything but publishing is the real channel's: its state (declared exchanges), options, codecs.
        return getattr(self._channel, name)

    def basic_publish(self, message: Any, **kwargs: Any) -> Any:
        return self._channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        """kombu's publish-batch hook: one final command of the message being published."""
        self.commands.append((name, args))


class TaskWire:
    """Turns task messages into broker commands (on the event loop); declares queues (blocking, in a thread).

    Not thread-safe: `commands` is called from the event loop only, `declare` from the publishing thread
    only, before the first message of a new queue is turned into commands.
    """

    def __init__(self, sender: TaskSender, connection: Any, channel: Any) -> None:
        self._sender = sender
        self._connection = connection
        self._channel = channel
        self._recorder = _Recorder(channel)
        # kombu's Producer takes any object with a channel's face; the recorder is one.
        self._producer = Producer(cast(Any, self._recorder))
        self._declared: set[str] = set()

    def undeclared(self, messages: Iterable[TaskMessage]) -> list[TaskRoute]:
        """The routes of `messages` whose queue this wire has not declared yet."""
        routes = {m.route.queue.name: m.route for m in messages if m.route.queue.name not in self._declared}
        return list(routes.values())

    def declare(self, routes: Sequence[TaskRoute]) -> None:
        """Declare the queues of `routes` and the event exchange as `send_task` does (blocking I/O)."""
        self._sender.declare(Producer(self._channel), routes)
        self._declared.update(route.queue.name for route in routes)

    def commands(
        self, messages: Sequence[TaskMessage]
    ) -> tuple[list[BrokerCommand], dict[str, Exception]] | None:
        """The commands that publish `messages` (and their events), and the error of each message that could
        not be turned into commands, by task id; None when kombu asked for a command `write_tasks` does not
        run (a kombu that publishes otherwise: the batch goes through kombu). Every queue must have been
        declared (`undeclared`)."""
        commands: list[BrokerCommand] = []
        errors: dict[str, Exception] = {}
        for message in messages:
            self._recorder.commands = []
            try:
                self._sender.publish(self._producer, message)
            except Exception as exc:
                errors[message.task_id] = exc
                continue
            for verb, args in self._recorder.commands:
                if not is_writable(verb):
                    return None
                commands.append(BrokerCommand(verb, tuple(str(arg) for arg in args)))
        return commands, errors

    def close(self) -> None:
        """Release the kombu connection the declarations use."""
        self._connection.release()


def open_task_wire(app: Celery, sender: TaskSender) -> TaskWire | None:
    """A wire for `app`'s broker, or None when kombu publishes there otherwise than by the commands
    `write_tasks` runs (blocking: it connects, as kombu's channel pings its Redis)."""
    connection = app.connection_for_write()
    try:
        channel = connection.default_channel
        if not isinstance(channel, kombu_redis.Channel) or channel.global_keyprefix:
            connection.release()
            return None
    except BaseException:
        connection.release()
        raise
    return TaskWire(sender, connection, channel)
