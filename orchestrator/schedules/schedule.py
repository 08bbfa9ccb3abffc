"""A schedule, what the beat did with it, and the pure rules of its runs (sans-IO).

A `Schedule` is a name, when it runs (a cron expression, or an interval `every_s`), its overlap policy, and
the `TurnRequest` each run submits (built by `client.submission.build_submission` from the arguments of
`submit`, so it is checked as a submit is). `ScheduleState` is what the beat recorded of it in Redis.

The rules, each a pure function:

- `build_next_run_s`: the first run time strictly after a moment. Cron expressions are read by `cronsim`
  in UTC; an interval's runs sit on a grid anchored at the schedule's creation (`created_at + k * every_s`),
  so that two beats, or one beat before and after a restart, agree on the run times.
- `build_due`: whether a run is due, given when the schedule's last tick was handled. Only the next run
  after that moment counts: ticks missed while no beat ran are not replayed — one catch-up run at most,
  then the runs go on from now.
- `build_overlap_decision`: run, skip, or cancel the previous run first, from the policy and whether the
  previous run has finished.
- `build_run_turn_id`: a run's turn id, from the schedule and its run time: a second beat submitting the
  same run (a takeover at the wrong moment) finds the turn stored and changes nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.store import codec
from workers.records import STORED

Overlap = Literal["skip", "queue", "cancel_previous"]
"""What a run does while the schedule's previous run has not finished (`Schedule.overlap`)."""
OVERLAPS: tuple[str, ...] = ("skip", "queue", "cancel_previous")

# A name is part of Redis keys and of its runs' turn ids: short, printable, no spaces or separators.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
# The record's layout; a reader refuses a newer one rather than misread it.
SCHEDULE_VERSION = 1
# The shortest interval: a beat checks its schedules about once a second.
MIN_EVERY_S = 1.0


class Schedule(BaseModel):
    """One schedule, as stored in Redis (`keys.SCHEDULES`)."""

    model_config = ConfigDict(frozen=True)

    version: int = SCHEDULE_VERSION
    name: str = Field(pattern=NAME_PATTERN)
    # Exactly one of the two: a five-field cron expression (UTC), or seconds between runs.
    cron: str | None = None
    every_s: float | None = None
    overlap: Overlap = "skip"
    # What each run submits (its `schedule` field set to `name` when it is submitted).
    request: TurnRequest
    # When it was created (epoch s): the anchor of an interval's runs, and its first "last tick".
    created_at: float

    @property
    def timing(self) -> str:
        """When it runs, as a person reads it: `cron */5 * * * *` or `every 300 s`."""
        return f"cron {self.cron}" if self.cron is not None else f"every {self.every_s:g} s"


class ScheduleState(BaseModel):
    """What the beat recorded of a schedule (`keys.schedule_state`, `keys.schedule_runs`)."""

    model_config = ConfigDict(frozen=True)

    # When the beat last handled a due tick (ran it, skipped it, or failed to submit it); None: never.
    last_tick_at: float | None = None
    last_run_at: float | None = None
    last_turn_id: str | None = None
    # The last runs' turn ids, newest first.
    runs: list[str] = Field(default_factory=list)
    skipped: int = 0
    last_skipped_at: float | None = None
    # Why the last tick submitted nothing (a tool gone, a model refused), and when; None once a run went.
    last_error: str | None = None
    last_error_at: float | None = None


class ScheduleView(BaseModel):
    """A schedule with its state and its next run: what `Client.schedules()` and `toolloop schedules` show."""

    model_config = ConfigDict(frozen=True)

    schedule: Schedule
    state: ScheduleState = Field(default_factory=ScheduleState)
    next_run_at: float


class OverlapDecision(StrEnum):
    """What the beat does with a due run."""

    RUN = "run"
    SKIP = "skip"
    CANCEL_PREVIOUS = "cancel_previous"


class TickResult(StrEnum):
    """What became of a due tick (`storage.run_due`)."""

    SUBMITTED = "submitted"
    SKIPPED = "skipped"
    FAILED = "failed"
    # Read afresh, the tick was no longer due (another beat handled it) or the schedule was removed.
    NOT_DUE = "not_due"
    GONE = "gone"


@dataclass(frozen=True)
class Tick:
    """A handled tick: its result, the run's turn id when one was submitted, the previous run it skipped
    for or cancelled, and the error that stopped its submit."""

    result: TickResult
    turn_id: str | None = None
    previous: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Due:
    """Whether a schedule's run is due now, its run time, and seconds until the run after it."""

    is_due: bool
    run_at: float
    next_in_s: float


def parse_cron(expression: str) -> str:
    """A cron expression `cronsim` reads (five fields, UTC), stripped; `ValueError` saying what is wrong."""
    text = expression.strip()
    try:
        CronSim(text, datetime.now(UTC))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None
    return text


def build_schedule(
    name: str,
    request: TurnRequest,
    *,
    cron: str | None,
    every_s: float | None,
    overlap: str,
    now: float,
) -> Schedule:
    """A checked `Schedule` (`ValueError` with a clear message: a bad name, both or neither of `cron` and
    `every_s`, a bad cron expression, an interval under `MIN_EVERY_S`, an unknown overlap policy).

    The request's own checks (tools, models) are the submit's, done by whoever stores the schedule."""
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise ValueError(
            f"invalid schedule name {name!r}: 1-100 letters, digits, '_', '.' or '-', starting with a letter "
            "or digit"
        )
    if (cron is None) == (every_s is None):
        raise ValueError(
            "a schedule runs on a cron expression or an interval: give exactly one of cron, every_s"
        )
    if every_s is not None and not (math.isfinite(every_s) and every_s >= MIN_EVERY_S):
        raise ValueError(f"every_s must be at least {MIN_EVERY_S:g} s, not {every_s!r}")
    if overlap not in OVERLAPS:
        raise ValueError(f"unknown overlap policy {overlap!r}: use one of {', '.join(OVERLAPS)}")
    if request.schedule is not None:
        raise ValueError("'schedule' is set by the beat on each run, not given")
    return Schedule(
        name=name,
        cron=None if cron is None else parse_cron(cron),
        every_s=every_s,
        overlap=overlap,
        request=request,
        created_at=now,
    )


def dump_schedule(schedule: Schedule) -> str:
    """The stored JSON of a schedule, its request as a turn's is stored (`codec.dump_request`: fields at
    their defaults left out, so that an older release reads it during a rolling deploy)."""
    dumped = schedule.model_dump(mode="json")
    dumped["request"] = json.loads(codec.dump_request(schedule.request))
    return json.dumps(dumped)


def parse_schedule(value: str | bytes) -> Schedule:
    """A stored schedule (its request's fields a newer release added ignored, as in a stored turn);
    `ValueError` for a layout newer than this release reads."""
    schedule = Schedule.model_validate_json(value, context=STORED)
    if schedule.version > SCHEDULE_VERSION:
        raise ValueError(
            f"schedule {schedule.name!r} has layout {schedule.version}, newer than this release reads"
        )
    return schedule


def build_next_run_s(schedule: Schedule, after_s: float) -> float:
    """The schedule's first run time strictly after `after_s` (epoch s)."""
    if schedule.every_s is not None:
        every = schedule.every_s
        steps = math.floor((after_s - schedule.created_at) / every) + 1
        return schedule.created_at + max(steps, 1) * every
    assert schedule.cron is not None
    # cronsim yields times strictly after its start, which it reads at whole seconds.
    start = datetime.fromtimestamp(math.floor(after_s), UTC)
    return next(CronSim(schedule.cron, start)).timestamp()


def build_due(schedule: Schedule, last_tick_at: float | None, now: float) -> Due:
    """Whether a run is due at `now`, given when the schedule's last tick was handled (None: never — its
    creation counts). Only the first run time after the last tick is looked at, however long ago that was:
    missed ticks make one catch-up run, not one run each."""
    run_at = build_next_run_s(schedule, schedule.created_at if last_tick_at is None else last_tick_at)
    if run_at > now:
        return Due(False, run_at, run_at - now)
    return Due(True, run_at, build_next_run_s(schedule, now) - now)


def build_next_run_at(schedule: Schedule, state: ScheduleState, now: float) -> float:
    """When the schedule runs next as seen at `now`: its due run time, or now when a run is overdue."""
    due = build_due(schedule, state.last_tick_at, now)
    return now if due.is_due else due.run_at


def build_overlap_decision(overlap: Overlap, previous: TurnStatus | None) -> OverlapDecision:
    """Run, skip, or cancel the previous run first: `previous` is the status of the schedule's last run
    (None: there was none, or it has expired — finished either way)."""
    if previous is None or previous.terminal:
        return OverlapDecision.RUN
    match overlap:
        case "skip":
            return OverlapDecision.SKIP
        case "queue":
            return OverlapDecision.RUN
        case "cancel_previous":
            return OverlapDecision.CANCEL_PREVIOUS


def build_run_turn_id(schedule: Schedule, run_at: float) -> str:
    """The turn id of the schedule's run at `run_at`: the same for whichever beat submits it."""
    return f"schedule-{schedule.name}-{round(schedule.created_at * 1000)}-{round(run_at * 1000)}"


def build_run_request(schedule: Schedule) -> TurnRequest:
    """What a run submits: the schedule's request, linked to the schedule."""
    return schedule.request.model_copy(update={"schedule": schedule.name})
