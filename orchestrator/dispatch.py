"""Publishing tool calls as Celery tasks (SPEC §4.2, §7.3), from the orchestrator's side.

`build_send_options` is pure: the task name, queue, id, per-call time limits capped by what is left of the
turn's deadline, `expires` at that deadline (a call still queued then never starts), Flower's redacted
`argsrepr`/`kwargsrepr`, and headers with the turn id and call id. `dispatch_call` publishes (a short blocking
call: run it off the event loop with `asyncio.to_thread`).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from workers.app import create_app
from workers.contract import ToolCallRequest, ToolSpec, build_task_name, build_task_reprs
from workers.settings import Settings

# When the deadline caps the hard limit, the soft one stays a tenth below it, so that a tool still has a
# moment to return a partial result before it is killed.
_SOFT_GAP_FRACTION = 0.1
_MIN_LIMIT_S = 0.05


def build_task_id(request: ToolCallRequest) -> str:
    """`<call id>:<attempt>`: one Celery task per dispatch of a call, revocable by id."""
    return f"{request.call_id}:{request.attempt}"


def build_limits(spec: ToolSpec, request: ToolCallRequest, now: float) -> tuple[float, float]:
    """(soft, hard) seconds for this call: the tool's own, capped by the time left before the deadline."""
    soft, hard = spec.soft_time_limit_s, spec.time_limit_s
    if request.deadline_at is None:
        return soft, hard
    left = max(request.deadline_at - now, _MIN_LIMIT_S)
    if left >= hard:
        return soft, hard
    hard = left
    return min(soft, hard * (1 - _SOFT_GAP_FRACTION)), hard


def build_send_options(spec: ToolSpec, request: ToolCallRequest, now: float) -> dict[str, Any]:
    """Keyword arguments for `Celery.send_task` that publish `request` (pure)."""
    soft, hard = build_limits(spec, request, now)
    argsrepr, kwargsrepr = build_task_reprs(request)
    options: dict[str, Any] = {
        "name": build_task_name(spec.name),
        "kwargs": request.model_dump(mode="json"),
        "queue": spec.queue,
        "task_id": build_task_id(request),
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


def dispatch_call(app: Celery, spec: ToolSpec, request: ToolCallRequest, *, now: float | None = None) -> str:
    """Publish one tool call; returns its Celery task id. Blocking (short): use `asyncio.to_thread`."""
    options = build_send_options(spec, request, time.time() if now is None else now)
    app.send_task(**options)
    return str(options["task_id"])


def revoke_call(app: Celery, task_id: str, *, terminate: bool = False) -> None:
    """Revoke a tool task (as Flower does); with `terminate`, a running one is killed too."""
    app.control.revoke(task_id, terminate=terminate)


_producers: dict[str, Celery] = {}
_producers_lock = threading.Lock()


def get_producer_app(settings: Settings) -> Celery:
    """One producer app per broker URL and process (building a Celery app per call is wasteful)."""
    key = f"{settings.effective_broker_url}|{settings.redis_url}"
    with _producers_lock:
        app = _producers.get(key)
        if app is None:
            app = create_app(settings, main="toolloop-producer")
            _producers[key] = app
        return app
