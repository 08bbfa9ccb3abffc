"""Publishing tool calls as Celery tasks, from the orchestrator's side.

`build_send_options` is pure: the task name, queue, id, per-call time limits (`build_limits`) capped to end
just past the turn's deadline (so that the deadline answers first), `expires` at that deadline (a call still
queued then never starts), Flower's redacted `argsrepr`/`kwargsrepr`, and headers with the turn id and call
id. `Publisher` is what the orchestrator process publishes and revokes through: batched publishes retried
with backoff (for want of Redis, until they go out), batched revocations. A batch's messages are
`send_task`'s, built with Celery's protocol without `send_task`'s per-message overhead (`task_messages`);
when the broker is the state Redis they are written by the orchestrator's own client from the event loop,
as the commands kombu would run (`task_wire`), else sent on one kombu producer in a thread.
`dispatch_call` / `revoke_call` publish (through `send_task`) or revoke one call directly (short blocking
calls: run them off the event loop with `asyncio.to_thread`).

Design notes: docs/design/tool-calls.md, "Dispatch".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from celery import Celery

from orchestrator.model import TurnPriority
from orchestrator.outage import (
    RedisOutage,
    RedisRetry,
    build_backoff_s,
    build_broker_outage,
    is_redis_failure,
    is_redis_url,
)
from orchestrator.publishing.messages import TaskMessage, TaskSender, current_origin
from orchestrator.publishing.wire import TaskWire, open_task_wire
from orchestrator.store.runner import AsyncRunner
from orchestrator.store.task_queue import write_tasks
from workers.app import create_app
from workers.contract import ToolCallRequest, ToolSpec, build_task_name, build_task_reprs
from workers.settings import WorkerSettings
from workers.tracing import build_carrier

log = logging.getLogger("toolloop.orchestrator")

# How far past the deadline a capped call's hard limit reaches. The owner of the deadline (the turn's timer,
# or a direct caller) answers the call first — `deadline_exceeded`, not a racing worker `timeout` — and then
# revokes it; the hard limit is only the backstop that kills a tool the revoke did not reach.
DEADLINE_MARGIN_S = 1.0
# A capped soft limit falls this far into the margin: after the deadline, still before the hard limit.
_SOFT_MARGIN_FRACTION = 0.5
# A publish that fails for another reason than Redis (a message the broker refuses) is tried this many times
# before its call is answered as lost; one that fails for want of Redis is retried until it goes out.
PUBLISH_ATTEMPTS = 4
# Revocations asked for within this window go out in one broadcast.
REVOKE_BATCH_S = 0.02


class Send(NamedTuple):
    """One call to publish: its tool's spec, the request, the Celery task id the machine named it by, and its
    turn's lane (`TurnRequest.priority`: the message's priority)."""

    spec: ToolSpec
    request: ToolCallRequest
    task_id: str
    priority: TurnPriority = "normal"


# The message priority of each lane. kombu's Redis transport keeps a list per step of `priority_steps` (0 3 6
# 9, `workers.app.PRIORITY_STEPS`) and serves the lowest step first; step 0 is the queue's own list, where
# every release and every tool that reads a queue's length has always found its calls, so interactive and
# normal calls stay there and batch calls wait behind them. AMQP serves the highest priority first, on a
# queue declared with `x-max-priority` (elsewhere the property is ignored).
REDIS_PRIORITIES: Mapping[str, int] = {"interactive": 0, "normal": 0, "batch": 6}
AMQP_PRIORITIES: Mapping[str, int] = {"interactive": 9, "normal": 5, "batch": 1}


def build_message_priority(priority: TurnPriority, broker_url: str) -> int:
    """The Celery message priority of a call of a turn in lane `priority`, for the broker at `broker_url`."""
    table = REDIS_PRIORITIES if is_redis_url(broker_url) else AMQP_PRIORITIES
    return table[priority]


def build_task_id(request: ToolCallRequest) -> str:
    """`<call id>:<attempt>`: one Celery task per dispatch of a call, revocable by id."""
    return f"{request.call_id}:{request.attempt}"


def build_limits(spec: ToolSpec, request: ToolCallRequest, now: float) -> tuple[float, float]:
    """(soft, hard) seconds for this call: the tool's own, capped so that they never end before the deadline.

    A worker counts its limits from the moment it starts the task, at or after `now`, so a limit of
    `left + x` ends at least `x` past the deadline. The hard limit is cut to `DEADLINE_MARGIN_S` past the
    deadline; a soft limit that reaches the deadline is cut to halfway into that margin, one that ends
    before it stays as is.
    """
    soft, hard = spec.soft_time_limit_s, spec.time_limit_s
    if request.deadline_at is None:
        return soft, hard
    left_s = max(request.deadline_at - now, 0.0)
    hard = min(hard, left_s + DEADLINE_MARGIN_S)
    if soft >= left_s:
        soft = min(soft, left_s + DEADLINE_MARGIN_S * _SOFT_MARGIN_FRACTION)
    return soft, hard


def build_send_options(
    spec: ToolSpec,
    request: ToolCallRequest,
    now: float,
    *,
    task_id: str | None = None,
    trace: Mapping[str, str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `Celery.send_task` that publish `request` (pure).

    `task_id` names the task (a turn's machine names each dispatch, to revoke it later by that name);
    without it the id is `build_task_id(request)`. `trace` (`traceparent`, …) goes into the headers: the
    worker's span is a child of that context, and a retry's message carries the headers on.
    """
    soft, hard = build_limits(spec, request, now)
    argsrepr, kwargsrepr = build_task_reprs(request)
    options: dict[str, Any] = {
        "name": build_task_name(spec.name),
        "kwargs": request.model_dump(mode="json"),
        "queue": spec.queue,
        "task_id": task_id or build_task_id(request),
        "soft_time_limit": soft,
        "time_limit": hard,
        "argsrepr": argsrepr,
        "kwargsrepr": kwargsrepr,
        "headers": {
            "toolloop_turn_id": request.turn_id,
            "toolloop_call_id": request.call_id,
            **(trace or {}),
        },
        "ignore_result": True,
        "serializer": "json",
    }
    if request.deadline_at is not None:
        options["expires"] = datetime.fromtimestamp(request.deadline_at, tz=UTC)
    if priority is not None:
        options["priority"] = priority
    return options


def dispatch_call(
    app: Celery,
    spec: ToolSpec,
    request: ToolCallRequest,
    *,
    now: float | None = None,
    task_id: str | None = None,
) -> str:
    """Publish one tool call; returns its Celery task id (`task_id` when given), the id to revoke it by.

    Blocking (short): use `asyncio.to_thread`. The caller's current trace context goes with it.
    """
    now = time.time() if now is None else now
    options = build_send_options(spec, request, now, task_id=task_id, trace=build_carrier())
    app.send_task(**options)
    return str(options["task_id"])


def revoke_call(app: Celery, task_id: str, *, terminate: bool = False) -> None:
    """Revoke a tool task (as Flower does); with `terminate`, a running one is killed too."""
    app.control.revoke(task_id, terminate=terminate)


def _no_trace(turn_id: str) -> None:
    return None


_producers: dict[str, Celery] = {}
_producers_lock = threading.Lock()


def get_producer_app(settings: WorkerSettings) -> Celery:
    """One producer app per broker URL and process (building a Celery app per call is wasteful)."""
    # The master name is part of where a Sentinel URL leads.
    key = f"{settings.effective_broker_url}|{settings.redis_url}|{settings.redis_master_name}"
    with _producers_lock:
        app = _producers.get(key)
        if app is None:
            app = create_app(settings, main="toolloop-producer")
            _producers[key] = app
        return app


class Publisher:
    """Publishes tool calls without blocking the event loop on the broker.

    The calls of one `DispatchTools` cost one round trip to the broker. With `broker` (the asyncio client of
    the state Redis, when that is the broker) it is one script call from the event loop (`task_wire`);
    otherwise kombu's publishing, which blocks, runs in one long-lived thread with a producer from the
    app's pool: one hop to it and one pipelined round trip, and no two publishing threads contend for the
    GIL with the event loop. Revocations and the queues' declarations always go through that thread.
    """

    def __init__(
        self,
        app: Celery,
        retry: RedisRetry | None = None,
        *,
        trace_of: Callable[[str], Mapping[str, str] | None] | None = None,
        broker: aioredis.Redis | None = None,
    ) -> None:
        """`trace_of(turn_id)`: the trace context a turn's tool tasks carry in their headers (the turn's span,
        `runtime.turn_spans`); none without it. `broker`: a client of the Redis `app` publishes to."""
        self._app = app
        self._trace_of = trace_of or _no_trace
        self._sender = TaskSender(app)
        broker_url = str(app.conf.broker_url or "")
        self._retry = retry or RedisRetry(RedisOutage(broker_url))
        # A broker that is not the state Redis (RabbitMQ) is told and counted as itself: "the broker at
        # amqp://…", never "Redis … is unreachable" while Redis answers.
        self._outage = (
            self._retry.outage
            if broker is not None or is_redis_url(broker_url)
            else build_broker_outage(broker_url)
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolloop-publish")
        self._runner = AsyncRunner(broker) if broker is not None else None
        # The wire, once opened; `_wire_tried` once `open_task_wire` answered (None: kombu's path for good).
        self._wire: TaskWire | None = None
        self._wire_tried = False
        self._wire_lock = asyncio.Lock()
        # Task ids waiting for the next revoke broadcast, and the future that says it was sent.
        self._revokes: tuple[list[str], asyncio.Future[None]] | None = None

    @property
    def writes_directly(self) -> bool:
        """Whether tool calls are written by `broker`'s client (`task_wire`), not sent through kombu."""
        return self._wire is not None

    async def publish(
        self, sends: Sequence[Send | tuple[ToolSpec, ToolCallRequest, str]]
    ) -> dict[str, Exception]:
        """Publish each (spec, request, task id), retrying failures with capped backoff.

        A send that fails for want of Redis (unreachable, out of memory, read-only) is retried until it goes
        out — the turn's deadline answers a call that never does, and a task cancelled (its turn dropped)
        leaves the dispatch to the turn's next owner; one that fails otherwise, PUBLISH_ATTEMPTS times.
        Returns the last error of each send given up, by task id (empty when all went out).
        """
        lost: dict[str, Exception] = {}
        # A (spec, request, task id) without a lane is a normal turn's.
        pending = [Send(*send) for send in sends]
        failures = down = 0  # rounds with another failure; rounds with Redis failing
        while pending:
            errors = await self._publish_once(pending)
            redis_errors = [exc for exc in errors.values() if is_redis_failure(exc)]
            if redis_errors:
                down += 1
                self._outage.failed(redis_errors[0], "publish")
            else:
                self._outage.succeeded()
            if len(redis_errors) < len(errors):
                failures += 1
            for task_id, exc in errors.items():
                if not is_redis_failure(exc):
                    log.warning("publishing %s failed (%s); attempt %d", task_id, exc, failures)
                    if failures >= PUBLISH_ATTEMPTS:
                        lost[task_id] = exc
            pending = [send for send in pending if send.task_id in errors and send.task_id not in lost]
            if pending:
                # Not cut short by a stop: the task is cancelled then, if its turn is dropped.
                await asyncio.sleep(build_backoff_s(max(failures, down)))
        return lost

    async def _publish_once(self, sends: Sequence[Send]) -> dict[str, Exception]:
        if not sends:
            return {}
        # Read here, on the event loop that opens and closes the turns' spans.
        traces = {
            send.task_id: self._trace_of(send.request.turn_id) for send in sends if send.request.turn_id
        }
        if self._runner is not None:
            try:
                wire = await self._open_wire()
            except Exception as exc:
                return {send.task_id: exc for send in sends}
            errors = None if wire is None else await self._publish_by_wire(wire, self._runner, sends, traces)
            if errors is not None:
                return errors
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._publish_all, list(sends), traces)

    async def _open_wire(self) -> TaskWire | None:
        if self._wire_tried:  # every publish after the first: no lock on the way
            return self._wire
        async with self._wire_lock:
            if not self._wire_tried:
                loop = asyncio.get_running_loop()
                self._wire = await loop.run_in_executor(self._pool, open_task_wire, self._app, self._sender)
                self._wire_tried = True
                how = "written by this process's Redis client" if self._wire else "sent through kombu"
                log.info("tool calls are %s (the broker is the state Redis)", how)
            return self._wire

    async def _publish_by_wire(
        self,
        wire: TaskWire,
        runner: AsyncRunner,
        sends: Sequence[Send],
        traces: Mapping[str, Mapping[str, str] | None],
    ) -> dict[str, Exception] | None:
        # Errors by task id; None when kombu would publish this batch otherwise (then it goes through kombu).
        messages, errors = self._build_messages(sends, traces)
        loop = asyncio.get_running_loop()
        try:
            routes = wire.undeclared(messages)
            if routes:
                await loop.run_in_executor(self._pool, wire.declare, routes)
            built = wire.commands(messages)
            if built is None:
                log.warning("kombu publishes tool calls otherwise than toolloop writes them: using kombu")
                self._wire = None
                await loop.run_in_executor(self._pool, wire.close)
                return None
            commands, failed = built
            errors.update(failed)
            if commands:
                await runner.run(write_tasks(commands))
        except Exception as exc:
            # Redis did not answer, or refused the batch (out of memory, read-only: before its first write).
            # Any message of it may be out, as with kombu's batch: publishing one again is harmless.
            return {send.task_id: errors.get(send.task_id, exc) for send in sends}
        return errors

    def _build_messages(
        self, sends: Sequence[Send], traces: Mapping[str, Mapping[str, str] | None]
    ) -> tuple[list[TaskMessage], dict[str, Exception]]:
        # Each message built once with Celery's protocol; the error of each that could not be, by task id.
        sender, origin = self._sender, current_origin()
        messages: list[TaskMessage] = []
        errors: dict[str, Exception] = {}
        broker_url = str(self._app.conf.broker_url or "")
        for spec, request, task_id, lane in sends:
            try:
                priority = build_message_priority(lane, broker_url)
                options = build_send_options(
                    spec, request, time.time(), task_id=task_id, trace=traces.get(task_id), priority=priority
                )
                messages.append(sender.build(options, origin=origin))
            except Exception as exc:
                errors[task_id] = exc
        return messages, errors

    def _publish_all(
        self, sends: list[Send], traces: Mapping[str, Mapping[str, str] | None]
    ) -> dict[str, Exception]:
        # All the messages (and their `task-sent` events) sent on one producer in one kombu batch: one
        # pipelined round trip (`task_messages`).
        messages, errors = self._build_messages(sends, traces)
        try:
            errors.update(self._sender.send_batch(messages))
        except Exception as exc:
            # The flush failed: any message of the batch may be lost. Publishing one again is harmless (a
            # second delivery of a call never runs it twice), losing one is not.
            return {send.task_id: errors.get(send.task_id, exc) for send in sends}
        return errors

    async def publish_archive(self, options: Mapping[str, Any]) -> Exception | None:
        """`publish_hook` of a finished turn's archive record (`orchestrator.archive.build_archive_send`)."""
        return await self.publish_hook(options, "archive")

    async def publish_hook(self, options: Mapping[str, Any], purpose: str) -> Exception | None:
        """Send one task that is no tool call (`send_task` keyword arguments: a finished turn's archive
        record, a call waiting for a person) from the publishing thread; `purpose` names it in the log.

        Retried like a tool call — for want of Redis until it goes out, otherwise PUBLISH_ATTEMPTS times —
        except that a stop ends the retries: nothing waits on it, so it must not hold the process up.
        Returns the last error when given up, None once sent.
        """
        failures = down = 0  # tries failing for another reason; tries failing for want of Redis
        while True:
            try:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._pool, functools.partial(self._app.send_task, **options))
            except Exception as exc:
                error = exc
            else:
                self._outage.succeeded()
                return None
            if is_redis_failure(error):
                down += 1
                self._outage.failed(error, purpose)
            else:
                failures += 1
                log.warning("publishing %s failed (%s); attempt %d", options.get("task_id"), error, failures)
            if failures >= PUBLISH_ATTEMPTS or self._retry.stopping.is_set():
                return error
            await self._retry.pause(build_backoff_s(max(failures, down)))

    async def revoke(self, task_ids: list[str]) -> None:
        """Revoke and terminate these tasks; returns once the broadcast that carries them is sent.

        Revocations asked for within REVOKE_BATCH_S share one broadcast (`Control.revoke` takes a list): a
        deadline that stops hundreds of turns at once costs the workers a few control messages (and a few
        killed pool processes), not one each, and costs this process little CPU while it must answer them.
        """
        loop = asyncio.get_running_loop()
        if self._revokes is None:
            self._revokes = ([], loop.create_future())
            loop.call_later(REVOKE_BATCH_S, self._flush_revokes)
        ids, sent = self._revokes
        ids += task_ids
        await asyncio.shield(sent)

    def _flush_revokes(self) -> None:
        if self._revokes is None:
            return  # flushed already, by aclose
        ids, sent = self._revokes
        self._revokes = None
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._revoke_all, ids)
        future.add_done_callback(lambda _: sent.set_result(None))

    def _revoke_all(self, task_ids: list[str]) -> None:
        try:
            # terminate: a running tool is killed, not left to finish work nobody will read.
            self._app.control.revoke(task_ids, terminate=True)
        except Exception as exc:
            # Best effort: the calls' outcomes are already decided by first-writer-wins.
            log.warning("revoking %s failed: %s", ", ".join(task_ids), exc)

    async def aclose(self) -> None:
        """Send the revocations still waiting, let the thread finish what it publishes, then end it."""
        self._flush_revokes()
        if self._wire is not None:
            self._pool.submit(self._wire.close)
            self._wire = None
        await asyncio.to_thread(self._pool.shutdown)
