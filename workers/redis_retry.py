"""Riding out a Redis outage inside a pool child: retry a Redis step with capped backoff until a bound.

A tool's outcome is the one thing a worker must not drop: when Redis is down as the tool ends, the child
keeps the outcome and writes it again until Redis answers (or the bound near the hard limit passes), so the
orchestrator never re-dispatches a call that already ran. A call that cannot start waits the same way, for a
shorter while, and is otherwise handed back to Celery unstarted.

What is retried is what `workers.redis_errors` calls transient (`is_unavailable` is its `is_transient`): a
lost connection or a timeout, a failover, Redis out of memory, loading or busy, a cluster moving, a Redis that
cannot persist. A wrong command or a script error is a bug and raises at once, as does a wrong password; the
pauses are `redis_errors.build_backoff_s` (equal jitter), between `BACKOFF_MIN_S` and `BACKOFF_MAX_S`.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis

from workers import redis_errors
from workers.redis_errors import find_redis_error
from workers.redis_errors import is_transient as is_unavailable

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "RedisRetry",
    "build_backoff_s",
    "find_redis_error",
    "ignoring_unavailable",
    "is_unavailable",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A pool child holds a slot while it waits: it tries again sooner than the orchestrator's loops.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


@contextlib.contextmanager
def ignoring_unavailable() -> Iterator[None]:
    """Swallow an error that `is_unavailable` (for a step whose failure is harmless); others propagate."""
    try:
        yield
    except redis.RedisError as exc:
        if not is_unavailable(exc):
            raise


def build_backoff_s(failures: int, rand: Callable[[], float] = random.random) -> float:
    """The pause after `failures` failed tries: `redis_errors.build_backoff_s` from `BACKOFF_MIN_S`, capped
    at `BACKOFF_MAX_S`, jittered."""
    return redis_errors.build_backoff_s(failures, first_s=BACKOFF_MIN_S, cap_s=BACKOFF_MAX_S, rand=rand)


@dataclass(frozen=True)
class RedisRetry:
    """Retry a Redis step while Redis is unavailable, until `give_up_at` (epoch seconds of `now`).

    `interruptions` are exceptions that may break into a try or a pause and are ridden out like an outage
    (a soft time limit arriving while an outcome that is already decided is being written).
    """

    give_up_at: float
    now: Callable[[], float]
    sleep: Callable[[float], None]
    interruptions: tuple[type[BaseException], ...] = ()
    rand: Callable[[], float] = random.random

    def call(self, step: Callable[[int], T], what: str) -> T:
        """`step(failures)` until it returns; re-raises its last error once a pause would pass the bound.

        `failures` (0 on the first try) lets a step that may have half-happened check before redoing it.
        """
        failures = 0
        while True:
            try:
                return step(failures)
            except redis.RedisError as exc:
                if not is_unavailable(exc):
                    raise
                failures += 1
                pause = build_backoff_s(failures, self.rand)
                if self.now() + pause > self.give_up_at:
                    logger.error(
                        "redis unavailable for %s; giving up after %d tries: %s", what, failures, exc
                    )
                    raise
                if failures == 1:
                    logger.warning("redis unavailable for %s, retrying until it is back: %s", what, exc)
            except self.interruptions:
                failures += 1
                pause = 0.0
            self._pause(pause)

    def _pause(self, seconds: float) -> None:
        # An interruption during the pause only makes the next try come sooner.
        with contextlib.suppress(*self.interruptions):
            self.sleep(seconds)
