"""One started execution of a call in the pool child, and how its end is decided and written.

`Decision` is what `workers.execution.execute_call` returns to the task: `Finished` (the outcome written,
first writer wins, or spooled), `RetryLater` (the task publishes the retry) or `Skipped` (another delivery
or a later execution owns the call, or its turn is gone). `Run` writes a started execution's outcome with
its companions — fenced by the execution's token, retried while Redis is unavailable, spooled past the bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from workers import keys
from workers.call_store import CallStore, OutcomeWrite
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.errors import InvalidResultError
from workers.fence import build_execution_fence
from workers.outcomes import build_idempotency_record, build_success
from workers.redis_errors import is_bug
from workers.redis_retry import RedisRetry
from workers.scripts import Fence, WriteResult
from workers.spool import Spool
from workers.tools import Tool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    """The call ended here; `won` is False when another writer's outcome was already there, `spooled` when
    Redis refused the write past the bound and the outcome waits in the spool."""

    outcome: ToolOutcome
    won: bool
    spooled: bool = False


@dataclass(frozen=True)
class RetryLater:
    """Publish the call again after `countdown_s` (a transient failure, or a duplicate delivery)."""

    countdown_s: float
    reason: str


@dataclass(frozen=True)
class Skipped:
    """Nothing (more) to do: the call already has its outcome (`outcome`, None when it could not be read),
    a later execution superseded this one, or its turn is gone.

    A redelivery of a call answered `worker_lost`, say: the task reports that outcome, not a success.
    """

    reason: str
    outcome: ToolOutcome | None = None


Decision = Finished | RetryLater | Skipped


def finish_write(
    store: CallStore, write: OutcomeWrite, outcome: ToolOutcome, retry: RedisRetry, spool: Spool | None
) -> Decision:
    """Write an outcome; when Redis refuses it past the retry's bound, or refuses this worker access, hand it
    to the spool: only a bug in the write itself (`is_bug`) is raised."""
    try:
        result = store.finish(write, retry=retry)
    except redis.RedisError as exc:
        if spool is None or is_bug(exc):
            raise
        spool.put(write)
        return Finished(outcome, won=False, spooled=True)
    if result is WriteResult.FENCED:
        logger.warning("%s: outcome not written: a later execution of the call answers it", outcome.call_id)
        return Skipped("superseded by a later execution of the call; its outcome was not written")
    return Finished(outcome, result is WriteResult.WON)


@dataclass
class Run:
    """One started execution: what its outcome needs, and how to write it."""

    store: CallStore
    tool: Tool[Any, Any]
    request: ToolCallRequest
    attempt: int
    worker: str
    token: str
    now: Callable[[], float]
    started: float
    # How the outcome is written again while Redis is down: the tool ran, its outcome must not be lost.
    write_retry: RedisRetry
    spool: Spool | None
    # The idempotency key whose lock this execution holds (dropped with its outcome), once claimed.
    idem_key_held: str | None = None

    @property
    def fence(self) -> Fence:
        return build_execution_fence(self.request.attempt, self.token)

    def fail(self, kind: FailureKind, message: str, *, retryable: bool = False) -> Decision:
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
        return self._write(outcome)

    def _write(self, outcome: ToolOutcome, **companions: str | None) -> Decision:
        lock = keys.idempotency_lock(self.idem_key_held) if self.idem_key_held is not None else None
        write = OutcomeWrite.of(
            outcome,
            self.fence,
            reply_key=self.request.reply_key,
            holder=self.token,
            idempotency_lock=lock,
            **companions,
        )
        return finish_write(self.store, write, outcome, self.write_retry, self.spool)

    def succeed(self, result: Any, *, replay: bool = False) -> Decision:
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
        stores_record = self.idem_key_held is not None and not replay
        return self._write(
            record.outcome,
            full_result_key=record.outcome.full_result_key,
            full_result_json=record.full_result_json,
            idempotency_key=self.idem_key_held if stores_record else None,
            idempotency_record=(
                build_idempotency_record(self.request.arguments, record.result) if stores_record else None
            ),
        )

    def release(self) -> None:
        """Drop the running guard and the idempotency lock without an outcome (a retry follows)."""

        def once(_failures: int) -> None:
            self.store.release(self.request.call_id, self.request.turn_id, self.token)
            if self.idem_key_held is not None:
                self.store.release_idempotency_lock(self.idem_key_held, self.token)

        self.write_retry.call(once, "the release of a call before its retry")
