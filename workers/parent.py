"""Answering for a pool child that cannot answer for itself, from the worker's parent process.

Hard time limit (the parent killed the child), a lost child (retried, or answered `worker_lost`), a revoked
or expired task. Each writes through the same first-writer-wins path as the child, and drops what the dead
child held: its running guard and its idempotency lock, so that a retry or an identical call is not held up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from workers import keys
from workers.contract import FailureKind, ToolCallRequest, build_failure
from workers.execution import CallStore
from workers.outcomes import build_idempotency_key, decide_retry, format_seconds
from workers.tools import Tool


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
    """
    outcome = build_failure(
        request,
        FailureKind.TIMEOUT,
        f"timed out after {format_seconds(limit_s)} s (hard limit; the worker process was killed)",
        attempts=max(store.read_attempts(request.call_id), 1),
        duration_ms=limit_s * 1000,
        worker=worker,
        finished_at=time.time(),
    )
    lock = keys.idempotency_lock(idempotency_key) if idempotency_key else None
    return store.finish(outcome, reply_key=request.reply_key, token="", idempotency_lock=lock)


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
    (or a retry would pass the deadline) the call is answered `worker_lost` here.
    """
    store.release(request.call_id, "")
    idem_key = build_idempotency_key(tool.spec, request.arguments)
    if idem_key is not None:
        store.release_idempotency_lock(idem_key, request.call_id)
    attempt = max(store.read_attempts(request.call_id), 1)
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
    store.finish(outcome, reply_key=request.reply_key, token=None)
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

    A terminated child's idempotency lock on `idempotency_key` goes too.
    """
    if expired:
        kind, message = FailureKind.DEADLINE_EXCEEDED, "the deadline passed before the call started"
    else:
        kind, message = FailureKind.CANCELLED, "the call was cancelled (task revoked)"
    outcome = build_failure(
        request,
        kind,
        message,
        attempts=max(store.read_attempts(request.call_id), 1),
        worker=worker,
        finished_at=time.time(),
    )
    lock = keys.idempotency_lock(idempotency_key) if idempotency_key else None
    return store.finish(outcome, reply_key=request.reply_key, token="", idempotency_lock=lock)
