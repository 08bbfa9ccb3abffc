"""Executing one tool call against Redis: plain Python, no Celery (SPEC §4.3–§4.9).

`execute_call` runs in the pool child and returns a `Decision` — finished (outcome written, first writer
wins), retry later (the task publishes the retry), or skipped (another delivery owns the call). The
`handle_*` functions run in the worker's parent process when the child cannot answer for itself: hard time
limit, worker lost, revoked.

One start script per execution does the redelivery dedupe, the running guard, the attempt count and the
"started" notification in a single round trip; one pipeline writes the outcome and its companions.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError

from workers import keys
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.outcomes import (
    InvalidResultError,
    build_args_digest,
    build_idempotency_key,
    build_idempotency_record,
    build_success,
    decide_retry,
    format_seconds,
)
from workers.tools import Tool, ToolContext, TransientToolError

ATTEMPTS_TTL_S = keys.OUTCOME_TTL_S
# The running guard outlives the hard limit by this much: the parent kills the child by then at the latest.
RUNNING_MARGIN_S = 5.0
# How long a duplicate delivery waits before looking again when another execution holds the call.
DUPLICATE_RECHECK_MAX_S = 5.0

# KEYS: outcome, running, attempts, turn lease ('' when none).
# ARGV: running token, running TTL ms, attempts TTL s, inbox prefix, call id, turn id, worker, started at.
# Returns {-1, 0} when the call already has an outcome, {-2, pttl} when another execution holds it,
# else {attempt, 0} after notifying the turn's owner that the call started.
START_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return {-2, redis.call('PTTL', KEYS[2])}
end
local n = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
if KEYS[4] ~= '' then
  local owner = redis.call('GET', KEYS[4])
  if owner then
    redis.call('XADD', ARGV[4] .. owner, 'MAXLEN', '~', '100000', '*', 'kind', 'started',
               'turn', ARGV[6], 'call', ARGV[5], 'attempt', tostring(n), 'worker', ARGV[7], 'at', ARGV[8])
  end
end
return {n, 0}
"""

# KEYS: running. ARGV: token ('' deletes whatever holds it). Deletes only our own guard.
RELEASE_LUA = """
if ARGV[1] == '' or redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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
    """Nothing to do: the call already has its outcome."""

    reason: str


Decision = Finished | RetryLater | Skipped


class CallStore:
    """The Redis side of executing calls: one per process, its scripts registered once."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = client.register_script(START_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._write = client.register_script(keys.WRITE_OUTCOME_LUA)

    def start(
        self, request: ToolCallRequest, *, token: str, running_ttl_s: float, worker: str
    ) -> tuple[int, int]:
        """Run the start script: (attempt, 0), (-1, 0) already finished, (-2, pttl ms) held elsewhere."""
        lease = keys.turn_lease(request.turn_id) if request.turn_id else ""
        result = self._start(
            keys=[
                keys.outcome(request.call_id),
                keys.running(request.call_id),
                keys.attempts(request.call_id),
                lease,
            ],
            args=[
                token,
                int(running_ttl_s * 1000),
                ATTEMPTS_TTL_S,
                keys.INBOX_PREFIX,
                request.call_id,
                request.turn_id or "",
                worker,
                f"{time.time():.3f}",
            ],
        )
        return int(result[0]), int(result[1])

    def finish(
        self,
        outcome: ToolOutcome,
        *,
        reply_key: str | None,
        token: str | None,
        full_result_json: str | None = None,
        idempotency: tuple[str, str] | None = None,
    ) -> bool:
        """Write the outcome (first writer wins), the full result and idempotency record; drop the guard.

        One pipeline, one round trip. Returns True when this outcome won.
        """
        pipe = self.client.pipeline(transaction=False)
        if full_result_json is not None and outcome.full_result_key:
            pipe.set(outcome.full_result_key, full_result_json, ex=keys.FULL_RESULT_TTL_S)
        if idempotency is not None:
            pipe.set(idempotency[0], idempotency[1], ex=keys.IDEMPOTENCY_TTL_S)
        script_keys, script_args = keys.build_write_outcome_call(
            outcome.call_id, outcome.turn_id, outcome.model_dump_json(), reply_key
        )
        self._write(keys=script_keys, args=script_args, client=pipe)
        if token is not None:
            self._release(keys=[keys.running(outcome.call_id)], args=[token], client=pipe)
        results = pipe.execute()
        won_index = -2 if token is not None else -1
        return bool(results[won_index])

    def release(self, call_id: str, token: str) -> None:
        """Drop the running guard if `token` holds it ('' drops it whoever holds it)."""
        self._release(keys=[keys.running(call_id)], args=[token])

    def read_attempts(self, call_id: str) -> int:
        """How many executions of the call have started."""
        value = self.client.get(keys.attempts(call_id))
        return int(value) if value is not None else 0

    def read_outcome(self, call_id: str) -> ToolOutcome | None:
        """The call's winning outcome, if any."""
        raw = self.client.get(keys.outcome(call_id))
        return ToolOutcome.model_validate_json(raw) if raw is not None else None

    def read_idempotency(self, key: str) -> dict[str, Any] | None:
        """A stored success under an idempotency key."""
        raw = self.client.get(key)
        if raw is None:
            return None
        record: dict[str, Any] = json.loads(raw)
        return record


_stores: dict[str, CallStore] = {}
_stores_lock = threading.Lock()


def get_store(redis_url: str, **client_options: Any) -> CallStore:
    """The process's CallStore for `redis_url` (redis-py pools reconnect by themselves after a fork)."""
    with _stores_lock:
        store = _stores.get(redis_url)
        if store is None:
            store = CallStore(redis.Redis.from_url(redis_url, **client_options))
            _stores[redis_url] = store
        return store


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
) -> Decision:
    """Run one delivery of a call in the pool child and write its outcome.

    `timeout_errors` are the exceptions a soft time limit raises (Celery's SoftTimeLimitExceeded).
    """
    started = now()
    if request.deadline_at is not None and started >= request.deadline_at:
        outcome = build_failure(
            request,
            FailureKind.DEADLINE_EXCEEDED,
            "the deadline passed before the call started",
            worker=worker,
            finished_at=started,
        )
        return Finished(outcome, store.finish(outcome, reply_key=request.reply_key, token=None))
    attempt, held_ms = store.start(
        request, token=token, running_ttl_s=hard_limit_s + RUNNING_MARGIN_S, worker=worker
    )
    if attempt == -1:
        return Skipped("the call already has an outcome")
    if attempt == -2:
        return RetryLater(
            min(max(held_ms / 1000, 0.1), DUPLICATE_RECHECK_MAX_S), "another execution holds the call"
        )
    run = _Run(store, tool, request, attempt, worker, token, now, now())
    return _run_started(run, soft_limit_s=soft_limit_s, timeout_errors=timeout_errors, jitter=jitter)


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
        return Finished(
            outcome, self.store.finish(outcome, reply_key=self.request.reply_key, token=self.token)
        )

    def succeed(self, result: Any, idem_key: str | None, *, replay: bool = False) -> Finished:
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
        if idem_key is not None and not replay:
            idempotency = (idem_key, build_idempotency_record(self.request.arguments, record.result))
        won = self.store.finish(
            record.outcome,
            reply_key=self.request.reply_key,
            token=self.token,
            full_result_json=record.full_result_json,
            idempotency=idempotency,
        )
        return Finished(record.outcome, won)


def _run_started(
    run: _Run,
    *,
    soft_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    jitter: Callable[[], float],
) -> Decision:
    spec, request = run.tool.spec, run.request
    idem_key = build_idempotency_key(spec, request.arguments)
    if idem_key is not None:
        record = run.store.read_idempotency(idem_key)
        if record is not None:
            if record.get("args_digest") != build_args_digest(request.arguments):
                return run.fail(
                    FailureKind.IDEMPOTENCY_CONFLICT,
                    f"the idempotency key of '{spec.name}' was already used with other arguments",
                )
            return run.succeed(record.get("result"), idem_key, replay=True)
    ctx = ToolContext(
        call_id=request.call_id,
        turn_id=request.turn_id,
        attempt=run.attempt,
        idempotency_key=idem_key or request.call_id,
        context=dict(request.context),
    )
    try:
        result = run.tool.invoke(request.arguments, ctx)
    except ValidationError as exc:
        return run.fail(
            FailureKind.VALIDATION, f"invalid arguments for '{spec.name}': {_pydantic_messages(exc)}"
        )
    except TransientToolError as exc:
        delay = decide_retry(run.attempt, spec, request.deadline_at, run.now(), jitter())
        if delay is not None:
            run.store.release(request.call_id, run.token)
            return RetryLater(delay, f"transient failure: {exc}")
        return run.fail(FailureKind.EXECUTION_ERROR, _describe_exception(exc, run.attempt), retryable=True)
    except Exception as exc:
        if timeout_errors and isinstance(exc, timeout_errors):
            return run.fail(FailureKind.TIMEOUT, f"timed out after {format_seconds(soft_limit_s)} s")
        return run.fail(FailureKind.EXECUTION_ERROR, _describe_exception(exc, run.attempt))
    return run.succeed(result, idem_key)


def handle_hard_timeout(store: CallStore, request: ToolCallRequest, *, limit_s: float, worker: str) -> bool:
    """In the worker's parent, after it killed a child at the hard limit: write `timeout` (first wins)."""
    outcome = build_failure(
        request,
        FailureKind.TIMEOUT,
        f"timed out after {format_seconds(limit_s)} s (hard limit; the worker process was killed)",
        attempts=max(store.read_attempts(request.call_id), 1),
        duration_ms=limit_s * 1000,
        worker=worker,
        finished_at=time.time(),
    )
    return store.finish(outcome, reply_key=request.reply_key, token="")


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


def handle_revoked(store: CallStore, request: ToolCallRequest, *, expired: bool, worker: str) -> bool:
    """A revoked task (Flower, cancel) answers `cancelled`; an expired one `deadline_exceeded`."""
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
    return store.finish(outcome, reply_key=request.reply_key, token="")


def _describe_exception(exc: BaseException, attempt: int) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if attempt <= 1 else f"{text} (after {attempt} attempts)"


def _pydantic_messages(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)
