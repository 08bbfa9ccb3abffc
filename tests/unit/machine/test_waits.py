"""Waiting for a person is not running: the paused clock, each wait's own limit and what happens when it
passes, who answered, the `call_waiting` event and the one attention request, and when a turn may park."""

from __future__ import annotations

import json

import pytest

from orchestrator.machine import parkable, resume
from orchestrator.machine.events import ApprovalGiven, AskAttention, TimerFired, ToolFinished
from orchestrator.machine.state import DEADLINE_TIMER, dump_state, wait_timer_id
from orchestrator.model import DEFAULT_APPROVAL_TIMEOUT_S, Limits
from tests.unit.machine.harness import CATALOGUE, Driver, answer, calls, of_type, ok
from workers.contract import FailureKind, ToolSpec

pytestmark = pytest.mark.timeout(30)


def waiting(limits: Limits | None = None, catalogue: dict[str, ToolSpec] | None = None) -> Driver:
    driver = Driver(limits=limits, catalogue=catalogue)
    driver.respond(calls(("delete", {"id": 1})), at=1001.0)
    return driver


def test_waiting_pauses_the_running_clock_and_the_deadline_moves_out_by_the_wait() -> None:
    driver = waiting(Limits(deadline_s=5))
    state = driver.state
    assert state.paused_at == 1001.0
    assert DEADLINE_TIMER not in state.timers  # nothing runs: no deadline fires while a person decides
    assert state.timers[wait_timer_id("call_0")] == 1001.0 + DEFAULT_APPROVAL_TIMEOUT_S
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1016.0))
    (dispatch,) = driver.dispatched()
    # 4 s of running time were left at the pause (deadline 1005); the 15 s wait does not count.
    assert dispatch.deadline_at == pytest.approx(1020.0)
    assert driver.state.paused_at is None
    assert driver.state.timers[DEADLINE_TIMER] == pytest.approx(1020.0)
    assert wait_timer_id("call_0") not in driver.state.timers
    assert driver.emitted("deadline_moved")[0]["paused_s"] == pytest.approx(15.0)
    driver.finish(ok("call_0", "delete"), at=1017.0)
    driver.respond(answer("done"), at=1018.0)
    assert driver.outcome.status == "completed"


def test_a_parallel_call_keeps_the_clock_running() -> None:
    driver = Driver(limits=Limits(deadline_s=5))
    driver.respond(calls(("delete", {"id": 1}), ("add", {"a": 1, "b": 2})), at=1001.0)
    assert driver.state.paused_at is None
    assert parkable(driver.state) is None
    driver.finish(ok("call_1", "add"), at=1002.0)
    assert driver.state.paused_at == 1002.0  # from here on the turn only waits
    assert parkable(driver.state) == 1001.0 + DEFAULT_APPROVAL_TIMEOUT_S


def test_no_answer_in_time_is_a_denial_the_model_reads_and_the_turn_goes_on() -> None:
    driver = waiting(Limits(approval_timeout_s=3))
    assert parkable(driver.state) == 1004.0
    driver.feed(TimerFired(timer_id=wait_timer_id("call_0"), at=1004.0))
    (denial,) = driver.writes()
    assert denial.failure_kind is FailureKind.CONFIRMATION_DENIED
    assert denial.synthetic
    assert denial.content == "Error: no one approved the call within 3 s; it was not run"
    driver.echo_writes(at=1004.0)
    assert driver.state.stop is None  # the stop-on-denial policy is for a person's denial only
    assert driver.call_model()
    driver.respond(answer("no refund then"), at=1005.0)
    outcome = driver.outcome
    assert outcome.status == "completed"
    (decision,) = outcome.approvals
    assert (decision.approved, decision.timed_out, decision.decided_by) == (False, True, None)
    assert decision.waited_s == pytest.approx(3.0)


def test_a_tool_may_run_its_calls_when_no_one_answered() -> None:
    lenient = ToolSpec(
        name="delete", requires_confirmation=True, approval_timeout_s=2, on_approval_timeout="approve"
    )
    driver = waiting(catalogue={**CATALOGUE, "delete": lenient})
    assert driver.state.timers[wait_timer_id("call_0")] == 1003.0
    driver.feed(TimerFired(timer_id=wait_timer_id("call_0"), at=1003.0))
    assert [d.call_id for d in driver.dispatched()] == ["call_0"]
    assert driver.emitted("approval_timed_out")[0]["approved"] is True


def test_the_turn_limits_come_before_the_tool_settings() -> None:
    lenient = ToolSpec(
        name="delete", requires_confirmation=True, approval_timeout_s=2, on_approval_timeout="approve"
    )
    limits = Limits(approval_timeout_s=60, on_approval_timeout="deny")
    driver = waiting(limits, catalogue={**CATALOGUE, "delete": lenient})
    call = driver.state.current.calls[0] if driver.state.current else None
    assert call is not None and call.wait is not None
    assert (call.wait.deadline_at, call.wait.on_timeout) == (1061.0, "deny")


def test_who_answered_and_why_are_kept_to_the_outcome() -> None:
    driver = waiting()
    driver.feed(
        ApprovalGiven(call_id="call_0", approved=False, at=1009.0, decided_by="ana", reason="too big")
    )
    given = driver.emitted("approval_given")[0]
    assert (given["decided_by"], given["reason"], given["waited_s"]) == ("ana", "too big", 8.0)
    driver.echo_writes(at=1009.0)
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason) == ("stopped", "confirmation_denied")
    (decision,) = outcome.approvals
    assert (decision.decided_by, decision.reason, decision.approved, decision.timed_out) == (
        "ana",
        "too big",
        False,
        False,
    )


def test_a_waiting_call_is_announced_once_and_never_again_on_resume() -> None:
    driver = waiting(Limits(approval_timeout_s=30))
    (waiting_event,) = driver.emitted("call_waiting")
    assert waiting_event == {
        "turn_id": "turn1",
        "call_id": "call_0",
        "tool": "delete",
        "arguments": {"id": 1},
        "waiting_for": "approval",
        "wait_deadline": 1031.0,
        "on_timeout": "deny",
    }
    (ask,) = of_type(driver.log, AskAttention)
    assert [c.call_id for c in ask.calls] == ["call_0"]
    _, again = resume(driver.state, at=1002.0)
    assert not of_type(again, AskAttention)


def test_a_cancel_while_waiting_ends_the_turn() -> None:
    driver = waiting()
    driver.feed(ApprovalGiven(call_id="call_9", approved=True, at=1002.0))  # no such call: nothing moves
    assert driver.state.paused_at == 1001.0
    from orchestrator.machine.events import CancelRequested

    driver.feed(CancelRequested(at=1003.0))
    for outcome in driver.writes():
        driver.feed(ToolFinished(outcome=outcome, at=1003.0))
    assert driver.outcome.status == "cancelled"
    assert not driver.state.timers


def test_an_ordinary_turn_writes_none_of_the_wait_fields() -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add"))
    driver.respond(answer("3"))
    stored = json.loads(dump_state(driver.state))
    assert "paused_at" not in stored and "approvals" not in stored
    assert "approvals" not in json.dumps(stored.get("outcome", {}))
