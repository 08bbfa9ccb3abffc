"""Riding out a Redis outage inside a pool child: retry a Redis step with capped backoff until a bound.

A tool's outcome is the one thing a worker must not drop: when Redis is down as the tool ends, the child
keeps the outcome and writes it again until Redis answers (or the bound near the hard limit passes), so the
orchestrator never re-dispatches a call that already ran. A call that cannot start waits the same way, for a
shorter while, and is otherwise handed back to Celery unstarted.

What is retried is one classification, `is_unavailable`, of "Redis is not there, or refuses for now": a lost
connection or a timeout (`redis.ConnectionError`, which covers a Redis still loading its data after a restart,
`BusyLoadingError`), a Redis out of memory under `noeviction` (`OOM`), a replica that was the master before a
failover (`READONLY`), a cluster or replica set between masters (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`), a
Redis that cannot persist (`MISCONF`), one short of replicas (`NOREPLICAS`) or busy with a script (`BUSY`). A
wrong command is a bug and raises at once.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "Redis is not there right now" by their type, as opposed to "Redis refused this command".
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,  # BusyLoadingError (LOADING) included
    redis.exceptions.TimeoutError,
    redis.exceptions.OutOfMemoryError,  # OOM command not allowed (maxmemory with noeviction)
    redis.exceptions.ReadOnlyError,  # READONLY: a replica, after a failover
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,  # MasterDownError (MASTERDOWN) included
)
# Refusals redis-py raises as a plain ResponseError, told apart by their error code. Inside a Lua script Redis
# reports a refused write as "Error running script (…): @user_script:9: -OOM command not allowed…": the code
# follows a dash there.
UNAVAILABLE_CODES = ("OOM", "READONLY", "MISCONF", "MASTERDOWN", "NOREPLICAS", "BUSY", "LOADING", "TRYAGAIN")
_UNAVAILABLE_REPLY = re.compile(r"(?:^|-)(?:" + "|".join(UNAVAILABLE_CODES) + r")\b")
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` says Redis is unavailable or refusing for now (retry later), False for a real error.

    Catch `redis.RedisError` and ask this: `UNAVAILABLE_ERRORS` alone misses the refusals that only their
    message tells apart (MISCONF, NOREPLICAS, BUSY, and any refusal met inside a script)."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return _UNAVAILABLE_REPLY.search(str(exc)) is not None
    return False


@contextlib.contextmanager
def ignoring_unavailable() -> Iterator[None]:
    """Swallow an error that `is_unavailable` (for a step whose failure is harmless); others propagate."""
    try:
        yield
    except redis.RedisError as exc:
        if not is_unavailable(exc):
            raise


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
            except redis.RedisError as exc:
                if not is_unavailable(exc):
                    raise
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


def find_redis_error(exc: object) -> redis.RedisError | None:
    """The Redis error behind `exc`, or None: kombu re-raises a failed publish as its own `OperationalError`
    or `ConnectionError`, with the Redis error as its cause."""
    for _ in range(8):  # a cause chain is short; a cycle must not loop
        if not isinstance(exc, BaseException):
            return None
        if isinstance(exc, redis.RedisError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
