"""Resuming a persisted turn on a new owner: `machine.resume` re-issues what died with the
old owner — timers, requested outcomes, the model call in flight, approvals, and the same task again for a
dispatched call whose start was never recorded (it may never have been published) — and nothing else."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from orchestrator.machine import resume
from orchestrator.machine.events import (
    ApprovalGiven,
    ArmTimer,
    AwaitApproval,
    CallModel,
    CancelRequested,
    Command,
    DispatchTools,
    Emit,
    Finish,
    ModelFailed,
    ModelResponded,
    Revoke,
    TimerFired,
    ToolStarted,
    WriteOutcomes,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import (
    STATE_VERSION,
    TurnState,
    dump_entries,
    dump_state,
    load_state,
)
from orchestrator.model import Limits, ProviderError
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok
from tests.unit.machine.invariants import check_state
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)


def resumed(driver: Driver, at: float | None = None) -> list[Command]:
    """Resume a serialised copy of the driver's turn; the state must come back unchanged."""
    copy = load_state(dump_state(driver.state), dump_entries(driver.state.history), dump_log(driver.state))
    state, commands = resume(copy, driver.now(at))
    assert state == copy == driver.state, "resuming changed the state"
    check_state(state, commands)
    return commands


def kinds(commands: list[Command]) -> list[str]:
    return [c.kind for c in commands]


# --- what is re-issued, state by state --------------------------------------------------------------------


def _model_in_flight(driver: Driver) -> None:
    pass


def _model_in_flight_after_a_round(driver: Driver) -> None:
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add", "3"))


def _retry_timer_pending(driver: Driver) -> None:
    error = ProviderError(provider="openai_chat", status=503, message="busy", retryable=True)
    driver.feed(ModelFailed(error=error, at=1001.0, llm_call_index=0))


def _tool_running(driver: Driver) -> None:
    driver.respond(calls(("slow", {})))
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w1", at=1002.0))


def _tool_dispatched_not_started(driver: Driver) -> None:
    driver.respond(calls(("slow", {})))


def _invalid_call_write_pending(driver: Driver) -> None:
    driver.respond(calls(("nope", {}), ("slow", {})))


def _deadline_with_a_call_running(driver: Driver) -> None:
    driver.respond(calls(("slow", {}), ("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_1", "add", "3"))
    driver.feed(TimerFired(timer_id="deadline", at=driver.state.deadline_at))


def _waiting_for_approval(driver: Driver) -> None:
    driver.respond(calls(("delete", {"id": 1}), ("add", {"a": 1, "b": 2})))


def _cancelled_while_waiting(driver: Driver) -> None:
    driver.respond(calls(("delete", {"id": 1})))
    driver.feed(CancelRequested(at=1003.0))


RESUME_TABLE: list[tuple[str, Callable[[Driver], None], list[str]]] = [
    # The `emit` before `call_model`: model_stream_reset, as the dead owner may have streamed part of it.
    ("model_in_flight", _model_in_flight, ["emit", "arm_timer", "emit", "call_model"]),
    (
        "model_in_flight_after_a_round",
        _model_in_flight_after_a_round,
        ["emit", "arm_timer", "emit", "call_model"],
    ),
    ("retry_timer_pending", _retry_timer_pending, ["emit", "arm_timer", "arm_timer"]),
    ("tool_running", _tool_running, ["emit", "arm_timer", "arm_timer"]),
    ("tool_dispatched_not_started", _tool_dispatched_not_started, ["emit", "arm_timer", "dispatch_tools"]),
    (
        "invalid_call_write_pending",
        _invalid_call_write_pending,
        ["emit", "arm_timer", "dispatch_tools", "write_outcomes"],
    ),
    ("deadline_with_a_call_running", _deadline_with_a_call_running, ["emit", "revoke", "write_outcomes"]),
    (
        "waiting_for_approval",
        _waiting_for_approval,
        # The deadline's timer and the wait's own.
        ["emit", "arm_timer", "arm_timer", "dispatch_tools", "await_approval"],
    ),
    ("cancelled_while_waiting", _cancelled_while_waiting, ["emit", "arm_timer", "write_outcomes"]),
]


@pytest.mark.parametrize(
    ("setup", "expected"), [(s, e) for _, s, e in RESUME_TABLE], ids=[n for n, _, _ in RESUME_TABLE]
)
def test_resume_reissues_exactly_what_died_with_the_owner(
    setup: Callable[[Driver], None], expected: list[str]
) -> None:
    driver = Driver()
    setup(driver)
    commands = resumed(driver)
    assert kinds(commands) == expected
    # Sent again: exactly the dispatched calls with no recorded start and no outcome asked for, each as the
    # very task first sent (same task id and attempt).
    current = driver.state.current
    unconfirmed = [
        c.call_id
        for c in (current.calls if current else [])
        if c.task_id and c.started_at is None and c.requested is None and c.outcome is None
    ]
    again = [d for c in of_type(commands, DispatchTools) for d in c.calls]
    assert [d.call_id for d in again] == unconfirmed
    assert all(d in driver.dispatched(driver.log) for d in again)
    # Every saved timer is armed again, at its saved time.
    assert {(c.timer_id, c.at) for c in of_type(commands, ArmTimer)} == set(driver.state.timers.items())
    # Every requested outcome not yet confirmed is asked for again, exactly as first asked.
    pending = [c.requested for c in (current.calls if current else []) if c.requested and not c.outcome]
    assert [o for w in of_type(commands, WriteOutcomes) for o in w.outcomes] == pending
    emitted = of_type(commands, Emit)
    reset = ["model_stream_reset"] if driver.state.awaiting_model is not None else []
    assert [e.event_name for e in emitted] == ["turn_resumed", *reset]


# --- the model call in flight ---------------------------------------------------------------------------


@pytest.mark.parametrize("setup", [_model_in_flight, _model_in_flight_after_a_round])
def test_the_model_call_in_flight_is_the_same_call_again(setup: Callable[[Driver], None]) -> None:
    driver = Driver(limits=Limits(max_llm_calls=2))
    setup(driver)
    original = driver.call_model()
    before = driver.state
    (again,) = of_type(resumed(driver), CallModel)
    assert again == original  # same index, same view, same tools and tool choice, same id prefix
    # Not a new call, not a retry: the counters stand where they were.
    assert (driver.state.llm_calls, driver.state.model_retries) == (before.llm_calls, before.model_retries)


def test_a_response_for_the_repeated_call_is_accepted_exactly_once() -> None:
    driver = Driver(limits=Limits(max_llm_calls=2))
    _model_in_flight_after_a_round(driver)
    (again,) = of_type(resumed(driver), CallModel)
    index = again.llm_call_index
    driver.feed(ModelResponded(turn=answer("done"), at=1005.0, llm_call_index=index))
    # The response to the old request (same index) comes too late: ignored, the turn is already over.
    driver.feed(ModelResponded(turn=answer("stale"), at=1006.0, llm_call_index=index))
    outcome = driver.outcome
    assert (outcome.status, outcome.text, outcome.llm_calls) == ("completed", "done", 2)
    assert len(outcome.llm_call_records) == 2


def test_a_stale_response_before_the_repeated_one_is_the_one_accepted() -> None:
    driver = Driver()
    _model_in_flight_after_a_round(driver)
    resumed(driver)
    driver.feed(ModelResponded(turn=answer("first"), at=1005.0, llm_call_index=1))
    driver.feed(ModelResponded(turn=answer("second"), at=1006.0, llm_call_index=1))
    assert driver.outcome.text == "first"
    assert len(driver.outcome.llm_call_records) == 2


def test_no_model_call_starts_again_past_the_deadline() -> None:
    driver = Driver(limits=Limits(deadline_s=10))
    commands = resumed(driver, at=driver.state.deadline_at + 1)
    assert not of_type(commands, CallModel)
    assert of_type(commands, ArmTimer) == [ArmTimer(timer_id="deadline", at=driver.state.deadline_at)]
    driver.feed(TimerFired(timer_id="deadline", at=driver.state.deadline_at + 1))
    assert (driver.outcome.stop_reason, driver.outcome.llm_calls) == ("deadline", 1)


def test_a_pending_retry_is_not_called_now_but_by_its_timer() -> None:
    driver = Driver()
    _retry_timer_pending(driver)
    commands = resumed(driver)
    assert not of_type(commands, CallModel)
    (retry,) = [c for c in of_type(commands, ArmTimer) if c.timer_id.startswith("model_retry:")]
    driver.feed(TimerFired(timer_id=retry.timer_id, at=retry.at))
    assert driver.call_model().llm_call_index == 1
    assert driver.state.model_retries == 1


# --- dispatches whose start was never recorded ----------------------------------------------------------


def test_a_dispatch_never_confirmed_started_is_sent_again_as_the_same_task() -> None:
    # The old owner persisted the dispatch of both calls, then died: maybe before publishing them, maybe
    # after. Only `add` reported its start; `slow` would otherwise wait for the turn's deadline.
    driver = Driver()
    driver.respond(calls(("slow", {}), ("add", {"a": 1, "b": 2})))
    first = driver.dispatched()
    driver.feed(ToolStarted(call_id="call_1", attempt=1, worker="w1", at=1002.0))
    commands = resumed(driver)
    (again,) = of_type(commands, DispatchTools)
    assert again.calls == [first[0]]  # same task id, attempt, arguments and deadline
    (emitted,) = [c.data for c in of_type(commands, Emit)]
    assert emitted["redispatched_call_ids"] == ["call_0"]
    # The task then runs once and reports as usual: the turn goes on without counting a new execution.
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w2", at=1003.0))
    driver.finish(ok("call_0", "slow", "late but fine"), at=1004.0)
    driver.finish(ok("call_1", "add", "3"), at=1004.0)
    assert driver.state.tool_executions == 2
    driver.respond(answer("done"), at=1005.0)
    assert driver.outcome.status == "completed"


def test_a_retry_never_confirmed_started_is_sent_again_with_its_attempt() -> None:
    driver = Driver()
    driver.respond(calls(("fetch", {"url": "u"})))
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w1", at=1002.0))
    (lost,) = [t for t in driver.state.timers if t.startswith("lost:")]
    driver.feed(TimerFired(timer_id=lost, at=driver.state.timers[lost]))
    (retry,) = driver.dispatched()
    assert retry.attempt == 2
    (again,) = of_type(
        resumed(driver, at=retry.deadline_at - 1 if retry.deadline_at else None), DispatchTools
    )
    assert again.calls == [retry]


def test_nothing_is_sent_again_past_the_deadline_or_once_a_stop_answers_it() -> None:
    driver = Driver(limits=Limits(deadline_s=10))
    _tool_dispatched_not_started(driver)
    assert not of_type(resumed(driver, at=driver.state.deadline_at), DispatchTools)
    driver.feed(CancelRequested(at=1003.0))
    assert not of_type(resumed(driver), DispatchTools)  # revoked, its outcome asked for instead


# --- outcomes asked for and not confirmed -------------------------------------------------------------


def test_a_synthetic_outcome_requested_before_the_crash_is_requested_again_and_ends_the_turn() -> None:
    driver = Driver()
    _deadline_with_a_call_running(driver)
    first_request = driver.writes()
    commands = resumed(driver)
    (revoke,) = of_type(commands, Revoke)
    assert revoke.task_ids == ["turn1:r1:c0:a1"]
    (write,) = of_type(commands, WriteOutcomes)
    assert write.outcomes == first_request
    assert write.outcomes[0].failure_kind is FailureKind.DEADLINE_EXCEEDED and write.outcomes[0].synthetic
    # The runtime writes it (first writer wins) and feeds the winner back: the turn ends.
    driver.finish(write.outcomes[0])
    assert (driver.outcome.status, driver.outcome.stop_reason) == ("stopped", "deadline")


def test_a_rewrite_that_had_already_landed_changes_nothing() -> None:
    driver = Driver()
    _invalid_call_write_pending(driver)
    (first,) = driver.writes()
    driver.finish(first)  # the old owner's write landed, then it died before persisting more
    before = driver.state
    assert not of_type(resumed(driver), WriteOutcomes)  # the call is answered in the state
    driver.finish(first)  # and the winner read again from Redis is a duplicate
    assert driver.state == before


def test_a_real_outcome_that_beat_the_rewrite_is_the_answer() -> None:
    driver = Driver()
    _deadline_with_a_call_running(driver)
    resumed(driver)
    real = ok("call_0", "slow", "finished just in time")
    driver.finish(real)  # the winner of the rewrite: the real outcome, written before it
    messages = [m for m in driver.outcome.messages if m.role == "tool"]
    assert [m.content for m in messages] == ["finished just in time", "3"]


# --- approvals, terminal turns, versions ----------------------------------------------------------------


def test_calls_waiting_for_a_person_are_awaited_again_and_approvable() -> None:
    driver = Driver()
    _waiting_for_approval(driver)
    (awaiting,) = of_type(resumed(driver), AwaitApproval)
    assert awaiting.call_ids == ["call_0"]
    assert driver.state.status.value == "waiting"
    driver.feed(ApprovalGiven(call_id="call_0", approved=True, at=1004.0))
    assert [d.call_id for d in driver.dispatched()] == ["call_0"]


def test_a_terminal_state_only_finishes() -> None:
    driver = Driver()
    driver.respond(answer("done"))
    assert resumed(driver) == [Finish(outcome=driver.outcome)]


def test_a_version_1_state_is_upgraded_and_its_requested_outcome_asked_again() -> None:
    driver = Driver()
    _invalid_call_write_pending(driver)
    data = driver.state.model_dump(mode="json")  # all inline, as versions 1 and 2 were
    data["version"] = 1
    data["current"]["calls"][0]["requested"] = "not_found"
    state = load_state(json.dumps(data))
    assert state.version == STATE_VERSION
    requested = state.current.calls[0].requested if state.current else None
    assert requested is not None
    assert (requested.call_id, requested.tool, requested.failure_kind) == (
        "call_0",
        "nope",
        FailureKind.NOT_FOUND,
    )
    assert not requested.synthetic and requested.content.startswith("Error: not_found")
    _, commands = resume(state, 1002.0)
    assert of_type(commands, WriteOutcomes) == [WriteOutcomes(outcomes=[requested])]
    assert load_state(dump_state(state), dump_entries(state.history), dump_log(state)) == state


def test_resume_is_pure_and_repeatable() -> None:
    driver = Driver()
    _deadline_with_a_call_running(driver)
    state: TurnState = driver.state
    assert resume(state, 1500.0) == resume(state, 1500.0)


def test_a_model_call_made_again_after_a_take_over_resets_what_it_streamed() -> None:
    driver = Driver()
    call = driver.call_model()
    resets = [c for c in of_type(resumed(driver), Emit) if c.event_name == "model_stream_reset"]
    assert [r.data for r in resets] == [{"llm_call": call.llm_call_index}]
