"""Answering for a pool child that cannot answer for itself, from the worker's parent process.

Hard time limit (the parent killed the child), a lost child (retried, or answered `worker_lost`), a revoked
or expired task. Each writes through the same first-writer-wins path as the child, and drops what the dead
child held: its running guard and its idempotency lock, so that a retry or an identical call is not held up.

Redis down: the parent retries its writes for `PARENT_RETRY_S` at most (it is the worker's main process and
must not stall for long), then logs and gives up; the orchestrator's lost-call timer is the backstop.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from workers import keys
from workers.call_store import CallStore
from workers.contract import FailureKind, ToolCallRequest, build_failure
from workers.outcomes import build_idempotency_key, decide_retry, format_seconds
from workers.redis_retry import UNAVAILABLE_ERRORS, RedisRetry
from workers.tools import Tool

logger = logging.getLogger(__name__)

PARENT_RETRY_S = 2.0


def _retry(now: Callable[[], float] = time.time) -> RedisRetry:
    return RedisRetry(now() + PARENT_RETRY_S, now, time.sleep)


def handle_hard_timeout(
    store: CallStore,
    request: ToolCallRequest,
    *,
    limit_s: float,
    worker: str,
    idempotency_key: str | None = None,
) -> bool:
    """In the worker's parent, after it killed a child at the hard limit: write `timeout` (first wins).

    The child's idempotency lock on `idempotency_key` goes too, so that an identical call can run.
    Returns False also when Redis stayed unavailable.
    """
    try:
        return _write_hard_timeout(store, request, limit_s, worker, idempotency_key)
    except UNAVAILABLE_ERRORS:
        logger.exception("no timeout outcome for %s: redis unavailable", request.call_id)
        return False


def _write_hard_timeout(
    store: CallStore, request: ToolCallRequest, limit_s: float, worker: str, idempotency_key: str | None
) -> bool:
    retry = _retry()
    outcome = build_failure(
        request,
        FailureKind.TIMEOUT,
        f"timed out after {format_seconds(limit_s)} s (hard limit; the worker process was killed)",
        attempts=_read_attempts(store, request.call_id, retry),
        duration_ms=limit_s * 1000,
        worker=worker,
        finished_at=time.time(),
    )
    lock = keys.idempotency_lock(idempotency_key) if idempotency_key else None
    return store.finish(outcome, reply_key=request.reply_key, token="", idempotency_lock=lock, retry=retry)


def _read_attempts(store: CallStore, call_id: str, retry: RedisRetry) -> int:
    return max(retry.call(lambda _: store.read_attempts(call_id), "the attempts of a call"), 1)


def handle_worker_lost(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    now: Callable[[], float] = time.time,
    jitter: Callable[[], float] = random.random,
) -> float | None:
    """In the worker's parent, after a child died under a call: the retry delay, or None once answered.

    The dead run's guard is dropped at once, so the retry is never blocked by it. When attempts are used up
    (or a retry would pass the deadline) the call is answered `worker_lost` here. With Redis unavailable,
    None too (unanswered): Celery's requeue of the lost message is all that is left.
    """
    try:
        return _answer_worker_lost(store, tool, request, worker=worker, now=now, jitter=jitter)
    except UNAVAILABLE_ERRORS:
        logger.exception("lost child under %s left unanswered: redis unavailable", request.call_id)
        return None


def _answer_worker_lost(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    now: Callable[[], float],
    jitter: Callable[[], float],
) -> float | None:
    retry = _retry(now)
    idem_key = build_idempotency_key(tool.spec, request.arguments)

    def release(_failures: int) -> None:
        store.release(request.call_id, "")
        if idem_key is not None:
            store.release_idempotency_lock(idem_key, request.call_id)

    retry.call(release, "the guards of a lost child")
    attempt = _read_attempts(store, request.call_id, retry)
    delay = decide_retry(attempt, tool.spec, request.deadline_at, now(), jitter())
    if delay is not None:
        return delay
    outcome = build_failure(
        request,
        FailureKind.WORKER_LOST,
        f"the worker process running '{tool.spec.name}' was lost "
        f"(attempt {attempt} of {tool.spec.retries + 1})",
        attempts=attempt,
        retryable=True,
        worker=worker,
        finished_at=now(),
    )
    store.finish(outcome, reply_key=request.reply_key, token=None, retry=retry)
    return None


def handle_revoked(
    store: CallStore,
    request: ToolCallRequest,
    *,
    expired: bool,
    worker: str,
    idempotency_key: str | None = None,
) -> bool:
    """A revoked task (Flower, cancel) answers `cancelled`; an expired one `deadline_exceeded`.

    A terminated child's idempotency lock on `idempotency_key` goes too. False also when Redis stayed
    unavailable.
    """
    try:
        return _write_revoked(store, request, expired, worker, idempotency_key)
    except UNAVAILABLE_ERRORS:
        logger.exception("no outcome for revoked %s: redis unavailable", request.call_id)
        return False


def _write_revoked(
    store: CallStore, request: ToolCallRequest, expired: bool, worker: str, idempotency_key: str | None
) -> bool:
    retry = _retry()
    if expired:
        kind, message = FailureKind.DEADLINE_EXCEEDED, "the deadline passed before the call started"
    else:
        kind, message = FailureKind.CANCELLED, "the call was cancelled (task revoked)"
    outcome = build_failure(
        request,
        kind,
        message,
        attempts=_read_attempts(store, request.call_id, retry),
        worker=worker,
        finished_at=time.time(),
    )
    lock = keys.idempotency_lock(idempotency_key) if idempotency_key else None
    return store.finish(outcome, reply_key=request.reply_key, token="", idempotency_lock=lock, retry=retry)
