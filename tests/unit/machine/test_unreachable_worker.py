"""The lost-call rule with a worker that may still deliver: `lost_wait_s` (TOOLLOOP_LOST_CALL_WAIT_S).

`fetch` has a 20 s hard limit and one retry; the grace is 5 s and the wait 30 s: a call started at 1002 is
looked at 1027 (hard limit + grace) and found lost at 1057 at the latest."""

from __future__ import annotations

import pytest

from orchestrator.machine.events import ArmTimer, CheckWorker, TimerFired, ToolStarted, WorkerChecked
from orchestrator.machine.loop import resume
from orchestrator.machine.state import lost_timer_id
from orchestrator.model import ToolMessage
from tests.unit.machine.harness import Driver, calls, of_type, ok
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)

STARTED_AT = 1002.0
LOOKED_AT = STARTED_AT + 20.0 + 5.0
WAIT_ENDS_AT = LOOKED_AT + 30.0
TIMER = lost_timer_id("call_0", 1)


def started(wait_s: float = 30.0, worker: str | None = "w1") -> Driver:
    driver = Driver()
    driver.state = driver.state.model_copy(update={"lost_wait_s": wait_s})
    driver.respond(calls(("fetch", {})))
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker=worker, at=STARTED_AT))
    return driver


def checked(driver: Driver, seen_at: float | None, at: float = LOOKED_AT + 0.1) -> None:
    driver.feed(WorkerChecked(call_id="call_0", attempt=1, worker="w1", seen_at=seen_at, at=at))


def test_the_first_look_asks_for_the_worker_and_keeps_the_timer_at_the_end_of_the_wait() -> None:
    driver = started()
    commands = driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    assert of_type(commands, CheckWorker) == [CheckWorker(call_id="call_0", attempt=1, worker="w1")]
    assert of_type(commands, ArmTimer) == [ArmTimer(timer_id=TIMER, at=WAIT_ENDS_AT)]
    assert driver.writes(commands) == [] and driver.dispatched(commands) == []
    # A new owner re-arms the timer: the wait ends even if the answer to the check is lost.
    _, resumed = resume(driver.state, at=LOOKED_AT + 1)
    assert ArmTimer(timer_id=TIMER, at=WAIT_ENDS_AT) in resumed


@pytest.mark.parametrize("seen_at", [None, STARTED_AT + 10.0])
def test_a_worker_not_heard_from_since_the_hard_limit_is_waited_for_and_its_result_wins(
    seen_at: float | None,
) -> None:
    driver = started()
    driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    checked(driver, seen_at)
    assert driver.last == [c for c in driver.last if c.kind == "emit"]  # nothing but the event
    [unreachable] = driver.emitted("tool_worker_unreachable")
    assert unreachable["worker"] == "w1" and unreachable["wait_until"] == WAIT_ENDS_AT
    driver.finish(ok("call_0", "fetch", "it ran"), at=LOOKED_AT + 20.0)  # the spool drained on return
    assert [m.content for m in driver.state.history if isinstance(m, ToolMessage)] == ["it ran"]
    assert set(driver.state.timers) == {"deadline"}


def test_a_worker_heard_from_after_the_hard_limit_has_nothing_more_the_call_is_lost_now() -> None:
    driver = started()
    assert driver.state.current is not None
    first_task = driver.state.current.calls[0].task_id
    driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    checked(driver, STARTED_AT + 20.0)
    [redispatch] = driver.dispatched()
    assert (redispatch.attempt, redispatch.task_id != first_task) == (2, True)
    assert TIMER not in driver.state.timers


def test_the_end_of_the_wait_finds_the_call_lost_and_says_why() -> None:
    driver = started()
    driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    checked(driver, None)
    driver.feed(TimerFired(timer_id=TIMER, at=WAIT_ENDS_AT))
    assert [d.attempt for d in driver.dispatched()] == [2]  # the retry
    driver.feed(ToolStarted(call_id="call_0", attempt=2, worker="w2", at=1060.0))
    second = lost_timer_id("call_0", 2)
    driver.feed(TimerFired(timer_id=second, at=1085.0))
    driver.feed(WorkerChecked(call_id="call_0", attempt=2, worker="w2", seen_at=None, at=1085.1))
    driver.feed(TimerFired(timer_id=second, at=1115.0))
    [lost] = driver.writes()
    assert (lost.failure_kind, lost.synthetic, lost.attempts) == (FailureKind.WORKER_LOST, True, 2)
    assert "no outcome 55 s after it started, and its worker was not heard from" in lost.content


@pytest.mark.parametrize(
    "event",
    [
        WorkerChecked(call_id="call_0", attempt=2, worker="w1", seen_at=2000.0, at=LOOKED_AT),
        WorkerChecked(call_id="other", attempt=1, worker="w1", seen_at=2000.0, at=LOOKED_AT),
    ],
)
def test_a_check_of_another_attempt_or_call_changes_nothing(event: WorkerChecked) -> None:
    driver = started()
    driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    before = driver.state
    assert driver.feed(event) == []
    assert driver.state == before


def test_a_check_that_comes_after_the_outcome_changes_nothing() -> None:
    driver = started()
    driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    driver.finish(ok("call_0", "fetch"), at=LOOKED_AT + 0.05)
    checked(driver, STARTED_AT + 30.0)
    assert driver.writes() == [] and driver.dispatched() == []


def test_without_a_wait_the_call_is_lost_at_hard_limit_plus_grace() -> None:
    driver = started(wait_s=0.0)
    commands = driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    assert not of_type(commands, CheckWorker)
    assert [d.attempt for d in driver.dispatched(commands)] == [2]


def test_a_start_that_names_no_worker_waits_without_a_check() -> None:
    driver = started(worker=None)
    commands = driver.feed(TimerFired(timer_id=TIMER, at=LOOKED_AT))
    assert not of_type(commands, CheckWorker)
    assert driver.state.timers[TIMER] == WAIT_ENDS_AT
