"""Riding out a Redis that fails, in the orchestrator: retry with capped backoff, say so once, count it.

Every Redis failure is retried, never fatal: what it means is `workers.redis_errors.classify`'s — Redis
unreachable, a failover, out of memory, loading or busy, a cluster moving, unable to persist, this process
denied access — and a wrong command or a script error, a bug, is logged with its traceback (once per distinct
message) and retried all the same, as a process that exits takes every turn it owns down with it.

    RedisOutage     the story an operator reads: one line when an outage starts (its kind), one every
                    `report_s` while it lasts, one when it ends; every retry counted in
                    `toolloop_redis_errors_total{loop, kind}`. A Celery broker that is not the state Redis
                    (RabbitMQ) has an outage of its own (`build_broker_outage`): its lines say "the broker
                    at amqp://…", its retries count in `toolloop_broker_errors_total`
    RedisRetry      `call(loop, fn)`: `fn()` again after each failure, pausing `build_backoff_s` (0.1 s
                    doubling to 2 s, equal jitter), until it succeeds — or, once the process stops, re-raising
                    the error
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url

from orchestrator import metrics
from workers import redis_errors
from workers.redis_errors import (
    BACKOFF_CAP_S,
    BACKOFF_FIRST_S,
    REDIS_ERRORS,
    RedisErrorKind,
    build_backoff_s,
    classify,
)

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "OUTAGE_REPORT_S",
    "REDIS_ERRORS",
    "SETTLE_S",
    "Backoff",
    "OutageKind",
    "RedisOutage",
    "RedisRetry",
    "build_backoff_s",
    "build_broker_outage",
    "build_outage_kind",
    "build_shown_url",
    "find_redis_error",
    "is_redis_failure",
    "is_redis_url",
]

log = logging.getLogger("toolloop.orchestrator")

T = TypeVar("T")

BACKOFF_MIN_S = BACKOFF_FIRST_S
BACKOFF_MAX_S = BACKOFF_CAP_S
# While an outage lasts, how often that is said again (its start is said at once).
OUTAGE_REPORT_S = 10.0
# Redis refusing writes is over once none was refused for this long: near `maxmemory` some writes pass and
# some do not, and a read passes throughout. Longer than a backoff pause, so a call still retrying is heard.
SETTLE_S = 5.0
# An error text is cut to this in a log line: a pipeline's error quotes the command it refused.
_TEXT_MAX = 300
# Distinct unexpected errors whose traceback was logged; past this many, none is logged again.
_UNEXPECTED_MAX = 256

OutageKind = RedisErrorKind | Literal["unexpected"]
"""How an outage is told: the kind of Redis error (`workers.redis_errors`), or "unexpected" for a bug."""


def find_redis_error(exc: BaseException) -> BaseException:
    """The Redis error behind `exc` (kombu wraps what it gave up publishing), else `exc` itself (pure)."""
    found = redis_errors.find_redis_error(exc)
    return exc if found is None else found


def is_redis_failure(exc: BaseException) -> bool:
    """True for a Redis failure, raised as is or wrapped (kombu wraps what it gave up retrying)."""
    return isinstance(exc, OperationalError) or classify(exc) is not None


def build_outage_kind(exc: BaseException) -> OutageKind:
    """What a Redis failure says about Redis (pure): how the operator is told, and whether it is a bug."""
    meaning = classify(exc)
    if meaning is None:  # kombu's OperationalError with no Redis error behind it: the broker is away
        return RedisErrorKind.UNREACHABLE
    return "unexpected" if meaning.bug else meaning.kind


def build_shown_url(redis_url: str) -> str:
    """`redis_url` as a log line shows it: its passwords hidden, every part of a Sentinel URL included."""
    shown = []
    for part in redis_url.split(";"):
        try:
            shown.append(maybe_sanitize_url(part))
        except ValueError:  # a port that is not a number: say nothing of the part, it may hold a password
            shown.append("<an unparsable URL>")
    return ";".join(shown)


def _build_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= _TEXT_MAX else f"{text[:_TEXT_MAX]}…"


_OPENINGS: dict[OutageKind, tuple[str, str, str]] = {
    # kind: (what Redis does, why, until when the process retries)
    RedisErrorKind.UNREACHABLE: ("is unreachable", "", "it is back"),
    RedisErrorKind.FAILOVER: ("refuses writes", ": read-only replica or failover", "it accepts them"),
    RedisErrorKind.OUT_OF_MEMORY: ("refuses writes", ": out of memory", "it accepts them"),
    RedisErrorKind.LOADING: ("refuses commands", ": loading its data or busy", "it serves them"),
    RedisErrorKind.CLUSTER_MOVING: ("refuses commands", ": cluster slots moving", "it serves them"),
    RedisErrorKind.CANNOT_PERSIST: ("refuses writes", ": cannot persist to disk", "it accepts them"),
    RedisErrorKind.ACCESS_DENIED: ("refuses this process", ": access denied", "it lets it in"),
    RedisErrorKind.NO_SCRIPT: ("answers with an unexpected error", "", "it is back"),
    RedisErrorKind.SCRIPT_ERROR: ("answers with an unexpected error", "", "it is back"),
    RedisErrorKind.WRONG_COMMAND: ("answers with an unexpected error", "", "it is back"),
    "unexpected": ("answers with an unexpected error", "", "it is back"),
}


class RedisOutage:
    """Tells an operator plainly that Redis fails, instead of a warning per failed call, and counts it.

    One line naming the URL (its password hidden) and the kind of failure when an outage starts (or changes
    kind), one every `report_s` while it lasts, and one when it is over. Every loop reports to the same
    instance, so an outage is one story however many loops notice it. Redis unreachable is over at the
    first call that succeeds; Redis refusing commands only once none failed for `settle_s` — a read that
    succeeds proves nothing about writes, and near `maxmemory` one write may pass while the next does not.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        report_s: float = OUTAGE_REPORT_S,
        settle_s: float = SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
        subject: str = "Redis",
        record: Callable[[str, BaseException], None] = metrics.record_redis_error,
    ) -> None:
        """`subject` is what the lines name ("Redis", "the broker"); `record` counts each failure."""
        self.url = build_shown_url(redis_url)
        self.subject = subject
        self._record = record
        self.report_s = report_s
        self.settle_s = settle_s
        self._clock = clock
        self._since: float | None = None
        self._kind: OutageKind | None = None
        self._reported_at = self._failed_at = 0.0
        self._unexpected: set[str] = set()

    @property
    def ongoing(self) -> bool:
        """True from a failure until the next success."""
        return self._since is not None

    def failed(self, exc: BaseException, loop: str = "other") -> None:
        """A Redis call of `loop` failed and is retried: count it; tell it now, or if told `report_s` ago."""
        exc = find_redis_error(exc)
        self._record(loop, exc)
        kind = build_outage_kind(exc)
        if kind == "unexpected":
            self._tell_unexpected(exc, loop)
        now = self._failed_at = self._clock()
        text = _build_text(exc)
        doing, why, until = _OPENINGS[kind]
        if self._since is None or kind != self._kind:
            self._since = now if self._since is None else self._since
            self._kind, self._reported_at = kind, now
            log.warning(
                "%s at %s %s%s (%s); retrying until %s", self.subject, self.url, doing, why, text, until
            )
        elif now - self._reported_at >= self.report_s:
            self._reported_at = now
            doing, lasted = doing.removeprefix("is "), now - self._since
            log.warning(
                "%s at %s still %s after %.0f s%s (%s); retrying",
                self.subject,
                self.url,
                doing,
                lasted,
                why,
                text,
            )

    def succeeded(self) -> None:
        """A Redis call succeeded: if an outage was told and this proves it over, tell that it is."""
        if self._since is None:
            return
        now = self._clock()
        if self._kind is not RedisErrorKind.UNREACHABLE and now - self._failed_at < self.settle_s:
            return
        log.info("%s at %s is back after %.1f s", self.subject, self.url, now - self._since)
        self._since = self._kind = None

    def _tell_unexpected(self, exc: BaseException, loop: str) -> None:
        message = str(exc)
        if message in self._unexpected or len(self._unexpected) >= _UNEXPECTED_MAX:
            return
        self._unexpected.add(message)
        log.error(
            "unexpected %s error in the %s loop (a bug?); retrying it", self.subject, loop, exc_info=exc
        )


def is_redis_url(url: str) -> bool:
    """Whether a Celery broker URL leads to Redis (`redis`, `rediss`, `sentinel` schemes) (pure)."""
    return urlsplit(url).scheme in {"redis", "rediss", "sentinel"}


def build_broker_outage(broker_url: str) -> RedisOutage:
    """The outage of a Celery broker that is not the state Redis: named "the broker", counted apart."""
    return RedisOutage(broker_url, subject="the broker", record=metrics.record_broker_error)


class RedisRetry:
    """Retries Redis calls with capped backoff until they succeed or the process stops.

    `stopping` is set when the process stops: a pause ends at once, and the next failure is raised to the
    caller (who gives its work up as a crash would) instead of retried.
    """

    def __init__(self, outage: RedisOutage) -> None:
        self.outage = outage
        self.stopping = asyncio.Event()

    async def call(self, loop: str, fn: Callable[[], Awaitable[T]]) -> T:
        """`await fn()` until it returns; a Redis failure is told, counted, paused on and tried again."""
        failures = 0
        while True:
            try:
                result = await fn()
            except REDIS_ERRORS as exc:
                if self.stopping.is_set():
                    raise
                failures += 1
                self.outage.failed(exc, loop)
                await self.pause(build_backoff_s(failures))
                continue
            self.outage.succeeded()
            return result

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if the process stops meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()


class Backoff(redis_errors.Backoff):
    """The failures in a row of one loop that retries by itself: its next pause, and the outage told."""

    def __init__(self, retry: RedisRetry, loop: str, **backoff: Any) -> None:
        """`backoff`: `redis_errors.Backoff`'s bounds and random source."""
        super().__init__(**backoff)
        self._retry = retry
        self._loop = loop

    def failed(self, exc: BaseException) -> float:
        """Tell and count a failure; the pause before the next try (`RedisRetry.pause` it, or not)."""
        self._retry.outage.failed(exc, self._loop)
        return self.next_s()

    def succeeded(self) -> None:
        """The loop's call succeeded: the next failure pauses briefly again; the outage may be over."""
        self.reset()
        self._retry.outage.succeeded()
