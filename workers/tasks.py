"""The one thin Celery task that executes a tool call, and the worker-parent hooks around it.

The task body builds the `ToolCallRequest` from its kwargs and hands it to `workers.execution`; everything
Celery-specific stays here:

- in the pool child: soft time limit (`SoftTimeLimitExceeded`), retries (`Task.retry` with backoff);
- in the worker's parent (`ToolRequest`): the hard time limit (the parent killed the child), a lost child
  (retried with backoff or answered `worker_lost`), and revocation (`cancelled` / `deadline_exceeded`), each
  naming the pool process that ran the delivery so that its answer is fenced (`workers.fence`);
- in the worker's main process: the spool drainer (`workers.spool`), started by `register_worker_signals`.

How a task ends tells Flower how the call ended; the outcome in Redis is written first and stays
the record, the orchestrator never reads Celery states:

    SUCCESS   the call's outcome is a success; or nothing was run or written: a later execution superseded
              this one, or the call's turn is gone (logged in one line); or the outcome waits in the spool
    FAILURE   `ToolCallFailed("<kind>: <message>")` after a failure outcome (this run's, or the one a
              redelivered call already has: `worker_lost` answered by the parent, say); `TimeLimitExceeded`
              after the hard limit killed the child (the parent wrote `timeout`)
    RETRY     `Task.retry` with `ToolCallRetried(<reason>)`, until a worker takes the retry message: then
              RECEIVED (with its ETA and retry count), STARTED when it runs again
    REVOKED   revoked or expired (`cancelled` / `deadline_exceeded` written by the parent)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from typing import Any, NoReturn

import redis
from billiard.einfo import (  # type: ignore[attr-defined]  # celery-types lacks ExceptionWithTraceback
    ExceptionInfo,
    ExceptionWithTraceback,
)
from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery import Celery, Task, signals
from celery.exceptions import Reject
from celery.worker.request import Request
from celery.worker.state import task_ready

from workers.acks import ensure_acked
from workers.contract import ToolCallRequest, ToolOutcome, build_task_name, build_task_reprs
from workers.errors import ToolCallFailed, ToolCallRetried
from workers.execution import (
    WRITE_MARGIN_S,
    CallStore,
    Finished,
    RetryLater,
    Skipped,
    execute_call,
    get_store,
)
from workers.outcomes import build_idempotency_key
from workers.parent import handle_hard_timeout, handle_revoked, handle_worker_lost
from workers.redis_retry import build_backoff_s, is_unavailable
from workers.settings import WorkerSettings, get_worker_settings
from workers.spool import Spool, SpoolDrainer, build_spool_dir
from workers.tools import Tool, registry
from workers.tracing import register_worker_tracing, trace_tool_call

logger = logging.getLogger(__name__)


def _settings(app: Celery) -> WorkerSettings:
    settings: WorkerSettings | None = getattr(app, "settings", None)
    return settings if settings is not None else get_worker_settings()


def _store(task: Task[Any, Any]) -> CallStore:
    """The process's call store, on the Redis (and TLS policy) of the task's app settings."""
    settings = _settings(task.app)
    return get_store(settings.redis_url, settings.redis_ssl_cert_reqs)


def _spool(task: Task[Any, Any]) -> Spool:
    """The worker's outcome spool (`workers.spool`) for the Redis of the task's app settings."""
    settings = _settings(task.app)
    return _spool_of(settings.redis_url, settings.spool_dir)


@functools.lru_cache(maxsize=8)
def _spool_of(redis_url: str, spool_dir: str | None) -> Spool:
    # Once per process: naming the folder (URL parsing, a digest, paths) weighed a tenth of a call's CPU.
    return Spool(build_spool_dir(redis_url, spool_dir))


def _idempotency_key(request: ToolCallRequest) -> str | None:
    """The idempotency key a killed child may hold the lock of (None for a tool that is not idempotent)."""
    tool = registry.get(request.tool)
    return build_idempotency_key(tool.spec, request.arguments, request.tenant) if tool is not None else None


def _parse_request(kwargs: dict[str, Any]) -> ToolCallRequest | None:
    try:
        return ToolCallRequest.model_validate(kwargs)
    except Exception:  # a foreign message on our queue must not crash the parent's handlers
        logger.exception("tool task with kwargs that are not a ToolCallRequest")
        return None


class ToolRequest(Request):
    """The worker parent's view of one tool task: answers for a child that can no longer answer."""

    # The exception a `task-failed` event names when Celery would name billiard's wrapper of it instead.
    _failure: BaseException | None = None
    # Celery's (untyped in celery-types): the errors its ack and reject log instead of raising.
    _connection_errors: tuple[type[BaseException], ...]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # kombu logs an ack or reject that fails for these, instead of letting the error stop the worker: a
        # Redis out of memory refuses kombu's ack transaction (`workers.acks`).
        self._connection_errors = (*self._connection_errors, redis.RedisError)

    def acknowledge(self) -> None:
        """Celery's ack, tried again later if Redis refused it (`workers.acks`)."""
        asked = not self.acknowledged
        super().acknowledge()
        if asked:
            ensure_acked(self.message)

    def reject(self, requeue: bool = False) -> None:
        """Celery's reject, tried again later if Redis refused it (`workers.acks`)."""
        asked = not self.acknowledged
        super().reject(requeue=requeue)
        if asked:
            ensure_acked(self.message, requeue=requeue)

    def send_event(self, type: str, **fields: Any) -> None:
        """Celery's task event, with a failure named as itself: Celery names a hard time limit by billiard's
        wrapper, which Flower shows as `ExceptionWithTraceback()`."""
        if type == "task-failed" and self._failure is not None:
            fields["exception"] = repr(self._failure)
        super().send_event(type, **fields)

    def _pool_pid(self) -> int | None:
        """The pool process that ran this delivery (None before it was accepted)."""
        return int(self.worker_pid) if self.worker_pid else None

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """After the hard limit killed the child, write the call's `timeout` outcome (first writer wins)."""
        if not soft:
            self._failure = TimeLimitExceeded(timeout)
        super().on_timeout(soft, timeout)
        if soft:
            return
        request = _parse_request(dict(self.kwargs))
        if request is not None:
            handle_hard_timeout(
                _store(self.task),
                request,
                limit_s=float(timeout),
                worker=self.hostname,
                pid=self._pool_pid(),
                idempotency_key=_idempotency_key(request),
                spool=_spool(self.task),
            )

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> None:
        """Celery's announcement of a revoked delivery (discarded unstarted, expired, or terminated while it
        ran), then our answer: `cancelled` or `deadline_exceeded`, fenced by the pool process that ran it (the
        revoke of a superseded dispatch answers nothing). Celery's `task_revoked` signal gives no process id,
        hence this hook rather than the signal."""
        super()._announce_revoked(reason, terminated, signum, expired)  # type: ignore[misc]
        request = _parse_request(dict(self.kwargs))
        if request is not None:
            handle_revoked(
                _store(self.task),
                request,
                expired=bool(expired),
                worker=self.hostname,
                pid=self._pool_pid() if self.time_start else None,
                idempotency_key=_idempotency_key(request),
                spool=_spool(self.task),
            )

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        """A lost child: retry after a backoff (our own delayed message), or answer `worker_lost`.

        Any other failure is Celery's to report, named as itself (`send_event`).
        """
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc_info.exception, ExceptionWithTraceback):
            self._failure = exc
        if isinstance(exc, WorkerLostError) and self._retry_lost(exc_info):
            return
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _retry_lost(self, exc_info: ExceptionInfo) -> bool:
        request = _parse_request(dict(self.kwargs))
        tool = registry.get(request.tool) if request is not None else None
        if request is None or tool is None:
            return False
        delay = handle_worker_lost(
            _store(self.task),
            tool,
            request,
            worker=self.hostname,
            pid=self._pool_pid(),
            spool=_spool(self.task),
        )
        if delay is None:
            return False  # answered worker_lost; Celery requeues and the redelivery is skipped
        argsrepr, kwargsrepr = build_task_reprs(request)
        # Celery's own Context of this delivery, as its `retry_on_worker_lost` uses it (headers, expires,
        # limits and routing carried over to the retry).
        context: Any = self._context  # type: ignore[attr-defined]  # a cached_property of Request
        try:
            self.task.signature_from_request(
                context,
                countdown=delay,
                retries=context.retries + 1,
                argsrepr=argsrepr,
                kwargsrepr=kwargsrepr,
            ).apply_async()
        except Exception:
            logger.exception("could not publish the retry of %s; requeueing it instead", self.id)
            return False
        task_ready(self)
        if self.task.acks_late:
            self.acknowledge()
        self.send_event("task-retried", exception=repr(exc_info.exception), traceback=exc_info.traceback)
        return True


class ToolTask(Task):  # type: ignore[type-arg]  # the body's signature is **kwargs: Any -> None
    """Base class of every `tool.<name>` task."""

    Request = "workers.tasks:ToolRequest"
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    # Attempts are counted in Redis against the tool's own `retries`; Celery must not cap them too.
    max_retries = None
    # ToolCallFailed only reports an outcome already written: Celery logs it without a traceback, and a
    # failed or timed-out task is acked (Celery's default, spelled out) — never redelivered to run again.
    throws = (ToolCallFailed,)
    acks_on_failure = True
    acks_on_timeout = True
    typing = False


def _build_body(tool: Tool[Any, Any]) -> Any:
    def run_tool_call(self: ToolTask, **kwargs: Any) -> None:
        request = ToolCallRequest.model_validate(kwargs)
        spec = tool.spec
        hard, soft = self.request.timelimit or (None, None)
        hard_limit_s = float(hard or spec.time_limit_s)
        give_up_at = time.time() + hard_limit_s - WRITE_MARGIN_S
        # The span ends before a retry is published: each delivery is its own span of the turn's trace.
        with trace_tool_call(self.request, request, spec, retries=self.request.retries or 0) as traced:
            decision = execute_call(
                _store(self),
                tool,
                request,
                worker=self.request.hostname or "",
                pid=os.getpid(),
                soft_limit_s=float(soft or spec.soft_time_limit_s),
                hard_limit_s=hard_limit_s,
                timeout_errors=(SoftTimeLimitExceeded,),
                spool=_spool(self),
            )
            traced.record(decision)
        match decision:
            case RetryLater(countdown_s=countdown, reason=reason):
                _publish_retry(self, request, countdown, reason, give_up_at)
            case Finished(outcome=outcome) | Skipped(outcome=ToolOutcome() as outcome) if not outcome.ok:
                raise build_task_failure(outcome)
            case Finished() | Skipped():
                return None

    run_tool_call.__name__ = f"tool_{tool.name}".replace(".", "_").replace("-", "_")
    run_tool_call.__doc__ = tool.spec.description
    return run_tool_call


def _publish_retry(
    task: ToolTask, request: ToolCallRequest, countdown_s: float, reason: str, give_up_at: float
) -> NoReturn:
    """Celery's retry (it raises `Retry` once the retry message is published), published again while Redis
    refuses it (out of memory, say): Celery would otherwise reject the delivery unrequeued, dropping the call.
    Past `give_up_at` (the hard limit is near) the delivery is requeued instead, or — Redis refusing that
    too — left unacked for the broker to restore."""
    argsrepr, kwargsrepr = build_task_reprs(request)
    reprs: dict[str, Any] = {"argsrepr": argsrepr, "kwargsrepr": kwargsrepr}
    failures = 0
    while True:
        try:
            raise task.retry(exc=ToolCallRetried(reason), countdown=countdown_s, **reprs)
        except Reject as refused:
            cause = refused.args[0] if refused.args else None
            # kombu wraps the Redis error; `is_unavailable` looks behind the wrapper.
            if not isinstance(cause, Exception) or not is_unavailable(cause):
                raise
        failures += 1
        pause = build_backoff_s(failures)
        if time.time() + pause > give_up_at:
            logger.error("%s: could not publish its retry: %r; requeued", request.call_id, cause)
            raise Reject(cause, requeue=True) from cause
        if failures == 1:
            logger.warning("%s: publishing its retry, redis refuses: %r", request.call_id, cause)
        with contextlib.suppress(SoftTimeLimitExceeded):
            time.sleep(pause)


def build_task_failure(outcome: ToolOutcome) -> ToolCallFailed:
    """What a task whose call ended in a failure outcome raises: Flower's FAILURE, "<kind>: <message>"."""
    kind = outcome.failure_kind.value if outcome.failure_kind is not None else "failed"
    return ToolCallFailed(kind, outcome.error or outcome.content)


def register_tool_task(app: Celery, tool: Tool[Any, Any]) -> Task[Any, Any]:
    """Register the `tool.<name>` task of `tool` on `app` with the tool's queue and default time limits."""
    spec = tool.spec
    options: dict[str, Any] = {
        "name": build_task_name(spec.name),
        "bind": True,
        "base": ToolTask,
        "queue": spec.queue,
        # Defaults for a message that carries none; dispatch sends the per-call limits.
        "soft_time_limit": spec.soft_time_limit_s,
        "time_limit": spec.time_limit_s,
    }
    task: Task[Any, Any] = app.task(**options)(_build_body(tool))
    return task


def register_worker_signals(app: Celery) -> None:
    """Start the spool drainer (and heartbeat) in the worker's main process once it is ready; stop it at
    shutdown.

    (A revoked tool task is answered by `ToolRequest._announce_revoked`.)"""
    drainers: list[SpoolDrainer] = []

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        settings = _settings(app)
        spool = Spool(build_spool_dir(settings.redis_url, settings.spool_dir))
        drainer = SpoolDrainer(
            spool,
            lambda: get_store(settings.redis_url, settings.redis_ssl_cert_reqs),
            worker_id=str(sender.hostname),  # the heartbeat of the worker a call's start names
        )
        drainer.start()
        drainers.append(drainer)

    def on_shutdown(**_: Any) -> None:
        while drainers:
            drainers.pop().stop()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
    register_worker_tracing(_settings(app).trace_content)
