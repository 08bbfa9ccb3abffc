"""Executing one tool call against Redis: plain Python, no Celery (SPEC §4.3–§4.9).

`execute_call` runs in the pool child and returns a `Decision` — finished (outcome written, first writer
wins), retry later (the task publishes the retry), or skipped (another delivery owns the call). When the
child cannot answer for itself, `workers.parent` answers from the worker's parent process.

One start script per execution does the redelivery dedupe, the running guard, the attempt count and the
"started" notification in a single round trip; one pipeline writes the outcome and its companions.

Idempotent tools (SPEC §4.8) take one more step: a claim script either finds the stored success (a replay)
or takes a short lock on the idempotency key, so that two identical calls running at the same moment do not
both run — the second polls until the first's success is stored (and replays it), or the first failed (and
then runs itself), or its own soft limit is near (and gives up with a `timeout` that says why).
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
    describe_exception,
    describe_validation_error,
    format_seconds,
)
from workers.tools import Tool, ToolContext, TransientToolError

ATTEMPTS_TTL_S = keys.OUTCOME_TTL_S
# The running guard outlives the hard limit by this much: the parent kills the child by then at the latest.
RUNNING_MARGIN_S = 5.0
# How long a duplicate delivery waits before looking again when another execution holds the call.
DUPLICATE_RECHECK_MAX_S = 5.0
# A call waiting for an identical one polls its stored success with a doubling pause in these bounds, and
# gives up this long before its own soft limit, so that it answers with a clear message of its own.
IDEMPOTENCY_POLL_MIN_S = 0.02
IDEMPOTENCY_POLL_MAX_S = 0.25
IDEMPOTENCY_WAIT_RESERVE_S = 0.2

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

# KEYS: idempotency record, its lock. ARGV: call id (the lock's holder), lock TTL ms.
# Returns {1, record} for a stored success, {0, ''} when this call holds the lock (now, or already: a
# redelivery of the same call), {2, pttl} when another call holds it.
CLAIM_IDEMPOTENCY_LUA = """
local record = redis.call('GET', KEYS[1])
if record then return {1, record} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return {2, tostring(redis.call('PTTL', KEYS[2]))} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
return {0, ''}
"""

# KEYS: running guard or idempotency lock. ARGV: token ('' deletes whatever holds it). Deletes only our own.
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
        self._claim = client.register_script(CLAIM_IDEMPOTENCY_LUA)
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
        idempotency_lock: str | None = None,
    ) -> bool:
        """Write the outcome (first writer wins), the full result and idempotency record; drop the guard
        and the call's idempotency lock.

        One pipeline, one round trip. Returns True when this outcome won. The stored success is set before
        the lock goes, so a waiting identical call always finds one or the other.
        """
        pipe = self.client.pipeline(transaction=False)
        if full_result_json is not None and outcome.full_result_key:
            pipe.set(outcome.full_result_key, full_result_json, ex=keys.FULL_RESULT_TTL_S)
        if idempotency is not None:
            pipe.set(idempotency[0], idempotency[1], ex=keys.IDEMPOTENCY_TTL_S)
        script_keys, script_args = keys.build_write_outcome_call(
            outcome.call_id, outcome.turn_id, outcome.model_dump_json(), reply_key
        )
        won_index = len(pipe)
        self._write(keys=script_keys, args=script_args, client=pipe)
        if token is not None:
            self._release(keys=[keys.running(outcome.call_id)], args=[token], client=pipe)
        if idempotency_lock is not None:
            self._release(keys=[idempotency_lock], args=[outcome.call_id], client=pipe)
        results = pipe.execute()
        return bool(results[won_index])

    def claim_idempotency(self, key: str, *, call_id: str, lock_ttl_s: float) -> tuple[int, str | None]:
        """(1, stored success JSON); (0, None): `call_id` holds the key's lock; (2, None): another does."""
        state, value = self._claim(
            keys=[key, keys.idempotency_lock(key)], args=[call_id, int(lock_ttl_s * 1000)]
        )
        record = value.decode("utf-8") if isinstance(value, bytes) else value
        return int(state), (record if int(state) == 1 else None)

    def release_idempotency_lock(self, key: str, call_id: str) -> None:
        """Drop the lock on an idempotency key if `call_id` holds it."""
        self._release(keys=[keys.idempotency_lock(key)], args=[call_id])

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
    sleep: Callable[[float], None] = time.sleep,
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
    running_ttl_s = hard_limit_s + RUNNING_MARGIN_S
    attempt, held_ms = store.start(request, token=token, running_ttl_s=running_ttl_s, worker=worker)
    if attempt == -1:
        return Skipped("the call already has an outcome")
    if attempt == -2:
        return RetryLater(
            min(max(held_ms / 1000, 0.1), DUPLICATE_RECHECK_MAX_S), "another execution holds the call"
        )
    run = _Run(store, tool, request, attempt, worker, token, now, now(), running_ttl_s)
    idem_key = build_idempotency_key(tool.spec, request.arguments)
    if idem_key is not None:
        claimed = _claim_idempotency(run, idem_key, soft_limit_s, timeout_errors, sleep)
        if claimed is not None:
            return claimed
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
    lock_ttl_s: float
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
        )
        return Finished(record.outcome, won)

    def release(self) -> None:
        """Drop the running guard and the idempotency lock without an outcome (a retry follows)."""
        self.store.release(self.request.call_id, self.token)
        if self.idem_key_held is not None:
            self.store.release_idempotency_lock(self.idem_key_held, self.request.call_id)


def _claim_idempotency(
    run: _Run,
    idem_key: str,
    soft_limit_s: float,
    timeout_errors: tuple[type[BaseException], ...],
    sleep: Callable[[float], None],
) -> Decision | None:
    """None when this execution holds the key and runs the tool; else the call's end: a replay of the
    stored success, a conflict, or giving up while an identical call still runs."""
    spec, request = run.tool.spec, run.request
    give_up_at = run.started + soft_limit_s - IDEMPOTENCY_WAIT_RESERVE_S
    pause = IDEMPOTENCY_POLL_MIN_S
    try:
        while True:
            state, record = run.store.claim_idempotency(
                idem_key, call_id=request.call_id, lock_ttl_s=run.lock_ttl_s
            )
            if state == 0:
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
