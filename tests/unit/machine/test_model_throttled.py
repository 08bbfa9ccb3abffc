"""A model call held back by the fleet's rate limits: never sent, so not a model call; made again, the same
call, once the wait is over; a wait past the deadline stops the turn as `deadline` now."""

from __future__ import annotations

import pytest

from orchestrator.machine.events import ArmTimer, CallModel, ModelThrottled, TimerFired
from orchestrator.machine.loop import resume
from orchestrator.model import Limits
from tests.unit.machine.harness import Driver, answer, of_type

pytestmark = pytest.mark.timeout(30)


def throttle(driver: Driver, wait_s: float, at: float, limit: str = "requests_per_minute") -> None:
    index = driver.state.awaiting_model
    driver.feed(ModelThrottled(limit=limit, wait_s=wait_s, at=at, llm_call_index=index))  # type: ignore[arg-type]


def test_a_throttled_call_waits_then_is_made_again_as_the_same_call() -> None:
    driver = Driver(limits=Limits(max_llm_calls=1, deadline_s=60))
    first = driver.call_model()
    throttle(driver, 2.5, at=1001.0)
    [timer] = of_type(driver.last, ArmTimer)
    assert timer.at == 1003.5 and not of_type(driver.last, CallModel)
    assert driver.state.llm_calls == 0 and driver.state.awaiting_model is None
    assert driver.emitted("model_throttled") == [
        {
            "turn_id": "turn1",
            "llm_call_index": 0,
            "model": "openai:m",
            "limit": "requests_per_minute",
            "wait_ms": 2500,
        }
    ]
    driver.feed(TimerFired(timer_id=timer.timer_id, at=1003.5))
    again = driver.call_model()
    assert again == first
    # max_llm_calls=1: the throttled attempt did not count.
    driver.respond(answer("done"), at=1004.0)
    assert driver.outcome.status == "completed" and driver.outcome.llm_calls == 1


def test_a_wait_past_the_deadline_stops_the_turn_now() -> None:
    driver = Driver(limits=Limits(deadline_s=10))
    throttle(driver, 30.0, at=1001.0, limit="provider")
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason) == ("stopped", "deadline")
    assert "rate limit (provider)" in (outcome.text or "")
    assert driver.emitted("model_throttled")[0]["wait_ms"] == 30000


def test_a_late_or_repeated_throttle_changes_nothing() -> None:
    driver = Driver()
    throttle(driver, 1.0, at=1001.0)
    state = driver.state
    driver.feed(ModelThrottled(limit="provider", wait_s=5.0, at=1001.1, llm_call_index=0))
    assert driver.state == state and driver.last == []


def test_a_new_owner_keeps_the_wait_and_does_not_call_meanwhile() -> None:
    driver = Driver()
    throttle(driver, 4.0, at=1001.0)
    _, commands = resume(driver.state, at=1002.0)
    assert not of_type(commands, CallModel)
    assert [(t.timer_id, t.at) for t in of_type(commands, ArmTimer) if t.timer_id != "deadline"] == [
        ("model_retry:0", 1005.0)
    ]
