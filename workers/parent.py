"""Answering for a pool child that cannot answer for itself, from the worker's parent process.

Hard time limit (the parent killed the child), a lost child (retried, or answered `worker_lost`), a revoked
or expired task. Each writes through the same first-writer-wins path as the child, and drops what the dead
child held: its running guard, its idempotency lock and its concurrency slots (`workers.concurrency`), so
that a retry, an identical call or the next call of a limited tool is not held up.

The parent names the child's execution by the prefix of its token (`workers.fence`: dispatch attempt, worker,
pool process id), so its answer is fenced like the child's own write: when a later execution of the call has
started (the worker was frozen, and the call dispatched again), the parent writes nothing and drops only what
its own child held. An outcome waiting in the spool (`workers.spool`) is a real result: the parent then
answers nothing and leaves the spool to write it.

Redis down: the parent retries its writes for `PARENT_RETRY_S` at most (it is the worker's main process and
must not stall for long), then logs and gives up; the orchestrator's lost-call timer is the backstop.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import redis

from workers import keys
from workers.call_store import CallStore, OutcomeWrite
from workers.concurrency import build_all_slot_keys, get_slot_store
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.fence import build_delivery_fence
from workers.outcomes import build_idempotency_key, decide_retry, format_seconds
from workers.redis_retry import RedisRetry, is_unavailable
from workers.scripts import WriteResult
from workers.spool import Spool
from workers.tools import Tool

logger = logging.getLogger(__name__)

PARENT_RETRY_S = 2.0


def _retry(now: Callable[[], float] = time.time) -> RedisRetry:
    return RedisRetry(now() + PARENT_RETRY_S, now, time.sleep)


def _log_unanswered(exc: redis.RedisError, request: ToolCallRequest, what: str) -> None:
    # The parent is the worker's main process: no Redis error may escape into Celery's consumer and stop it.
    # The orchestrator's lost-call timer, or the turn's deadline, answers the call instead.
    why = "redis unavailable" if is_unavailable(exc) else "redis refused the write"
    logger.error("%s: %s: %s: %r", request.call_id, what, why, exc)


def _spooled(spool: Spool | None, request: ToolCallRequest, what: str) -> bool:
    if spool is None or not spool.holds(request.call_id):
        return False
    logger.warning("%s: no %s answer: its outcome waits in the spool", request.call_id, what)
    return True


def _write(
    store: CallStore,
    outcome: ToolOutcome,
    request: ToolCallRequest,
    *,
    worker: str,
    pid: int | None,
    idempotency_key: str | None,
    retry: RedisRetry,
) -> bool:
    """Write the parent's answer for the delivery pool process `pid` ran (None: it never started), fenced,
    dropping what that process held. True when it won."""
    fence = build_delivery_fence(request.attempt, worker, pid)
    lock = keys.idempotency_lock(idempotency_key) if idempotency_key else None
    write = OutcomeWrite.of(
        outcome,
        fence,
        reply_key=request.reply_key,
        holder=fence.holder or None,
        holder_is_prefix=True,
        idempotency_lock=lock,
    )
    result = store.finish(write, retry=retry)
    if fence.holder:
        _release_slots(store, request, fence.holder, retry)
    if result is WriteResult.FENCED:
        logger.warning(
            "%s: no %s answer: a later execution of the call answers it",
            outcome.call_id,
            outcome.failure_kind,
        )
    return result is WriteResult.WON


def _release_slots(store: CallStore, request: ToolCallRequest, holder: str, retry: RedisRetry) -> None:
    """Give back the concurrency slots (`workers.concurrency`) the executions named by the prefix `holder`
    held: a process the parent killed or lost never gave them back itself."""
    slots = get_slot_store(store.client)
    slot_keys = build_all_slot_keys(request.tool, request.tenant)
    retry.call(lambda _: slots.release(slot_keys, holder, prefix=True), "the slots of a lost child")


def handle_hard_timeout(
    store: CallStore,
    request: ToolCallRequest,
    *,
    limit_s: float,
    worker: str,
    pid: int | None,
    idempotency_key: str | None = None,
    spool: Spool | None = None,
) -> bool:
    """In the worker's parent, after it killed pool process `pid` at the hard limit: write `timeout` (first
    wins, fenced). The child's running guard and idempotency lock on `idempotency_key` go too, so that an
    identical call can run. Returns False also when Redis stayed unavailable.
    """
    if _spooled(spool, request, "timeout"):
        return False
    try:
        retry = _retry()
        outcome = build_failure(
            request,
            FailureKind.TIMEOUT,
            f"timed out after {format_seconds(limit_s)} s (hard limit; the worker process was killed)",
            attempts=_read_attempts(store, request, retry),
            duration_ms=limit_s * 1000,
            worker=worker,
            finished_at=time.time(),
        )
        return _write(
            store, outcome, request, worker=worker, pid=pid, idempotency_key=idempotency_key, retry=retry
        )
    except redis.RedisError as exc:
        _log_unanswered(exc, request, "no timeout outcome")
        return False


def _read_attempts(store: CallStore, request: ToolCallRequest, retry: RedisRetry) -> int:
    def once(_failures: int) -> int:
        return store.read_attempts(request.call_id, request.turn_id)

    return max(retry.call(once, "the attempts of a call"), 1)


def handle_worker_lost(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    pid: int | None,
    spool: Spool | None = None,
    now: Callable[[], float] = time.time,
    jitter: Callable[[], float] = random.random,
) -> float | None:
    """In the worker's parent, after pool process `pid` died under a call: the retry delay, or None once
    answered (or when there is nothing to answer: its outcome waits in the spool).

    The dead run's guard and lock are dropped at once, so the retry is never blocked by them. When attempts
    are used up (or a retry would pass the deadline) the call is answered `worker_lost` here, fenced. With
    Redis unavailable, None too (unanswered): Celery's requeue of the lost message is all that is left.
    """
    if _spooled(spool, request, "worker_lost"):
        return None
    try:
        return _answer_worker_lost(store, tool, request, worker=worker, pid=pid, now=now, jitter=jitter)
    except redis.RedisError as exc:
        _log_unanswered(exc, request, "lost child left unanswered")
        return None


def _answer_worker_lost(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    pid: int | None,
    now: Callable[[], float],
    jitter: Callable[[], float],
) -> float | None:
    retry = _retry(now)
    idem_key = build_idempotency_key(tool.spec, request.arguments, request.tenant)
    holder = build_delivery_fence(request.attempt, worker, pid).holder

    def release(_failures: int) -> None:
        if not holder:
            return  # the process never took anything it could be named by
        store.release(request.call_id, request.turn_id, holder, prefix=True)
        if idem_key is not None:
            store.release_idempotency_lock(idem_key, holder, prefix=True)

    retry.call(release, "the guards of a lost child")
    if holder:
        _release_slots(store, request, holder, retry)
    attempt = _read_attempts(store, request, retry)
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
    _write(store, outcome, request, worker=worker, pid=pid, idempotency_key=None, retry=retry)
    return None


def handle_revoked(
    store: CallStore,
    request: ToolCallRequest,
    *,
    expired: bool,
    worker: str,
    pid: int | None = None,
    idempotency_key: str | None = None,
    spool: Spool | None = None,
) -> bool:
    """A revoked task (Flower, cancel) answers `cancelled`; an expired one `deadline_exceeded`.

    `pid` is the pool process a terminated delivery ran in (None: it never started); that process's running
    guard and idempotency lock on `idempotency_key` go too. Fenced: the revoke of a superseded dispatch
    answers nothing. A copy that never started answers nothing either while another execution holds the
    call (a redelivered or retried copy of a call running elsewhere): that execution answers for the call.
    False also when Redis stayed unavailable.
    """
    if _spooled(spool, request, "revoked"):
        return False
    try:
        retry = _retry()
        held = pid is None and retry.call(
            lambda _: store.read_holder(request.call_id, request.turn_id), "the guard of a call"
        )
        if held:
            logger.warning(
                "%s: a revoked copy answers nothing: another execution holds the call", request.call_id
            )
            return False
        if expired:
            kind, message = FailureKind.DEADLINE_EXCEEDED, "the deadline passed before the call started"
        else:
            kind, message = FailureKind.CANCELLED, "the call was cancelled (task revoked)"
        outcome = build_failure(
            request,
            kind,
            message,
            attempts=_read_attempts(store, request, retry),
            worker=worker,
            finished_at=time.time(),
        )
        return _write(
            store, outcome, request, worker=worker, pid=pid, idempotency_key=idempotency_key, retry=retry
        )
    except redis.RedisError as exc:
        _log_unanswered(exc, request, "no outcome for a revoked call")
        return False
