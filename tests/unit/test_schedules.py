"""The pure rules of scheduled turns: checking a schedule, its run times (interval grid, cron in UTC), when a
run is due (one catch-up run at most), the overlap decisions, a run's turn id and request."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.schedules.calls import build_schedule_call
from orchestrator.schedules.schedule import (
    OverlapDecision,
    Schedule,
    build_due,
    build_next_run_s,
    build_overlap_decision,
    build_run_request,
    build_run_turn_id,
    build_schedule,
    dump_schedule,
    parse_schedule,
)

pytestmark = pytest.mark.timeout(10)

REQUEST = TurnRequest(prompt="report")
T0 = datetime(2026, 1, 1, 0, 3, 20, tzinfo=UTC).timestamp()


def every(seconds: float) -> Schedule:
    return build_schedule("tick", REQUEST, cron=None, every_s=seconds, overlap="skip", now=T0)


def cron(expression: str) -> Schedule:
    return build_schedule("nightly", REQUEST, cron=expression, every_s=None, overlap="skip", now=T0)


@pytest.mark.parametrize(
    ("after", "expected"),
    [(T0, T0 + 60), (T0 + 59.9, T0 + 60), (T0 + 60, T0 + 120), (T0 + 3600.5, T0 + 3660), (T0 - 500, T0 + 60)],
)
def test_an_interval_runs_on_a_grid_from_its_creation(after: float, expected: float) -> None:
    assert build_next_run_s(every(60), after) == pytest.approx(expected)


def test_a_cron_expression_is_read_in_utc() -> None:
    five = cron("*/5 * * * *")
    assert build_next_run_s(five, T0) == datetime(2026, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    at_five = datetime(2026, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    assert build_next_run_s(five, at_five) == datetime(2026, 1, 1, 0, 10, tzinfo=UTC).timestamp()
    nightly = cron("0 2 * * *")
    assert build_next_run_s(nightly, T0) == datetime(2026, 1, 1, 2, 0, tzinfo=UTC).timestamp()


def test_a_run_is_due_from_its_run_time_on() -> None:
    schedule = every(60)
    assert not build_due(schedule, None, T0 + 30).is_due
    assert build_due(schedule, None, T0 + 30).next_in_s == pytest.approx(30)
    due = build_due(schedule, None, T0 + 60)
    assert (due.is_due, due.run_at, due.next_in_s) == (True, T0 + 60, pytest.approx(60))


def test_ticks_missed_while_no_beat_ran_make_one_catch_up_run() -> None:
    schedule = every(60)
    day_later = T0 + 86_400 + 10
    due = build_due(schedule, T0 + 60, day_later)
    assert due.is_due and due.run_at == T0 + 120  # the first missed run, once
    # Handled now: the next run is the grid's next after now, not the 1,400 missed in between.
    assert not build_due(schedule, day_later, day_later + 1).is_due
    assert build_due(schedule, day_later, day_later).run_at == pytest.approx(T0 + 86_400 + 60)


@pytest.mark.parametrize(
    ("overlap", "previous", "decision"),
    [
        ("skip", None, OverlapDecision.RUN),
        ("skip", TurnStatus.COMPLETED, OverlapDecision.RUN),
        ("skip", TurnStatus.FAILED, OverlapDecision.RUN),
        ("skip", TurnStatus.RUNNING, OverlapDecision.SKIP),
        ("skip", TurnStatus.QUEUED, OverlapDecision.SKIP),
        ("skip", TurnStatus.WAITING, OverlapDecision.SKIP),
        ("queue", TurnStatus.RUNNING, OverlapDecision.RUN),
        ("queue", TurnStatus.CANCELLED, OverlapDecision.RUN),
        ("cancel_previous", TurnStatus.RUNNING, OverlapDecision.CANCEL_PREVIOUS),
        ("cancel_previous", TurnStatus.WAITING, OverlapDecision.CANCEL_PREVIOUS),
        ("cancel_previous", TurnStatus.STOPPED, OverlapDecision.RUN),
        ("cancel_previous", None, OverlapDecision.RUN),
    ],
)
def test_overlap_decisions(overlap: str, previous: TurnStatus | None, decision: OverlapDecision) -> None:
    assert build_overlap_decision(overlap, previous) is decision  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"cron": "* * *"}, "invalid cron expression '* * *'"),
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({}, "give exactly one of cron, every_s"),
        ({"cron": "* * * * *", "every_s": 60}, "give exactly one of cron, every_s"),
        ({"every_s": 0.5}, "every_s must be at least 1 s"),
        ({"every_s": 60, "overlap": "allow"}, "unknown overlap policy 'allow'"),
    ],
)
def test_a_bad_schedule_is_refused_with_a_clear_message(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        build_schedule_call("name", prompt="hi", **arguments)  # type: ignore[arg-type]


def test_a_schedule_takes_the_arguments_of_submit_checked_as_a_submit() -> None:
    with pytest.raises(ValueError, match="'tools' is a list of tool names"):
        build_schedule_call("n", every_s=60, prompt="hi", tools="search")
    with pytest.raises(ValueError, match="turn ids from the beat"):
        build_schedule_call("n", every_s=60, prompt="hi", turn_id="t1")
    with pytest.raises(ValueError, match="invalid schedule name"):
        build_schedule_call("two words", every_s=60, prompt="hi")
    schedule = build_schedule_call(
        "n", every_s=60, prompt="hi", tools=["search"], limits={"max_llm_calls": 2}
    )
    assert (schedule.request.tools, schedule.request.limits.max_llm_calls) == (["search"], 2)


def test_a_run_is_linked_to_its_schedule_and_its_id_is_the_same_from_any_beat() -> None:
    schedule = every(60)
    assert build_run_request(schedule).schedule == "tick"
    assert schedule.request.schedule is None
    assert build_run_turn_id(schedule, T0 + 60) == build_run_turn_id(
        parse_schedule(dump_schedule(schedule)), T0 + 60
    )
    assert build_run_turn_id(schedule, T0 + 60) != build_run_turn_id(schedule, T0 + 120)


def test_a_stored_schedule_reads_back_and_ignores_request_fields_a_newer_release_added() -> None:
    schedule = cron("0 2 * * *")
    assert parse_schedule(dump_schedule(schedule)) == schedule
    newer = dump_schedule(schedule).replace('"prompt"', '"future_field": 1, "prompt"')
    assert parse_schedule(newer) == schedule
    with pytest.raises(ValueError, match="newer than this release"):
        parse_schedule(dump_schedule(schedule).replace('"version": 1', '"version": 2'))
