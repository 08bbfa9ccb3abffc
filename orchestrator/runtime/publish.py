"""Publishing tool calls as Celery tasks (SPEC §4.2, §7.3), from the orchestrator's side.

`build_send_options` is pure: the task name, queue, id, per-call time limits capped to end just past the
turn's deadline (so that the deadline answers first), `expires` at that deadline (a call still queued then
never starts), Flower's redacted `argsrepr`/`kwargsrepr`, and headers with the turn id and call id.
`dispatch_call` publishes (a short blocking call: run it off the event loop with `asyncio.to_thread`).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from workers.app import create_app
from workers.contract import ToolCallRequest, ToolSpec, build_task_name, build_task_reprs
from workers.settings import WorkerSettings

# How far past the deadline a capped call's hard limit reaches. The owner of the deadline (the turn's timer,
# or a direct caller) answers the call first — `deadline_exceeded`, not a racing worker `timeout` — and then
# revokes it; the hard limit is only the backstop that kills a tool the revoke did not reach.
DEADLINE_MARGIN_S = 1.0
# A capped soft limit falls this far into the margin: after the deadline, still before the hard limit.
_SOFT_MARGIN_FRACTION = 0.5


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
    spec: ToolSpec, request: ToolCallRequest, now: float, *, task_id: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for `Celery.send_task` that publish `request` (pure).

    `task_id` names the task (a turn's machine names each dispatch, to revoke it later by that name);
    without it the id is `build_task_id(request)`.
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
        "headers": {"toolloop_turn_id": request.turn_id, "toolloop_call_id": request.call_id},
        "ignore_result": True,
        "serializer": "json",
    }
    if request.deadline_at is not None:
        options["expires"] = datetime.fromtimestamp(request.deadline_at, tz=UTC)
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

    Blocking (short): use `asyncio.to_thread`.
    """
    options = build_send_options(spec, request, time.time() if now is None else now, task_id=task_id)
    app.send_task(**options)
    return str(options["task_id"])


def revoke_call(app: Celery, task_id: str, *, terminate: bool = False) -> None:
    """Revoke a tool task (as Flower does); with `terminate`, a running one is killed too."""
    app.control.revoke(task_id, terminate=terminate)


_producers: dict[str, Celery] = {}
_producers_lock = threading.Lock()


def get_producer_app(settings: WorkerSettings) -> Celery:
    """One producer app per broker URL and process (building a Celery app per call is wasteful)."""
    key = f"{settings.effective_broker_url}|{settings.redis_url}"
    with _producers_lock:
        app = _producers.get(key)
        if app is None:
            app = create_app(settings, main="toolloop-producer")
            _producers[key] = app
        return app
