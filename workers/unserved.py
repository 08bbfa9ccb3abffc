"""Answering a tool task this worker does not serve, so that no call is ever dropped silently.

Each tool has its own queue by default, so a worker is only sent what it serves. A task it does not know
can still reach it: a queue that tools share (`@tool(queue=...)`) during a rolling deploy, while some of
its workers run an older tool module, or a catalogue entry left by an older worker. Celery's consumer then
rejects the message (it is gone from the broker), logs "Received unregistered task" and sends the
`task_unknown` signal — and the turn would wait for its deadline.

Here, on that signal and in the worker's main process, the call is answered at once with a `not_found`
outcome that names the tool and the worker, written first-writer-wins like every outcome: a real answer
that landed earlier (another delivery served it) stays the answer, and the turn goes on at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery, signals

from workers.call_store import CallStore, OutcomeWrite, get_store
from workers.catalogue import build_served_specs
from workers.contract import TASK_NAME_PREFIX, FailureKind, ToolCallRequest, ToolOutcome, build_failure
from workers.parent import PARENT_RETRY_S
from workers.redis_retry import RedisRetry
from workers.scripts import Fence, WriteResult
from workers.settings import WorkerSettings, get_worker_settings
from workers.tools import ToolRegistry, registry

logger = logging.getLogger(__name__)

# The served tools an answer lists; a worker may serve hundreds.
_LISTED_TOOLS = 8


def build_unserved_outcome(
    request: ToolCallRequest, *, worker: str, queue: str | None, served: Sequence[str], now: float
) -> ToolOutcome:
    """The `not_found` outcome of a call that reached a worker that does not serve its tool (pure)."""
    listed = ", ".join(served[:_LISTED_TOOLS]) + (", …" if len(served) > _LISTED_TOOLS else "")
    where = f" from queue '{queue}'" if queue else ""
    message = (
        f"tool '{request.tool}' is not served by worker {worker} (it serves: {listed or 'no tool'}); "
        f"the call reached it{where} and was not run"
    )
    return build_failure(request, FailureKind.NOT_FOUND, message, attempts=0, worker=worker, finished_at=now)


def parse_unknown_message(message: Any) -> tuple[ToolCallRequest | None, str | None]:
    """The tool call a broker message carries, and the queue it came from (None, None when it is not one)."""
    delivery = getattr(message, "delivery_info", None) or {}
    queue = delivery.get("routing_key") if isinstance(delivery, dict) else None
    try:
        # Task protocol 2: the body is [args, kwargs, embed]; a tool call travels in kwargs only.
        _args, kwargs, _embed = message.decode()
        return ToolCallRequest.model_validate(kwargs), queue
    except Exception:  # a foreign or refused payload (pickle): Celery has logged it, there is no call here
        logger.warning("an unregistered task whose body is not a tool call", exc_info=True)
        return None, queue


def answer_unserved(
    store: CallStore, request: ToolCallRequest, *, worker: str, queue: str | None, served: Sequence[str]
) -> bool:
    """Write the `not_found` answer (first writer wins); True when it won.

    In the worker's main process: Redis is retried for `PARENT_RETRY_S` at most, then the call is left to
    the turn's deadline (logged).
    """
    outcome = build_unserved_outcome(request, worker=worker, queue=queue, served=served, now=time.time())
    retry = RedisRetry(time.time() + PARENT_RETRY_S, time.time, time.sleep)
    # Fenced by its dispatch attempt: a stray delivery of a superseded dispatch answers nothing.
    write = OutcomeWrite.of(outcome, Fence(request.attempt, ""), reply_key=request.reply_key)
    try:
        result = store.finish(write, retry=retry)
    except redis.RedisError as exc:
        # The worker's main process: no Redis error may escape into Celery's consumer.
        logger.error("no answer for unserved %s: %r", request.call_id, exc)
        return False
    logger.warning("answered %s not_found (%s): %s", request.call_id, result.name, outcome.error)
    return result is WriteResult.WON


def connect_unserved_answer(app: Celery, tools: ToolRegistry = registry) -> None:
    """Answer every `tool.*` task the consumer of `app` receives but has no task for (`task_unknown`)."""

    def on_unknown(sender: Any = None, message: Any = None, name: str = "", **_: Any) -> None:
        if getattr(sender, "app", None) is not app or not str(name).startswith(TASK_NAME_PREFIX):
            return
        request, queue = parse_unknown_message(message)
        if request is None:
            return
        settings: WorkerSettings = getattr(app, "settings", None) or get_worker_settings()
        consumed = set(app.amqp.queues.consume_from or app.amqp.queues)
        answer_unserved(
            get_store(settings.redis_url, settings.redis_ssl_cert_reqs),
            request,
            worker=str(getattr(sender, "hostname", "") or "?"),
            queue=queue,
            served=[spec.name for spec in build_served_specs(tools, consumed)],
        )

    signals.task_unknown.connect(on_unknown, weak=False)
