"""Executing one tool call against Redis: plain Python, no Celery (SPEC §4.3–§4.9).

`execute_call` runs in the pool child and returns a `Decision` — finished (outcome written, first writer
wins), retry later (the task publishes the retry), or skipped (another delivery owns the call). When the
child cannot answer for itself, `workers.parent` answers from the worker's parent process.

The Redis steps (start script, idempotency claim, outcome write) are `workers.call_store`'s.

Redis down (SPEC §8.3): a call that cannot start waits a little for Redis (`START_WAIT_MAX_S`, at most half
its soft limit) and is otherwise handed back to Celery unstarted — never run blind. Once the tool has run,
its outcome is kept and written again with capped backoff until Redis is back, up to `WRITE_MARGIN_S` before
the hard limit (`workers.redis_retry`); both scripts and the write may be repeated after a reply that was
lost, so each recognises its own earlier success.

Idempotent tools (SPEC §4.8) take one more step: a claim script either finds the stored success (a replay)
or takes a short lock on the idempotency key, so that two identical calls running at the same moment do not
both run — the second polls until the first's success is stored (and replays it), or the first failed (and
then runs itself), or its own soft limit is near (and gives up with a `timeout` that says why).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workers import keys
from workers.call_store import CallStore, get_store
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.errors import InvalidResultError
from workers.outcomes import (
    build_args_digest,
    build_idempotency_key,
    build_idempotency_record,
    build_success,
    decide_retry,
    describe_exception,
    describe_validation_error,
    format_seconds,
)
from workers.redis_retry import UNAVAILABLE_ERRORS, RedisRetry
from workers.scripts import IdempotencyClaim, StartResult
from workers.tools import Tool, ToolContext, TransientToolError

# `get_store` is re-exported: the task body takes its store from here.
__all__ = ["CallStore", "Decision", "Finished", "RetryLater", "Skipped", "execute_call", "get_store"]

logger = logging.getLogger(__name__)

# The running guard outlives the hard limit by this much: the parent kills the child by then at the latest.
RUNNING_MARGIN_S = 5.0
# How long a duplicate delivery waits before looking again when another execution holds the call.
DUPLICATE_RECHECK_MAX_S = 5.0
# A call waiting for an identical one polls its stored success with a doubling pause in these bounds, and
# gives up this long before its own soft limit, so that it answers with a clear message of its own.
IDEMPOTENCY_POLL_MIN_S = 0.02
IDEMPOTENCY_POLL_MAX_S = 0.25
IDEMPOTENCY_WAIT_RESERVE_S = 0.2
# Redis down before the tool ran: wait this long at most (and at most half the soft limit, so the tool keeps
# most of its time), then hand the call back to Celery. After the tool ran: keep writing the outcome until
# this long before the hard limit, when the parent may kill the child.
START_WAIT_MAX_S = 10.0
WRITE_MARGIN_S = 1.0
# Countdown of the Celery retry of a call handed back unstarted because Redis was down.
REDIS_DOWN_RETRY_S = 1.0


@dataclass(frozen=True)
class Finished:
    """The call ended here; `won` is False when another writer's outcome was already there."""

    outcome: ToolOutcome
    won: bool


@dataclass(frozen=True)
class RetryLater:
    """Publish the call again after `countdown_s` (a transient failure, or a duplicate delivery)."""

    countdown_s: float
    reason: str


@dataclass(frozen=True)
class Skipped:
    """Nothing to do: the call already has its outcome (`outcome`, None when it could not be read).

    A redelivery of a call answered `worker_lost`, say: the task reports that outcome, not a success.
    """

    reason: str
    outcome: ToolOutcome | None = None


Decision = Finished | RetryLater | Skipped


def execute_call(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    token: str,
    soft_limit_s: float,
    hard_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...] = (),
    now: Callable[[], float] = time.time,
    jitter: Callable[[], float] = random.random,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """Run one delivery of a call in the pool child and write its outcome.

    `timeout_errors` are the exceptions a soft time limit raises (Celery's SoftTimeLimitExceeded). `token`
    names the process; a suffix makes it unique to this execution.
    """
    started = now()
    write_retry = RedisRetry(started + hard_limit_s - WRITE_MARGIN_S, now, sleep, timeout_errors)
    if request.deadline_at is not None and started >= request.deadline_at:
        outcome = build_failure(
            request,
            FailureKind.DEADLINE_EXCEEDED,
            "the deadline passed before the call started",
            worker=worker,
            finished_at=started,
        )
        won = store.finish(outcome, reply_key=request.reply_key, token=None, retry=write_retry)
        return Finished(outcome, won)
    token = f"{token}:{uuid.uuid4().hex[:12]}"
    start_wait_s = min(START_WAIT_MAX_S, soft_limit_s / 2, hard_limit_s - WRITE_MARGIN_S)
    start_retry = RedisRetry(started + start_wait_s, now, sleep)
    running_ttl_s = hard_limit_s + RUNNING_MARGIN_S
    try:
        attempt, held_ms = store.start(
            request, token=token, running_ttl_s=running_ttl_s, worker=worker, retry=start_retry
        )
    except (*UNAVAILABLE_ERRORS, *timeout_errors) as exc:
        return _hand_back(store, request.call_id, token, exc)
    if attempt == StartResult.FINISHED:
        return Skipped("the call already has an outcome", _read_outcome(store, request.call_id))
    if attempt == StartResult.HELD:
        return RetryLater(
            min(max(held_ms / 1000, 0.1), DUPLICATE_RECHECK_MAX_S), "another execution holds the call"
        )
    run = _Run(store, tool, request, attempt, worker, token, now, now(), running_ttl_s, write_retry)
    idem_key = build_idempotency_key(tool.spec, request.arguments)
    if idem_key is not None:
        try:
            claimed = _claim_idempotency(
                run, idem_key, soft_limit_s, timeout_errors, sleep, retry=start_retry
            )
        except UNAVAILABLE_ERRORS as exc:
            return _hand_back(store, request.call_id, token, exc)
        if claimed is not None:
            return claimed
    return _run_started(run, soft_limit_s=soft_limit_s, timeout_errors=timeout_errors, jitter=jitter)


def _read_outcome(store: CallStore, call_id: str) -> ToolOutcome | None:
    # Only for how the task reports itself: Redis gone again now must not fail a call that has its outcome.
    with contextlib.suppress(*UNAVAILABLE_ERRORS):
        return store.read_outcome(call_id)
    return None


def _hand_back(store: CallStore, call_id: str, token: str, exc: BaseException) -> RetryLater:
    """Redis stayed unavailable before the tool ran: Celery retries the call later, unstarted.

    The running guard goes if Redis lets it; otherwise it expires, and the retry waits for it."""
    with contextlib.suppress(*UNAVAILABLE_ERRORS):
        store.release(call_id, token)
    reason = f"redis unavailable before the call started: {exc!r}"
    logger.warning("%s: %s; Celery retries it in %g s", call_id, reason, REDIS_DOWN_RETRY_S)
    return RetryLater(REDIS_DOWN_RETRY_S, reason)


@dataclass
class _Run:
    """One started execution: what its outcome needs, and how to write it."""

    store: CallStore
    tool: Tool[Any, Any]
    request: ToolCallRequest
    attempt: int
    worker: str
    token: str
    now: Callable[[], float]
    started: float
    lock_ttl_s: float
    # How the outcome is written again while Redis is down: the tool ran, its outcome must not be lost.
    write_retry: RedisRetry
    # The idempotency key whose lock this execution holds (dropped with its outcome), once claimed.
    idem_key_held: str | None = None

    def fail(self, kind: FailureKind, message: str, *, retryable: bool = False) -> Finished:
        finished_at = self.now()
        outcome = build_failure(
            self.request,
            kind,
            message,
            attempts=self.attempt,
            retryable=retryable,
            duration_ms=(finished_at - self.started) * 1000,
            worker=self.worker,
            finished_at=finished_at,
        )
        won = self.store.finish(
            outcome,
            reply_key=self.request.reply_key,
            token=self.token,
            idempotency_lock=self._lock_key(),
            retry=self.write_retry,
        )
        return Finished(outcome, won)

    def _lock_key(self) -> str | None:
        return keys.idempotency_lock(self.idem_key_held) if self.idem_key_held is not None else None

    def succeed(self, result: Any, *, replay: bool = False) -> Finished:
        finished_at = self.now()
        try:
            record = build_success(
                self.request,
                self.tool.spec,
                result,
                attempts=self.attempt,
                duration_ms=(finished_at - self.started) * 1000,
                worker=self.worker,
                finished_at=finished_at,
                replay=replay,
            )
        except InvalidResultError as exc:
            return self.fail(FailureKind.INVALID_RESULT, f"'{self.tool.spec.name}' returned {exc}")
        idempotency = None
        if self.idem_key_held is not None and not replay:
            idempotency = (
                self.idem_key_held,
                build_idempotency_record(self.request.arguments, record.result),
            )
        won = self.store.finish(
            record.outcome,
            reply_key=self.request.reply_key,
            token=self.token,
            full_result_json=record.full_result_json,
            idempotency=idempotency,
            idempotency_lock=self._lock_key(),
            retry=self.write_retry,
        )
        return Finished(record.outcome, won)

    def release(self) -> None:
        """Drop the running guard and the idempotency lock without an outcome (a retry follows)."""

        def once(_failures: int) -> None:
            self.store.release(self.request.call_id, self.token)
            if self.idem_key_held is not None:
                self.store.release_idempotency_lock(self.idem_key_held, self.request.call_id)

        self.write_retry.call(once, "the release of a call before its retry")


def _claim_idempotency(
    run: _Run,
    idem_key: str,
    soft_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    sleep: Callable[[float], None],
    *,
    retry: RedisRetry,
) -> Decision | None:
    """None when this execution holds the key and runs the tool; else the call's end: a replay of the
    stored success, a conflict, or giving up while an identical call still runs."""
    spec, request = run.tool.spec, run.request
    give_up_at = run.started + soft_limit_s - IDEMPOTENCY_WAIT_RESERVE_S
    pause = IDEMPOTENCY_POLL_MIN_S
    try:
        while True:
            state, record = run.store.claim_idempotency(
                idem_key, call_id=request.call_id, lock_ttl_s=run.lock_ttl_s, retry=retry
            )
            if state is IdempotencyClaim.CLAIMED:
                run.idem_key_held = idem_key
                return None
            if record is not None:
                return _replay(run, json.loads(record))
            if run.now() + pause > give_up_at:
                break
            sleep(pause)
            pause = min(pause * 2, IDEMPOTENCY_POLL_MAX_S)
    except timeout_errors:
        pass  # the soft limit came first after all: give up the same way
    waited_s = round(run.now() - run.started, 1)
    return run.fail(
        FailureKind.TIMEOUT,
        f"an identical call of '{spec.name}' (same idempotency key) was still running after "
        f"{format_seconds(waited_s)} s; its result is reused once stored, so try again later",
        retryable=True,
    )


def _replay(run: _Run, record: dict[str, Any]) -> Finished:
    if record.get("args_digest") != build_args_digest(run.request.arguments):
        return run.fail(
            FailureKind.IDEMPOTENCY_CONFLICT,
            f"the idempotency key of '{run.tool.spec.name}' was already used with other arguments",
        )
    return run.succeed(record.get("result"), replay=True)


def _run_started(
    run: _Run,
    *,
    soft_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    jitter: Callable[[], float],
) -> Decision:
    spec, request = run.tool.spec, run.request
    ctx = ToolContext(
        call_id=request.call_id,
        turn_id=request.turn_id,
        attempt=run.attempt,
        idempotency_key=run.idem_key_held or request.call_id,
        context=dict(request.context),
    )
    try:
        result = run.tool.invoke(request.arguments, ctx)
    except ValidationError as exc:
        return run.fail(
            FailureKind.VALIDATION, f"invalid arguments for '{spec.name}': {describe_validation_error(exc)}"
        )
    except TransientToolError as exc:
        delay = decide_retry(run.attempt, spec, request.deadline_at, run.now(), jitter())
        if delay is not None:
            run.release()
            return RetryLater(delay, f"transient failure: {exc}")
        return run.fail(FailureKind.EXECUTION_ERROR, describe_exception(exc, run.attempt), retryable=True)
    except Exception as exc:
        if timeout_errors and isinstance(exc, timeout_errors):
            return run.fail(FailureKind.TIMEOUT, f"timed out after {format_seconds(soft_limit_s)} s")
        return run.fail(FailureKind.EXECUTION_ERROR, describe_exception(exc, run.attempt))
    return run.succeed(result)
