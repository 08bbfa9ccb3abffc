"""Riding out a Redis outage inside a pool child: retry a Redis step with capped backoff until a bound.

A tool's outcome is the one thing a worker must not drop: when Redis is down as the tool ends, the child
keeps the outcome and writes it again until Redis answers (or the bound near the hard limit passes), so the
orchestrator never re-dispatches a call that already ran. A call that cannot start waits the same way, for a
shorter while, and is otherwise handed back to Celery unstarted.

Only connection-level failures are retried (`redis.ConnectionError`, which covers a Redis still loading its
data after a restart, and `redis.TimeoutError`); a wrong command is a bug and raises at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "Redis is not there right now", as opposed to "Redis refused this command".
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


def build_backoff_s(failures: int) -> float:
    """The pause after `failures` failed tries: doubling from `BACKOFF_MIN_S`, capped at `BACKOFF_MAX_S`."""
    return min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2.0 ** max(failures - 1, 0))


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

    def call(self, step: Callable[[int], T], what: str) -> T:
        """`step(failures)` until it returns; re-raises its last error once a pause would pass the bound.

        `failures` (0 on the first try) lets a step that may have half-happened check before redoing it.
        """
        failures = 0
        while True:
            try:
                return step(failures)
            except UNAVAILABLE_ERRORS as exc:
                failures += 1
                pause = build_backoff_s(failures)
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
