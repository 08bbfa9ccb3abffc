"""Limits, stop policies, the one stop path, confirmation, cancel."""

from __future__ import annotations

import pytest

from orchestrator.machine.events import (
    ApprovalGiven,
    AwaitApproval,
    CallModel,
    CancelRequested,
    Revoke,
    TimerFired,
    ToolFinished,
)
from orchestrator.machine.state import TurnState
from orchestrator.model import AssistantMessage, Limits, ToolCall, ToolMessage, TurnStatus
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok
from workers.contract import FailureKind, build_failure

pytestmark = pytest.mark.timeout(30)


def tool_messages(driver: Driver) -> list[ToolMessage]:
    return [m for m in driver.state.history if isinstance(m, ToolMessage)]


def fail(
    call_id: str, tool: str, message: str, kind: FailureKind = FailureKind.EXECUTION_ERROR
) -> ToolFinished:
    return ToolFinished(outcome=build_failure((call_id, tool, "turn1"), kind, message), at=1001.0)


# --- limits ---------------------------------------------------------------------------------------------


def test_max_llm_calls_stops_before_the_next_model_call() -> None:
    driver = Driver(limits=Limits(max_llm_calls=2))
    for round_index in range(2):
        driver.respond(calls(("add", {"a": round_index, "b": 1}), prefix=f"r{round_index}"))
        driver.finish(ok(f"r{round_index}_0", "add", "1"))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "max_llm_calls", True)
    assert outcome.llm_calls == 2
    closing = driver.state.history[-1]
    assert isinstance(closing, AssistantMessage) and not closing.tool_calls
    assert closing.content == "Stopped: the limit of 2 model calls was reached."
    assert outcome.text == closing.content


def test_max_tool_executions_is_never_overshot() -> None:
    driver = Driver(limits=Limits(max_tool_executions=2))
    driver.respond(calls(("slow", {}), ("nope", {}), ("add", {"a": 1, "b": 1}), ("fetch", {})))
    # The rejected call uses no slot; the fourth call is past the limit.
    assert [d.call_id for d in driver.dispatched()] == ["call_0", "call_2"]
    written = {o.call_id: o for o in driver.writes()}
    assert written["call_1"].failure_kind is FailureKind.NOT_FOUND
    assert written["call_3"].failure_kind is FailureKind.SKIPPED and written["call_3"].synthetic
    driver.echo_writes()
    driver.finish(ok("call_2", "add"))
    assert driver.state.outcome is None  # a soft stop waits for the calls in flight
    driver.finish(ok("call_0", "slow"))
    outcome = driver.outcome
    assert (outcome.stop_reason, outcome.limit_reached, outcome.tool_executions) == (
        "max_tool_executions",
        True,
        2,
    )
    assert [m.failure_kind for m in tool_messages(driver)] == [
        None,
        FailureKind.NOT_FOUND,
        None,
        FailureKind.SKIPPED,
    ]


def test_reaching_max_tool_executions_exactly_lets_the_model_answer() -> None:
    driver = Driver(limits=Limits(max_tool_executions=1))
    driver.respond(calls(("slow", {})))
    driver.finish(ok("call_0", "slow"))
    driver.respond(answer("done"))
    assert driver.outcome.status == "completed"


def test_zero_tool_executions_skips_every_call() -> None:
    driver = Driver(limits=Limits(max_tool_executions=0))
    driver.respond(calls(("slow", {})))
    assert driver.dispatched() == []
    driver.echo_writes()
    assert driver.outcome.stop_reason == "max_tool_executions"


def test_max_tool_rounds() -> None:
    driver = Driver(limits=Limits(max_tool_rounds=1))
    driver.respond(calls(("slow", {})))
    driver.finish(ok("call_0", "slow"))
    driver.respond(calls(("slow", {"x": 1}), prefix="r2"))
    assert driver.dispatched() == []
    assert [o.failure_kind for o in driver.writes()] == [FailureKind.SKIPPED]
    driver.echo_writes()
    assert (driver.outcome.stop_reason, driver.outcome.limit_reached) == ("max_tool_rounds", True)


def test_deadline_while_calls_are_in_flight_revokes_and_synthesises() -> None:
    driver = Driver(limits=Limits(deadline_s=10))
    driver.respond(calls(("slow", {}), ("delete", {}), ("add", {"a": 1, "b": 1})))
    task_ids = [d.task_id for d in driver.dispatched()]
    driver.finish(ok("call_2", "add"))
    commands = driver.feed(TimerFired(timer_id="deadline", at=1010.0))
    [revoke] = of_type(commands, Revoke)
    assert revoke.task_ids == [task_ids[0]]
    written = {o.call_id: o for o in driver.writes()}
    assert set(written) == {"call_0", "call_1"}  # the waiting one too; the answered one keeps its outcome
    assert all(o.failure_kind is FailureKind.DEADLINE_EXCEEDED and o.synthetic for o in written.values())
    assert "did not finish before the turn's deadline of 10 s" in written["call_0"].content
    assert "did not run" in written["call_1"].content
    driver.echo_writes(at=1010.1)
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "deadline", True)
    assert [m.synthetic for m in tool_messages(driver)] == [True, True, False]
    assert driver.emitted("tool_synthesized")


def test_deadline_while_the_model_is_called_finishes_at_once() -> None:
    driver = Driver(limits=Limits(deadline_s=5))
    driver.feed(TimerFired(timer_id="deadline", at=1005.0))
    assert driver.outcome.stop_reason == "deadline"
    # The answer to the abandoned call changes nothing.
    assert driver.respond(answer("late")) == []


def test_a_response_after_the_deadline_dispatches_nothing() -> None:
    driver = Driver(limits=Limits(deadline_s=5))
    driver.respond(calls(("slow", {})), at=1006.0)
    assert driver.dispatched() == []
    assert [o.failure_kind for o in driver.writes()] == [FailureKind.DEADLINE_EXCEEDED]
    driver.echo_writes(at=1006.0)
    assert driver.outcome.stop_reason == "deadline"


def test_a_real_outcome_that_wins_the_race_against_a_synthetic_one_is_kept() -> None:
    driver = Driver(limits=Limits(deadline_s=10))
    driver.respond(calls(("slow", {})))
    driver.feed(TimerFired(timer_id="deadline", at=1010.0))
    [synthetic] = driver.writes()
    real = ok("call_0", "slow", "made it")
    driver.finish(real, at=1010.0)  # the worker's write won; the runtime feeds back the winner
    assert [m.content for m in tool_messages(driver)] == ["made it"]
    driver.finish(synthetic, at=1010.1)  # the lost synthetic, delivered anyway: audit only
    assert [late.outcome for late in driver.state.late_outcomes] == [synthetic]
    assert driver.outcome.stop_reason == "deadline"


# --- stop policies --------------------------------------------------------------------------------------


def deny_fetch(call: ToolCall, state: TurnState) -> str | None:
    return "no network" if call.name == "fetch" else None


def test_policy_hook_denies_and_stops() -> None:
    driver = Driver(policy=deny_fetch)
    driver.respond(calls(("add", {"a": 1, "b": 1}), ("fetch", {})))
    assert driver.dispatched() == []
    written = {o.call_id: o for o in driver.writes()}
    assert written["call_1"].failure_kind is FailureKind.POLICY_DENIED and not written["call_1"].synthetic
    assert "no network" in written["call_1"].content
    assert written["call_0"].failure_kind is FailureKind.SKIPPED
    driver.echo_writes()
    assert (driver.outcome.status, driver.outcome.stop_reason) == ("stopped", "policy_denied")


def test_policy_denial_without_stop_lets_the_model_see_it() -> None:
    driver = Driver(policy=deny_fetch, limits=Limits(stop_on_policy_denied=False))
    driver.respond(calls(("add", {"a": 1, "b": 1}), ("fetch", {})))
    assert [d.call_id for d in driver.dispatched()] == ["call_0"]
    driver.echo_writes()
    driver.finish(ok("call_0", "add"))
    assert of_type(driver.last, CallModel)


def test_stop_on_tool_failure_is_off_by_default_and_on_when_asked() -> None:
    off = Driver()
    off.respond(calls(("slow", {})))
    off.feed(fail("call_0", "slow", "boom"))
    assert of_type(off.last, CallModel)
    on = Driver(limits=Limits(stop_on_tool_failure=True))
    on.respond(calls(("slow", {})))
    on.feed(fail("call_0", "slow", "boom"))
    assert (on.outcome.stop_reason, on.outcome.limit_reached) == ("tool_failure", False)


def test_tool_failure_stop_waits_for_other_calls_and_skips_parked_ones() -> None:
    driver = Driver(limits=Limits(stop_on_tool_failure=True))
    driver.respond(calls(("slow", {}), ("add", {"a": 1, "b": 1}), ("delete", {})))
    driver.feed(fail("call_0", "slow", "boom"))
    assert [(o.call_id, o.failure_kind) for o in driver.writes()] == [("call_2", FailureKind.SKIPPED)]
    driver.echo_writes()
    assert driver.state.outcome is None
    driver.finish(ok("call_1", "add"))
    assert driver.outcome.stop_reason == "tool_failure"


def test_the_same_failure_twice_stops() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {"n": 1})))
    driver.feed(fail("call_0", "slow", "Disk full "))
    driver.respond(calls(("slow", {"n": 2}), prefix="r2"))
    driver.feed(fail("r2_0", "slow", "disk FULL"))
    assert driver.outcome.stop_reason == "repeated_failure"


def test_different_failures_do_not_count_as_repeated() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {"n": 1})))
    driver.feed(fail("call_0", "slow", "disk full"))
    driver.respond(calls(("slow", {"n": 2}), prefix="r2"))
    driver.feed(fail("r2_0", "slow", "network down"))
    assert of_type(driver.last, CallModel)


def test_repeat_guard_stops_the_third_identical_round() -> None:
    driver = Driver()
    for index in range(2):
        driver.respond(calls(("add", {"a": 1, "b": 2}), prefix=f"r{index}"))
        driver.finish(ok(f"r{index}_0", "add", "3"))
    driver.respond(calls(("add", {"b": 2, "a": 1}), prefix="r2"))
    assert driver.dispatched() == []
    driver.echo_writes()
    assert driver.outcome.stop_reason == "repeat_guard"
    assert driver.outcome.tool_executions == 2


def test_repeat_guard_counts_rounds_in_a_row_only() -> None:
    driver = Driver()
    for index, arguments in enumerate(
        [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 5, "b": 5}, {"a": 1, "b": 2}]
    ):
        driver.respond(calls(("add", arguments), prefix=f"r{index}"))
        assert driver.dispatched()
        driver.finish(ok(f"r{index}_0", "add"))
    assert driver.state.outcome is None


# --- confirmation ---------------------------------------------------------------------------------------


def test_confirmation_pauses_then_approval_dispatches() -> None:
    driver = Driver()
    driver.respond(calls(("delete", {"id": 1}), ("add", {"a": 1, "b": 1})))
    assert [d.call_id for d in driver.dispatched()] == ["call_1"]
    assert of_type(driver.last, AwaitApproval)[0].call_ids == ["call_0"]
    assert driver.state.status is TurnStatus.WAITING
    driver.finish(ok("call_1", "add"))
    assert driver.state.status is TurnStatus.WAITING
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1002.0))
    assert driver.state.status is TurnStatus.RUNNING
    assert [(d.call_id, d.attempt) for d in driver.dispatched()] == [("call_0", 1)]
    assert driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1002.0)) == []  # duplicate
    driver.finish(ok("call_0", "delete"))
    assert of_type(driver.last, CallModel)


def test_a_denial_is_a_confirmation_denied_outcome_and_stops() -> None:
    driver = Driver()
    driver.respond(calls(("delete", {"id": 1})))
    driver.feed(ApprovalGiven(call_id="call_0", approved=False, at=1002.0, reason="not today"))
    [written] = driver.writes()
    assert written.failure_kind is FailureKind.CONFIRMATION_DENIED and "not today" in written.content
    driver.echo_writes()
    assert (driver.outcome.status, driver.outcome.stop_reason) == ("stopped", "confirmation_denied")


def test_a_denial_without_stop_goes_on() -> None:
    driver = Driver(limits=Limits(stop_on_confirmation_denied=False))
    driver.respond(calls(("delete", {"id": 1})))
    driver.feed(ApprovalGiven(call_id="call_0", approved=False, at=1002.0))
    driver.echo_writes()
    assert of_type(driver.last, CallModel)
    assert driver.state.tool_executions == 0


# --- cancellation ---------------------------------------------------------------------------------------


def test_cancel_revokes_in_flight_calls() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {}), ("delete", {})))
    task_id = driver.dispatched()[0].task_id
    commands = driver.feed(CancelRequested(at=1003.0, reason="user left"))
    assert of_type(commands, Revoke)[0].task_ids == [task_id]
    assert {o.failure_kind for o in driver.writes()} == {FailureKind.CANCELLED}
    driver.echo_writes()
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("cancelled", "cancelled", False)
    assert driver.state.status is TurnStatus.CANCELLED


def test_cancel_while_the_model_is_called() -> None:
    driver = Driver()
    driver.feed(CancelRequested(at=1001.0))
    assert driver.outcome.status == "cancelled"
    assert driver.state.history[-1].role == "user"


def test_cancel_overrides_a_soft_stop_in_progress() -> None:
    driver = Driver(limits=Limits(max_tool_executions=1))
    driver.respond(calls(("slow", {}), ("slow", {"x": 1})))
    driver.echo_writes()
    driver.feed(CancelRequested(at=1002.0))
    driver.echo_writes()
    assert driver.outcome.stop_reason == "cancelled"


def lost(call_id: str, tool: str) -> ToolFinished:
    # What toolloop answers a call whose worker died under it.
    message = f"the worker running '{tool}' was lost (attempt 1 of 1)"
    outcome = build_failure((call_id, tool, "turn1"), FailureKind.WORKER_LOST, message)
    return ToolFinished(outcome=outcome.model_copy(update={"synthetic": True}), at=1001.0)


def test_calls_of_one_round_lost_together_are_one_failure_until_the_next_round_loses_one_again() -> None:
    # One worker crash took both: the model is told and asked again, not stopped for a repeated failure.
    driver = Driver()
    driver.respond(calls(("slow", {"n": 1}), ("slow", {"n": 2})))
    driver.feed(lost("call_0", "slow"))
    assert driver.state.outcome is None
    assert of_type(driver.feed(lost("call_1", "slow")), CallModel)
    driver.respond(calls(("slow", {"n": 3}), prefix="r2"))
    driver.feed(lost("r2_0", "slow"))
    assert driver.outcome.stop_reason == "repeated_failure"


def test_calls_of_one_round_that_fail_alike_on_their_own_still_repeat() -> None:
    # The tool's own failure twice, parallel or not, is the same failure twice.
    driver = Driver()
    driver.respond(calls(("slow", {"n": 1}), ("slow", {"n": 2})))
    driver.feed(fail("call_0", "slow", "disk full"))
    driver.feed(fail("call_1", "slow", "disk full"))
    assert driver.outcome.stop_reason == "repeated_failure"


def test_a_call_cancelled_from_flower_is_just_an_outcome() -> None:
    driver = Driver(limits=Limits(stop_on_repeated_failure=True))
    driver.respond(calls(("slow", {}), ("slow", {"x": 1})))
    driver.feed(fail("call_0", "slow", "the task was revoked", FailureKind.CANCELLED))
    driver.feed(fail("call_1", "slow", "the task was revoked", FailureKind.CANCELLED))
    assert of_type(driver.last, CallModel)
    assert driver.state.status is TurnStatus.RUNNING


def test_events_after_the_end_are_audit_only() -> None:
    driver = Driver()
    driver.respond(answer("done"))
    assert driver.feed(CancelRequested(at=1002.0)) == []
    late = ok("ghost", "slow", "late")
    driver.finish(late)
    assert [entry.outcome for entry in driver.state.late_outcomes] == [late]
    assert driver.state.outcome is not None and driver.state.outcome.status == "completed"
