"""Acknowledging a tool task's message when Redis refuses it for a while, without stopping the worker.

kombu's Redis transport acks a message with a MULTI/EXEC that removes it from the unacked index. A Redis out
of memory (`maxmemory` with `noeviction`) refuses every command queued in a MULTI, so the ack raises
`OutOfMemoryError`; kombu lets only its connection errors through its "couldn't ack" log, and anything else
escapes into the worker's event loop: Celery logs "Unrecoverable error" and the worker exits. A READONLY
replica after a failover does the same.

`ToolRequest` (workers.tasks) widens the errors kombu logs to every `redis.RedisError`, and `ensure_acked`
then tries the ack (or a reject: a requeue is refused the same way) again, in the worker's event loop with
capped, jittered backoff (`workers.redis_errors`), while the refusal is transient, until it lands: a message
left unacked would also keep its prefetch slot, and a worker whose every slot is taken consumes nothing more.

The retries run on the worker's event loop as the worker recorded it at its start (`AckRetries`), not as
kombu's `get_event_loop()` has it: kombu forgets its loop whenever the consumer reconnects (its `Hub.reset`
clears the global while Celery goes on running the same hub), and a retry given to no loop never runs — after
one Redis restart, an ack refused later kept its message's prefetch slot for good, and a worker whose every
slot was held took no call again.

A message whose channel was closed under it (Redis restarted and the consumer replaced its connection) is
acked all the same, through the connection parameters the channel keeps (`workers.broker`), and tried again
here while Redis is away. Should that channel fail otherwise, the message is left to the broker: it stays in
the unacked index, is restored, and its redelivery meets the call's outcome and runs nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import Celery, bootsteps
from kombu.asynchronous import get_event_loop

from workers.redis_errors import build_backoff_s, is_transient

logger = logging.getLogger(__name__)

# The worker's event loop, by `AckRetries`; none outside a worker, or for a pool without one.
_worker_hubs: list[Any] = []


def _event_loop() -> Any:
    return _worker_hubs[-1] if _worker_hubs else get_event_loop()


class AckRetries(bootsteps.StartStopStep):
    """The worker bootstep that records the worker's event loop for the ack retries."""

    label = "toolloop ack retries"
    requires = ("celery.worker.components:Hub",)

    def start(self, parent: Any) -> None:
        """Record the worker's hub: the same object for its whole life, through every reconnect."""
        hub = getattr(parent, "hub", None)
        if hub is not None:
            _worker_hubs[:] = [hub]


def connect_ack_retries(app: Celery) -> None:
    """Register `AckRetries` on `app`'s workers."""
    app.steps["worker"].add(AckRetries)


def ensure_acked(message: Any, requeue: bool | None = None) -> None:
    """After an ack (or with `requeue` given, a reject) was asked for — it runs soon, in the event loop —
    try it again later if Redis refused it."""
    hub = _event_loop()
    if hub is not None and message is not None:
        hub.call_soon(_check, message, requeue, 0)


def _check(message: Any, requeue: bool | None, failures: int) -> None:
    if message.acknowledged:
        return
    if failures:
        try:
            if requeue is None:
                message.ack()
            else:
                message.reject(requeue=requeue)
        except redis.RedisError as exc:
            # A MULTI refused under OOM raises the refusal (redis-py raises the first queued command's error
            # in place of EXECABORT), so this is transient.
            if not is_transient(exc):
                logger.error("could not ack %r: %r; left to the broker", message.delivery_tag, exc)
                return
        except Exception as exc:  # the channel cannot reach Redis at all: the unacked index restores it
            logger.warning("could not ack %r: %r; left to the broker", message.delivery_tag, exc)
            return
        else:
            logger.warning("acked %r after %d failed tries", message.delivery_tag, failures)
            return
    hub = _event_loop()
    if hub is None:
        logger.error(
            "could not ack %r: no event loop to try it again on; left to the broker", message.delivery_tag
        )
        return
    hub.call_later(build_backoff_s(failures + 1), _check, message, requeue, failures + 1)
