"""What kombu's Redis transport holds of a call's messages, read straight from the broker's Redis.

A message is queued (a list named after its queue) until a worker takes it, then kept in the unacked hash
until the worker acks it. A message's headers carry its task id, `<call id>:<attempt>`, so a call's id
finds every delivery of it.
"""

from __future__ import annotations

import redis

# kombu's hash of the messages delivered to a worker and not acked yet (its Redis transport's `unacked_key`).
UNACKED_KEY = "unacked"


def is_unacked(broker: redis.Redis, needle: str) -> bool:
    """Whether a message naming `needle` (a task id, a call id) is delivered and not acked yet: it would be
    delivered again."""
    return any(needle.encode() in message for message in broker.hvals(UNACKED_KEY))


def broker_holds(broker: redis.Redis, call_id: str, queue: str) -> bool:
    """Whether a message of the call is still queued on `queue`, or delivered and not acked yet (a copy
    restored after an outage, a retry waiting for its countdown): once neither, every delivery of it (a
    requeued or redelivered copy too) has run its course, and none is left to run or to write."""
    needle = call_id.encode()
    return is_unacked(broker, call_id) or any(needle in message for message in broker.lrange(queue, 0, -1))
