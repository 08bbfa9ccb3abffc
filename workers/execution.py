"""Executing one tool call against Redis: plain Python, no Celery (docs/design/tool-calls.md).

`execute_call` runs in the pool child and returns a `Decision` — finished (outcome written, first writer
wins), retry later (the task publishes the retry), or skipped (another delivery owns the call). When the
child cannot answer for itself, `workers.parent` answers from the worker's parent process.

The Redis steps (start script, idempotency claim, outcome write) are `workers.call_store`'s.

A hung worker (SIGSTOPped, a paused VM) cannot answer twice: each execution carries a token, the start script
makes it the call's current one (the fence, `workers.fence`), and an execution superseded meanwhile — the
orchestrator found the call lost and dispatched it again — neither starts the tool's body (checked by the
start script, and again after an idempotency wait) nor writes (checked atomically by the write).

Redis down: a call that cannot start waits a little for Redis (`START_WAIT_MAX_S`, at most half
its soft limit) and is otherwise handed back to Celery unstarted — never run blind. Once the tool has run,
its outcome is kept and written again with capped backoff until Redis is back, up to `WRITE_MARGIN_S` before
the hard limit (`workers.redis_retry`), and then handed to the spool (`workers.spool`), which the worker's
main process writes from until Redis takes it; both scripts and the write may be repeated after a reply that
was lost, so each recognises its own earlier success.

Idempotent tools take one more step: a claim script either finds the stored success (a replay)
or takes a lock on the idempotency key held by the execution (its token), so that two identical calls — or two
executions of one call, the second dispatched while the first's worker was frozen — do not both run: the
second polls until the first's success is stored (and replays it), or the first failed (and then runs
itself), or its own soft limit is near (and gives up with a `timeout` that says why). The lock outlives the
hard limit by another hard limit (`build_lock_ttl_s`), so that a redispatched execution still finds it.

Design notes: docs/design/tool-calls.md, "Idempotency"; docs/design/redis-outages.md, "Workers".
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError

from workers.call_store import CallStore, OutcomeWrite, get_store
from workers.concurrency import (
    SlotClaim,
    SlotStore,
    build_slot_claim,
    build_wait_countdown_s,
    build_wait_reason,
    get_slot_store,
)
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.fence import (
    TAKEOVER_CONFIRM_S,
    build_execution_token,
    build_worker_silence_s,
    is_takeover_due,
    parse_token,
)
from workers.outcomes import (
    build_args_digest,
    build_idempotency_key,
    decide_retry,
    describe_exception,
    describe_validation_error,
    format_seconds,
)
from workers.progress import ProgressReporter
from workers.redis_retry import RedisRetry, ignoring_unavailable, is_unavailable
from workers.run import Decision, Finished, RetryLater, Run, Skipped, finish_write
from workers.scripts import Fence, IdempotencyClaim, SlotResult, StartResult
from workers.spool import Spool
from workers.tools import Tool, ToolContext, TransientToolError

# Re-exported: the task body takes its store and the decisions from here.
__all__ = ["CallStore", "Decision", "Finished", "RetryLater", "Skipped", "execute_call", "get_store"]

logger = logging.getLogger(__name__)

# The running guard outlives the hard limit by this much: the parent kills the child by then at the latest,
# and a delivery of the same dispatch takes a dead worker's call over before then (`workers.fence`).
RUNNING_MARGIN_S = 8.0
# How long a duplicate delivery waits before looking again when another execution holds the call: short,
# so that a dead worker's call is taken over well inside the guard's margin (`workers.fence`).
DUPLICATE_RECHECK_MAX_S = 2.0
# A call waiting for an identical one polls its stored success with a doubling pause in these bounds, and
# gives up this long before its own soft limit, so that it answers with a clear message of its own.
IDEMPOTENCY_POLL_MIN_S = 0.02
IDEMPOTENCY_POLL_MAX_S = 0.25
IDEMPOTENCY_WAIT_RESERVE_S = 0.2
# Redis down before the tool ran: wait this long at most (and at most half the soft limit, so the tool keeps
# most of its time), then hand the call back to Celery. After the tool ran: keep writing the outcome until
# this long before the hard limit, when the parent may kill the child, then spool it.
START_WAIT_MAX_S = 10.0
WRITE_MARGIN_S = 1.0
# Countdown of the Celery retry of a call handed back unstarted because Redis was down.
REDIS_DOWN_RETRY_S = 1.0


def build_lock_ttl_s(hard_limit_s: float) -> float:
    """How long an execution's idempotency lock lives: its running guard's life plus another hard limit and
    margin. The orchestrator dispatches a call again once hard limit + grace passed with no outcome; that
    execution's whole wait (at most its soft limit) falls within this, so it waits for a frozen first one
    instead of running beside it. A whole worker killed (its parent too) holds the key this long."""
    return 2 * (hard_limit_s + RUNNING_MARGIN_S)


def execute_call(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    pid: int,
    soft_limit_s: float,
    hard_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...] = (),
    spool: Spool | None = None,
    now: Callable[[], float] = time.time,
    jitter: Callable[[], float] = random.random,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """Run one delivery of a call in the pool child and write its outcome.

    `timeout_errors` are the exceptions a soft time limit raises (Celery's SoftTimeLimitExceeded). `pid` is
    the pool process's: with `worker` and the dispatch attempt it starts this execution's token.
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
        write = OutcomeWrite.of(outcome, Fence(request.attempt, ""), reply_key=request.reply_key)
        return finish_write(store, write, outcome, write_retry, spool)
    token = build_execution_token(request.attempt, worker, pid)
    start_wait_s = min(START_WAIT_MAX_S, soft_limit_s / 2, hard_limit_s - WRITE_MARGIN_S)
    start_retry = RedisRetry(started + start_wait_s, now, sleep)
    limits = _Limits(soft_limit_s, hard_limit_s, timeout_errors)

    def start() -> Decision:
        return _start(
            store,
            tool,
            request,
            token,
            limits,
            worker=worker,
            start_retry=start_retry,
            write_retry=write_retry,
            spool=spool,
            now=now,
            sleep=sleep,
            jitter=jitter,
        )

    claim = build_slot_claim(tool.spec, request.tenant)
    if claim is None:
        return start()
    # The slots come before the start script: a call that waits for one has not started (docs/design/
    # tool-calls.md, "Concurrency slots"); they live as long as the running guard, and go back however the
    # execution ends.
    slots = get_slot_store(store.client)
    try:
        taken, held = slots.acquire(claim, token, ttl_s=limits.running_ttl_s, retry=start_retry)
    except limits.refusals as exc:
        return _hand_back(store, request, token, None, exc)
    if taken is not SlotResult.ACQUIRED:
        return _wait_for_slot(slots, tool, request, claim, result=taken, held=held, now=now, jitter=jitter)
    try:
        return start()
    finally:
        _give_back_slots(slots, claim, token, timeout_errors)


@dataclass(frozen=True)
class _Limits:
    soft_limit_s: float
    hard_limit_s: float
    timeout_errors: tuple[type[BaseException], ...]

    @property
    def running_ttl_s(self) -> float:
        return self.hard_limit_s + RUNNING_MARGIN_S

    @property
    def refusals(self) -> tuple[type[BaseException], ...]:
        # What keeps an execution from starting: Redis, or the soft limit arriving first.
        return (redis.RedisError, *self.timeout_errors)


def _start(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    token: str,
    limits: _Limits,
    *,
    worker: str,
    start_retry: RedisRetry,
    write_retry: RedisRetry,
    spool: Spool | None,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    jitter: Callable[[], float],
) -> Decision:
    """The execution from its start script on: started, taken over, or not started at all."""
    soft_limit_s, timeout_errors = limits.soft_limit_s, limits.timeout_errors
    running_ttl_s, refusals = limits.running_ttl_s, limits.refusals
    try:
        attempt, value = store.start(
            request, token=token, running_ttl_s=running_ttl_s, worker=worker, retry=start_retry
        )
    except refusals as exc:
        return _hand_back(store, request, token, None, exc)
    if attempt == StartResult.HELD and _take_over(store, tool, request, worker=worker, sleep=sleep):
        try:
            attempt, value = store.start(
                request, token=token, running_ttl_s=running_ttl_s, worker=worker, retry=start_retry
            )
        except refusals as exc:
            return _hand_back(store, request, token, None, exc)
    if attempt < 0:
        return _not_started(store, request, StartResult(attempt), value)
    run = Run(store, tool, request, attempt, worker, token, now, now(), write_retry, spool)
    idem_key = build_idempotency_key(tool.spec, request.arguments, request.tenant)
    if idem_key is None:
        # The start script made this execution the current one a moment ago, atomically: looking again
        # would cost a round trip per call and prove nothing more (the outcome's write is fenced anyway).
        return _run_started(run, soft_limit_s=soft_limit_s, timeout_errors=timeout_errors, jitter=jitter)
    try:
        claimed = _claim_idempotency(
            run,
            idem_key,
            soft_limit_s=soft_limit_s,
            lock_ttl_s=build_lock_ttl_s(limits.hard_limit_s),
            timeout_errors=timeout_errors,
            sleep=sleep,
            retry=start_retry,
        )
    except redis.RedisError as exc:
        return _hand_back(store, request, token, idem_key, exc)
    if claimed is not None:
        return claimed
    # The claim may have waited for an identical call, long enough for the call to be dispatched again.
    try:
        current = store.is_current(request.call_id, request.turn_id, token, retry=start_retry)
    except redis.RedisError as exc:
        return _hand_back(store, request, token, run.idem_key_held, exc)
    if not current:
        run.release()
        logger.warning(
            "%s: superseded by a later execution before its body started; not run", request.call_id
        )
        return Skipped("superseded by a later execution before the tool started")
    return _run_started(run, soft_limit_s=soft_limit_s, timeout_errors=timeout_errors, jitter=jitter)


def _wait_for_slot(
    slots: SlotStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    claim: SlotClaim,
    *,
    result: SlotResult,
    held: int,
    now: Callable[[], float],
    jitter: Callable[[], float],
) -> RetryLater:
    """No slot free: the call is handed back to Celery, unstarted, to look again shortly (never past the
    deadline by much: the retry then answers `deadline_exceeded`); its turn is told once."""
    reason = build_wait_reason(tool.spec.name, claim, result, held)
    try:
        slots.tell_waiting(request, claim, result, held)
    except redis.RedisError as exc:
        # The event is for people watching; the wait itself goes on without it.
        logger.warning("%s: no tool_waiting_for_slot event: %r", request.call_id, exc)
    current = now()
    waited_s = current - request.dispatched_at if request.dispatched_at is not None else 0.0
    countdown_s = build_wait_countdown_s(waited_s, jitter())
    if request.deadline_at is not None:
        countdown_s = min(countdown_s, max(request.deadline_at - current, 0.0) + 0.05)
    # Celery logs each retry with its reason (and Flower shows it): only debugging needs more.
    logger.debug("%s: %s; looking again in %.2f s", request.call_id, reason, countdown_s)
    return RetryLater(countdown_s, reason)


def _give_back_slots(
    slots: SlotStore, claim: SlotClaim, token: str, timeout_errors: tuple[type[BaseException], ...]
) -> None:
    # Never fails the call, whose outcome is written by now: a slot Redis would not take back expires.
    refusals: tuple[type[BaseException], ...] = (redis.RedisError, *timeout_errors)
    try:
        slots.release(claim.keys, token)
    except refusals as exc:
        logger.warning("slots of %s not given back (they expire): %r", token, exc)


def _not_started(store: CallStore, request: ToolCallRequest, result: StartResult, value: int) -> Decision:
    """The delivery runs nothing: the call has its outcome, another execution holds it, a later dispatch
    superseded it, or its turn is gone."""
    match result:
        case StartResult.FINISHED:
            return Skipped("the call already has an outcome", _read_outcome(store, request))
        case StartResult.HELD:
            countdown_s = min(max(value / 1000, 0.1), DUPLICATE_RECHECK_MAX_S)
            return RetryLater(countdown_s, "another execution holds the call")
        case StartResult.SUPERSEDED:
            reason = f"dispatch attempt {request.attempt} superseded by attempt {value}"
        case _:
            reason = f"its turn {request.turn_id} no longer exists"
    logger.warning("%s: not run: %s", request.call_id, reason)
    return Skipped(reason)


def _take_over(
    store: CallStore,
    tool: Tool[Any, Any],
    request: ToolCallRequest,
    *,
    worker: str,
    sleep: Callable[[float], None],
) -> bool:
    """Drop the running guard, and the idempotency lock, of a dead worker's execution of this same dispatch
    (`workers.fence.is_takeover_due`, confirmed after `TAKEOVER_CONFIRM_S`); True when dropped, and this
    delivery starts in its place. Any Redis error: not taken over (the delivery waits, as it would have)."""
    try:
        holder = store.read_holder(request.call_id, request.turn_id)
        if holder is None:
            return False
        silence_s = build_worker_silence_s(store.read_worker_pttl_ms(_holder_worker(holder)))
        if not is_takeover_due(holder, request.attempt, worker, silence_s):
            return False
        sleep(TAKEOVER_CONFIRM_S)
        silence_s = build_worker_silence_s(store.read_worker_pttl_ms(_holder_worker(holder)))
        if not is_takeover_due(holder, request.attempt, worker, silence_s):
            return False
        idem_key = build_idempotency_key(tool.spec, request.arguments, request.tenant)
        # Exactly that token: a guard or lock another execution took meanwhile stays its own.
        store.release(request.call_id, request.turn_id, holder)
        if idem_key is not None:
            store.release_idempotency_lock(idem_key, holder)
    except redis.RedisError:
        return False
    logger.warning(
        "%s: taking over from %s: its worker has not been heard from for %.0f s (dead, or cut off)",
        request.call_id,
        holder,
        silence_s,
    )
    return True


def _holder_worker(holder: str) -> str:
    parsed = parse_token(holder)
    return parsed[1] if parsed is not None else ""


def _read_outcome(store: CallStore, request: ToolCallRequest) -> ToolOutcome | None:
    # Only for how the task reports itself: Redis gone again now must not fail a call that has its outcome.
    with ignoring_unavailable():
        return store.read_outcome(request.call_id, request.turn_id)
    return None


def _hand_back(
    store: CallStore, request: ToolCallRequest, token: str, idem_key: str | None, exc: BaseException
) -> RetryLater:
    """Redis stayed unavailable before the tool ran: Celery retries the call later, unstarted.

    The running guard and idempotency lock go if Redis lets them; otherwise they expire, and the retry waits
    for them. A Redis error that is not an outage is a bug: it propagates."""
    if isinstance(exc, redis.RedisError) and not is_unavailable(exc):
        raise exc
    with ignoring_unavailable():
        store.release(request.call_id, request.turn_id, token)
        if idem_key is not None:
            store.release_idempotency_lock(idem_key, token)
    reason = f"redis unavailable before the call started: {exc!r}"
    logger.warning("%s: %s; Celery retries it in %g s", request.call_id, reason, REDIS_DOWN_RETRY_S)
    return RetryLater(REDIS_DOWN_RETRY_S, reason)


def _claim_idempotency(
    run: Run,
    idem_key: str,
    *,
    soft_limit_s: float,
    lock_ttl_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    sleep: Callable[[float], None],
    retry: RedisRetry,
) -> Decision | None:
    """None when this execution holds the key and runs the tool; else the call's end: a replay of the
    stored success, a conflict, or giving up while an identical call (or execution) still runs."""
    spec = run.tool.spec
    give_up_at = run.started + soft_limit_s - IDEMPOTENCY_WAIT_RESERVE_S
    pause = IDEMPOTENCY_POLL_MIN_S
    try:
        while True:
            state, record = run.store.claim_idempotency(
                idem_key, holder=run.token, lock_ttl_s=lock_ttl_s, retry=retry
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


def _replay(run: Run, record: dict[str, Any]) -> Decision:
    if record.get("args_digest") != build_args_digest(run.request.arguments):
        return run.fail(
            FailureKind.IDEMPOTENCY_CONFLICT,
            f"the idempotency key of '{run.tool.spec.name}' was already used with other arguments",
        )
    return run.succeed(record.get("result"), replay=True)


def _run_started(
    run: Run,
    *,
    soft_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    jitter: Callable[[], float],
) -> Decision:
    spec, request = run.tool.spec, run.request
    sink = run.store.progress
    reporter = sink.reporter(request, token=run.token, passthrough=timeout_errors) if sink else None
    ctx = ToolContext(
        call_id=request.call_id,
        turn_id=request.turn_id,
        attempt=run.attempt,
        idempotency_key=run.idem_key_held or request.call_id,
        context=dict(request.context),
        tenant=request.tenant,
        _progress=reporter,
    )
    try:
        result = _invoke(run.tool, request.arguments, ctx, reporter)
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


def _invoke(
    tool: Tool[Any, Any], arguments: dict[str, Any], ctx: ToolContext, reporter: ProgressReporter | None
) -> Any:
    # The tool's last progress report goes out before its outcome is written, however it ends: its
    # `tool_progress` events come before its `tool_finished`, and none after.
    try:
        return tool.invoke(arguments, ctx)
    finally:
        if reporter is not None:
            reporter.close()
