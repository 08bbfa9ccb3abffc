"""Model errors and empty answers, lost work and late outcomes, state versions."""

from __future__ import annotations

import pytest

from orchestrator.errors import StateVersionError
from orchestrator.machine.events import ArmTimer, CallModel, ModelFailed, Revoke, TimerFired, ToolStarted
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.model import Limits, ProviderError, ToolMessage
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)


def error(status: int | None, *, retryable: bool, retry_after_s: float | None = None) -> ProviderError:
    return ProviderError(
        provider="openai_chat",
        status=status,
        message="overloaded",
        retryable=retryable,
        retry_after_s=retry_after_s,
    )


@pytest.mark.parametrize(
    ("retry_after_s", "expected_delays"),
    [(None, [1.0, 2.0, 4.0]), (3.0, [3.0, 3.0, 4.0])],
)
def test_transient_errors_back_off_then_retry(
    retry_after_s: float | None, expected_delays: list[float]
) -> None:
    driver = Driver(limits=Limits(max_model_retries=3))
    now = 1000.0
    delays = []
    for _ in range(3):
        driver.feed(ModelFailed(error=error(503, retryable=True, retry_after_s=retry_after_s), at=now))
        [timer] = of_type(driver.last, ArmTimer)
        delays.append(timer.at - now)
        assert not of_type(driver.last, CallModel)
        now = timer.at
        driver.feed(TimerFired(timer_id=timer.timer_id, at=now))
        assert driver.call_model().llm_call_index == driver.state.llm_calls - 1
    assert delays == expected_delays
    driver.respond(answer("fine"), at=now)
    assert driver.outcome.llm_calls == 4 and driver.outcome.status == "completed"
    assert [r.error is not None for r in driver.outcome.llm_call_records] == [True, True, True, False]


def test_retries_used_up_fail_the_turn_with_the_provider_error() -> None:
    driver = Driver(limits=Limits(max_model_retries=1))
    driver.feed(ModelFailed(error=error(500, retryable=True), at=1001.0))
    driver.feed(TimerFired(timer_id=of_type(driver.last, ArmTimer)[0].timer_id, at=1002.0))
    driver.feed(ModelFailed(error=error(500, retryable=True), at=1003.0))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason) == ("failed", "provider_error")
    assert outcome.error is not None and outcome.error.status == 500
    assert "openai_chat 500: overloaded" in (outcome.text or "")


@pytest.mark.parametrize("limits", [Limits(max_llm_calls=1), Limits(deadline_s=2)])
def test_no_retry_past_max_llm_calls_or_the_deadline(limits: Limits) -> None:
    driver = Driver(limits=limits)
    driver.feed(ModelFailed(error=error(429, retryable=True, retry_after_s=5.0), at=1000.5))
    assert driver.outcome.stop_reason == "provider_error"


def test_a_permanent_error_fails_at_once_after_a_round() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {})))
    driver.finish(ok("call_0", "slow"))
    driver.feed(ModelFailed(error=error(401, retryable=False), at=1002.0))
    assert driver.outcome.stop_reason == "provider_error"
    assert driver.state.history[-1].role == "assistant"  # closing note after the answered round


def test_blank_answers_are_retried_then_fail() -> None:
    driver = Driver(limits=Limits(max_empty_answer_retries=2))
    for _ in range(2):
        driver.respond(answer("  "))
        assert of_type(driver.last, CallModel)
    driver.respond(answer(None))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.llm_calls) == ("failed", "empty_answer", 3)


@pytest.mark.parametrize("finish_reason", ["length", "content_filter"])
def test_blank_answer_cut_by_length_or_filter_is_reported_as_such(finish_reason: str) -> None:
    driver = Driver()
    driver.respond(answer("", finish_reason=finish_reason))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason) == ("failed", "empty_answer")
    assert outcome.error is not None and outcome.error.type == finish_reason
    assert outcome.llm_calls == 1


def test_a_lost_worker_is_retried_then_answered_worker_lost() -> None:
    driver = Driver()
    driver.respond(calls(("fetch", {})))  # fetch: time_limit 20 s, retries 1
    first_task = driver.dispatched()[0].task_id
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w1", at=1002.0))
    [timer] = of_type(driver.last, ArmTimer)
    assert timer.at == 1002.0 + 20.0 + 5.0
    assert driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w1", at=1002.0)) == []
    commands = driver.feed(TimerFired(timer_id=timer.timer_id, at=timer.at))
    assert of_type(commands, Revoke) == []  # the old attempt is fenced, never revoked (terminated)
    [redispatch] = driver.dispatched()
    assert (redispatch.attempt, redispatch.call_id) == (2, "call_0") and redispatch.task_id != first_task
    assert driver.state.tool_executions == 1
    driver.feed(ToolStarted(call_id="call_0", attempt=2, worker="w2", at=1030.0))
    [timer2] = of_type(driver.last, ArmTimer)
    driver.feed(TimerFired(timer_id=timer.timer_id, at=timer2.at))  # the old timer: stale
    assert driver.writes() == []
    driver.feed(TimerFired(timer_id=timer2.timer_id, at=timer2.at))
    [lost] = driver.writes()
    assert (lost.failure_kind, lost.synthetic, lost.attempts) == (FailureKind.WORKER_LOST, True, 2)
    driver.echo_writes(at=timer2.at)
    late = ok("call_0", "fetch", "finally")
    driver.finish(late, at=timer2.at + 1)
    assert [m.content for m in driver.state.history if isinstance(m, ToolMessage)] == [lost.content]
    assert [entry.outcome for entry in driver.state.late_outcomes] == [late]


def test_an_outcome_disarms_the_lost_work_timer() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {})))
    driver.feed(ToolStarted(call_id="call_0", attempt=1, at=1002.0))
    driver.finish(ok("call_0", "slow"))
    assert set(driver.state.timers) == {"deadline"}


def test_state_round_trips_and_unknown_versions_are_refused() -> None:
    driver = Driver()
    driver.respond(calls(("slow", {}), ("delete", {})))
    text = dump_state(driver.state)
    assert load_state(text, dump_entries(driver.state.history), dump_log(driver.state)) == driver.state
    refused = r"version 99 is not supported \(this code reads version 1, 2, 3\)"
    with pytest.raises(StateVersionError, match=refused):
        load_state(text.replace('"version":3', '"version":99', 1))
    with pytest.raises(StateVersionError, match="None"):
        load_state("{}")
