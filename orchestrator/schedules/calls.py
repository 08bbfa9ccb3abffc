"""What `Client.schedule` and `AsyncClient.schedule` take, and the flows both clients run (one core, two
faces): `build_schedule_call` builds the `Schedule` from the arguments of a submit (with
`client.submission.build_submission`, so they are checked exactly as a submit's); `save` stores it once its
request passes the submit's checks against the store (models, tools); `remove` and `storage.list_schedules`
are the others.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, TypeVar

import redis

from orchestrator.client.submission import build_submission
from orchestrator.schedules import storage
from orchestrator.schedules.schedule import (
    Schedule,
    ScheduleState,
    ScheduleView,
    build_next_run_at,
    build_schedule,
)
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.catalogue import RecentCatalogue
from orchestrator.store.connection import build_shown_url
from orchestrator.store.effects import Flow
from orchestrator.store.runner import Patience, SyncRunner
from orchestrator.submit_checks import ModelNames, check_submit

T = TypeVar("T")


def build_schedule_call(
    name: str,
    *,
    cron: str | None = None,
    every_s: float | None = None,
    overlap: str = "skip",
    **submit: Any,
) -> Schedule:
    """A checked `Schedule` named `name`: on the cron expression `cron` (five fields, UTC) or every `every_s`
    seconds, with the `overlap` policy ("skip", "queue" or "cancel_previous"); each run submits what
    `submit(**submit)` would (its arguments: prompt, tools, model, limits, …; a run's turn id is the beat's).

    `ValueError` (pydantic's `ValidationError` is one) for bad input, as `submit` raises it."""
    if "turn_id" in submit:
        raise ValueError("a schedule's runs get their turn ids from the beat: 'turn_id' cannot be given")
    request = build_submission(**submit).request
    return build_schedule(name, request, cron=cron, every_s=every_s, overlap=overlap, now=codec.now_s())


def _build_signature() -> inspect.Signature:
    # `help(Client.schedule)` lists submit's arguments too, not an opaque **submit.
    own = list(inspect.signature(build_schedule_call).parameters.values())[:-1]
    submits = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for parameter in inspect.signature(build_submission).parameters.values()
        if parameter.name != "turn_id"
    ]
    return inspect.Signature([*own, *submits], return_annotation=Schedule)


build_schedule_call.__signature__ = _build_signature()  # type: ignore[attr-defined]  # mypy's functions lack it


def save(
    schedule: Schedule, settings: Settings, *, recent: RecentCatalogue | None = None
) -> Flow[ScheduleView]:
    """Store `schedule` once its request passes a submit's checks (the caller's tiers, its tools served within
    TOOLLOOP_TOOL_GONE_AFTER_S); the schedule with its next run."""
    yield from storage.save_schedule(
        schedule,
        check=partial(check_submit, names=ModelNames.from_settings(settings)),
        recent=recent,
        tool_gone_after_s=settings.tool_gone_after_s,
    )
    state = ScheduleState()
    return ScheduleView(
        schedule=schedule, state=state, next_run_at=build_next_run_at(schedule, state, schedule.created_at)
    )


def remove(name: str) -> Flow[bool]:
    """Remove the schedule (its runs' turns stay); False when there was none."""
    removed: bool = yield storage.delete_schedule(name)
    return removed


def list_all() -> Flow[list[ScheduleView]]:
    """Every schedule with its state and next run, by name."""
    views: list[ScheduleView] = yield from storage.list_schedules(codec.now_s())
    return views


def run_sync(client: redis.Redis, redis_url: str, flow: Flow[T], retry_s: float | None) -> T:
    """Run one of these flows on a sync client, riding out a Redis outage for `retry_s` (as `Client`'s
    calls do)."""
    return SyncRunner(client, where=build_shown_url(redis_url)).run_flow(flow, Patience.for_s(retry_s))
