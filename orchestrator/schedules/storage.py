"""Schedules in Redis, as operations and flows (sans-IO, `orchestrator.store.effects`): written once, run by
the sync and asyncio runners alike (`Client`, `AsyncClient`, the beat).

    keys.SCHEDULES              hash: name -> the `Schedule` JSON
    keys.schedule_state(name)   hash: what the beat did (`ScheduleState` fields)
    keys.schedule_runs(name)    list: the last runs' turn ids, newest first (SCHEDULE_RUNS_KEPT)
    keys.BEAT_LEASE             the active beat's id, with a TTL it renews

Saving a schedule checks its request exactly as a submit does, before anything is stored: the request's own
rules, the caller's model check (`submit_checks.check_submit`), its tools against the catalogue. A run is
submitted by `flows.submit` itself, so the checks run again then (a tool gone since is the run's error).

The beat's lease reuses the turn leases' scripts: taken with SET NX PX, renewed by `renew.lua` only while it
holds our id, released by `release.lua` only while it does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import UnknownTurnError
from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.schedules.schedule import (
    OverlapDecision,
    Schedule,
    ScheduleState,
    ScheduleView,
    Tick,
    TickResult,
    build_due,
    build_next_run_at,
    build_overlap_decision,
    build_run_request,
    build_run_turn_id,
    dump_schedule,
    parse_schedule,
)
from orchestrator.store import codec, flows, operations
from orchestrator.store.catalogue import RecentCatalogue, ToolCatalogue, get_tool_catalogue
from orchestrator.store.effects import Flow, RedisCommand, ScriptCall, Transaction
from orchestrator.store.scripts import RELEASE, RENEW, ReleaseResult
from workers import keys

# The state hash's fields a replaced schedule forgets: its new timing starts afresh. Its last run stays, so
# that the overlap policy still sees a run of the old definition that has not finished.
_RESET_FIELDS = ("last_tick_at", "last_error", "last_error_at")


def check_request(
    request: TurnRequest,
    now: float,
    *,
    check: flows.SubmitCheck | None,
    recent: RecentCatalogue | None = None,
    tool_gone_after_s: float = keys.TOOL_GONE_AFTER_S,
) -> Flow[None]:
    """The checks `flows.submit` makes of a request, without storing it: its own rules, `check` (its
    models), its tools served now or within `tool_gone_after_s` (`UnknownToolError`), its client tools."""
    codec.check_turn_request(request)
    if check is not None:
        check(request)
    if request.tools or request.client_tools:
        requested = request.tools or []
        catalogue = recent.serving(requested, now, tool_gone_after_s) if recent is not None else None
        if catalogue is None:
            tools: ToolCatalogue = yield get_tool_catalogue(now)
            if recent is not None:
                recent.keep(tools, now)
            catalogue = tools.known(now, tool_gone_after_s)
        flows.check_tool_names(request.tools, catalogue)
        flows.check_client_tools(request, catalogue)


def save_schedule(
    schedule: Schedule,
    *,
    check: flows.SubmitCheck | None,
    recent: RecentCatalogue | None = None,
    tool_gone_after_s: float = keys.TOOL_GONE_AFTER_S,
) -> Flow[bool]:
    """Check the schedule's request as a submit would, then store the schedule (replacing one of that name,
    whose timing starts afresh); True when it replaced one."""
    yield from check_request(
        schedule.request, schedule.created_at, check=check, recent=recent, tool_gone_after_s=tool_gone_after_s
    )
    replies: list[Any] = yield Transaction(
        (
            ("HSET", keys.SCHEDULES, schedule.name, dump_schedule(schedule)),
            ("HDEL", keys.schedule_state(schedule.name), *_RESET_FIELDS),
        ),
        lambda replies: replies,
    )
    return int(replies[0]) == 0


def delete_schedule(name: str) -> Transaction[bool]:
    """Remove a schedule, its state and its runs list (the runs' turns stay); False when there was none."""
    return Transaction(
        (("HDEL", keys.SCHEDULES, name), ("DEL", keys.schedule_state(name), keys.schedule_runs(name))),
        lambda replies: int(replies[0]) == 1,
    )


def parse_state(fields: Mapping[Any, Any], runs: Sequence[Any]) -> ScheduleState:
    """A `ScheduleState` from its hash and its runs list (either may be empty)."""
    values = codec.parse_fields(fields)

    def number(name: str) -> float | None:
        return float(values[name]) if values.get(name) else None

    return ScheduleState(
        last_tick_at=number("last_tick_at"),
        last_run_at=number("last_run_at"),
        last_turn_id=values.get("last_turn_id") or None,
        runs=[codec.text(turn_id) for turn_id in runs],
        skipped=int(values.get("skipped") or 0),
        last_skipped_at=number("last_skipped_at"),
        last_error=values.get("last_error") or None,
        last_error_at=number("last_error_at"),
    )


def get_schedules() -> RedisCommand[dict[str, Schedule]]:
    """Every schedule, by name."""

    def parse(reply: Mapping[Any, Any]) -> dict[str, Schedule]:
        return {codec.text(name): parse_schedule(value) for name, value in (reply or {}).items()}

    return RedisCommand(("HGETALL", keys.SCHEDULES), parse)


def get_states(names: Sequence[str]) -> Transaction[dict[str, ScheduleState]]:
    """The state of each named schedule, read together."""
    ordered = list(names)
    commands: list[tuple[str | int | float, ...]] = []
    for name in ordered:
        commands.append(("HGETALL", keys.schedule_state(name)))
        commands.append(("LRANGE", keys.schedule_runs(name), 0, -1))

    def parse(replies: list[Any]) -> dict[str, ScheduleState]:
        return {
            name: parse_state(replies[2 * i] or {}, replies[2 * i + 1] or [])
            for i, name in enumerate(ordered)
        }

    return Transaction(tuple(commands), parse)


def list_schedules(now: float) -> Flow[list[ScheduleView]]:
    """Every schedule with its state and next run, by name."""
    schedules: dict[str, Schedule] = yield get_schedules()
    if not schedules:
        return []
    states: dict[str, ScheduleState] = yield get_states(sorted(schedules))
    return [
        ScheduleView(
            schedule=schedules[name],
            state=states[name],
            next_run_at=build_next_run_at(schedules[name], states[name], now),
        )
        for name in sorted(schedules)
    ]


def get_schedule_with_state(name: str) -> Flow[tuple[Schedule, ScheduleState] | None]:
    """One schedule and its state, read afresh; None when it has been removed."""
    schedules: dict[str, Schedule] = yield get_schedules()
    schedule = schedules.get(name)
    if schedule is None:
        return None
    states: dict[str, ScheduleState] = yield get_states([name])
    return schedule, states[name]


def get_previous_status(state: ScheduleState) -> Flow[TurnStatus | None]:
    """The status of the schedule's last run; None when it had none or the run has expired."""
    if state.last_turn_id is None:
        return None
    status: TurnStatus | None = yield operations.get_status(state.last_turn_id)
    return status


def record_run(name: str, turn_id: str, now: float) -> Transaction[None]:
    """A tick ran: its turn is the schedule's last run, first in its runs list."""
    state = keys.schedule_state(name)
    return Transaction(
        (
            ("HSET", state, "last_tick_at", repr(now), "last_run_at", repr(now), "last_turn_id", turn_id),
            ("HDEL", state, "last_error", "last_error_at"),
            ("LPUSH", keys.schedule_runs(name), turn_id),
            ("LTRIM", keys.schedule_runs(name), 0, keys.SCHEDULE_RUNS_KEPT - 1),
        ),
        lambda _: None,
    )


def record_skip(name: str, now: float) -> Transaction[None]:
    """A tick was skipped: the previous run had not finished (overlap `skip`)."""
    state = keys.schedule_state(name)
    return Transaction(
        (
            ("HSET", state, "last_tick_at", repr(now), "last_skipped_at", repr(now)),
            ("HINCRBY", state, "skipped", 1),
        ),
        lambda _: None,
    )


def record_error(name: str, error: str, now: float) -> RedisCommand[None]:
    """A tick submitted nothing, for `error`: it counts as handled (no retry every second), and says why."""
    args = ("last_tick_at", repr(now), "last_error", error, "last_error_at", repr(now))
    return RedisCommand(("HSET", keys.schedule_state(name), *args), lambda _: None)


def take_lease(beat_id: str, ttl_ms: int) -> Flow[bool]:
    """Hold the beat lease: renew it if `beat_id` holds it, else take it if nobody does; True when held."""
    lost: set[int] = yield ScriptCall(RENEW, (keys.BEAT_LEASE,), (beat_id, str(ttl_ms)), _parse_lost)
    if not lost:
        return True
    taken: bool = yield RedisCommand(("SET", keys.BEAT_LEASE, beat_id, "NX", "PX", ttl_ms), bool)
    return taken


def release_lease(beat_id: str) -> ScriptCall[bool]:
    """Give the lease up if `beat_id` holds it, so that a standby takes over at once."""
    return ScriptCall(
        RELEASE, (keys.BEAT_LEASE,), (beat_id,), lambda reply: int(reply) == ReleaseResult.RELEASED
    )


def get_lease_holder() -> RedisCommand[str | None]:
    """The id of the active beat; None when no beat holds the lease."""
    return RedisCommand(("GET", keys.BEAT_LEASE), lambda reply: None if reply is None else codec.text(reply))


def _parse_lost(reply: Any) -> set[int]:
    return {int(index) for index in reply or []}


def run_due(
    name: str,
    now: float,
    *,
    check: flows.SubmitCheck | None,
    tool_gone_after_s: float = keys.TOOL_GONE_AFTER_S,
) -> Flow[Tick]:
    """Handle the schedule's due tick, if it is still due when read afresh: skip it, or cancel the previous
    run, and submit the run (`flows.submit`, checked again), linked to the schedule; record what happened.

    A submit the checks refuse (a tool gone, a model refused: a `ValueError`) is the tick's error, recorded
    and logged by the caller, never retried before the next tick. Redis errors propagate."""
    found = yield from get_schedule_with_state(name)
    if found is None:
        return Tick(TickResult.GONE)
    schedule, state = found
    due = build_due(schedule, state.last_tick_at, now)
    if not due.is_due:
        # Another beat handled it (a takeover), or it was replaced since this beat read it.
        return Tick(TickResult.NOT_DUE)
    previous = yield from get_previous_status(state)
    decision = build_overlap_decision(schedule.overlap, previous)
    if decision is OverlapDecision.SKIP:
        yield record_skip(name, now)
        return Tick(TickResult.SKIPPED, previous=state.last_turn_id)
    if decision is OverlapDecision.CANCEL_PREVIOUS and state.last_turn_id is not None:
        # A run that expired since its status was read has nothing left to cancel.
        with contextlib.suppress(UnknownTurnError):
            yield from flows.send_control(state.last_turn_id, "cancel", None, None, now)
    turn_id = build_run_turn_id(schedule, due.run_at)
    try:
        yield from flows.submit(
            build_run_request(schedule), turn_id, now, check=check, tool_gone_after_s=tool_gone_after_s
        )
    except ValueError as exc:
        yield record_error(name, str(exc), now)
        return Tick(TickResult.FAILED, error=str(exc))
    yield record_run(name, turn_id, now)
    cancelled = state.last_turn_id if decision is OverlapDecision.CANCEL_PREVIOUS else None
    return Tick(TickResult.SUBMITTED, turn_id=turn_id, previous=cancelled)
