"""Budgets and cost: `max_total_tokens` and `max_cost_usd` are checked after every answer and
before every model call; the turn's cost is the sum of its calls' while each has a price, else unknown."""

from __future__ import annotations

import pytest

from orchestrator.machine.events import CallModel, DispatchTools, ModelFailed
from orchestrator.model import Limits, ProviderError, ToolCall, ToolMessage, Turn, Usage
from tests.unit.machine.harness import Driver, of_type, ok
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)


def usage(tokens: int, cost: float | None = None) -> Usage:
    return Usage(input_tokens=tokens - 10, output_tokens=10, total_tokens=tokens, cost_usd=cost)


def tool_calls(tokens: int, cost: float | None = None, prefix: str = "c") -> Turn:
    calls = [ToolCall(id=f"{prefix}_0", name="add", arguments={"a": 1, "b": 2})]
    return Turn(type="tool_calls", tool_calls=calls, usage=usage(tokens, cost), provider="openai", model="m")


def final(tokens: int, cost: float | None = None, text: str = "done") -> Turn:
    return Turn(type="final_answer", text=text, usage=usage(tokens, cost), provider="openai", model="m")


def test_a_tool_calling_answer_that_spends_the_tokens_stops_before_its_calls_run() -> None:
    driver = Driver(limits=Limits(max_total_tokens=1_000))
    driver.respond(tool_calls(600, prefix="a"))
    driver.finish(ok("a_0", "add", "3"))
    driver.respond(tool_calls(500, prefix="b"))  # 1,100 of 1,000
    assert not of_type(driver.last, DispatchTools)
    [skipped] = driver.writes()
    assert (skipped.call_id, skipped.failure_kind, skipped.synthetic) == ("b_0", FailureKind.SKIPPED, True)
    driver.echo_writes()
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == (
        "stopped",
        "max_total_tokens",
        True,
    )
    assert outcome.tool_executions == 1 and outcome.usage.total_tokens == 1_100
    assert "budget of 1,000 tokens was spent (1,100 used)" in (outcome.text or "")
    answered = [m for m in driver.state.history if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in answered] == ["a_0", "b_0"] and answered[1].synthetic


def test_the_budget_is_checked_before_the_next_call() -> None:
    driver = Driver(limits=Limits(max_total_tokens=1_000))
    driver.respond(final(1_000, text=" "))  # a blank answer, to be retried, spent the budget exactly
    assert not of_type(driver.last, CallModel)
    assert (driver.outcome.stop_reason, driver.outcome.llm_calls) == ("max_total_tokens", 1)


def test_under_the_budget_the_turn_goes_on() -> None:
    driver = Driver(limits=Limits(max_total_tokens=1_000))
    driver.respond(tool_calls(999))
    assert of_type(driver.last, DispatchTools)


def test_a_final_answer_over_the_budget_still_completes() -> None:
    driver = Driver(limits=Limits(max_total_tokens=100, max_cost_usd=0.01))
    driver.respond(final(5_000, cost=1.0))
    assert (driver.outcome.status, driver.outcome.text) == ("completed", "done")


def test_tokens_count_input_and_output_when_a_provider_gives_no_total() -> None:
    driver = Driver(limits=Limits(max_total_tokens=100))
    turn = tool_calls(0).model_copy(update={"usage": Usage(input_tokens=90, output_tokens=20)})
    driver.respond(turn)
    driver.echo_writes()
    assert driver.outcome.stop_reason == "max_total_tokens"


def test_the_cost_is_summed_and_a_spent_dollar_budget_stops_the_turn() -> None:
    driver = Driver(limits=Limits(max_cost_usd=0.05))
    driver.respond(tool_calls(100, cost=0.02, prefix="a"))
    assert driver.state.usage.cost_usd == pytest.approx(0.02)
    driver.finish(ok("a_0", "add"))
    driver.respond(tool_calls(100, cost=0.03, prefix="b"))
    assert not of_type(driver.last, DispatchTools)
    driver.echo_writes()
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("stopped", "max_cost", True)
    assert outcome.usage.cost_usd == pytest.approx(0.05)
    assert [r.usage.cost_usd for r in outcome.llm_call_records] == [0.02, 0.03]


def test_a_tiny_spent_budget_says_what_was_spent_in_significant_digits() -> None:
    driver = Driver(limits=Limits(max_cost_usd=0.0001))
    driver.respond(tool_calls(100, cost=0.00012, prefix="a"))
    driver.echo_writes()
    assert "the budget of $0.0001 was spent ($0.00012)" in (driver.outcome.text or "")


def test_the_cost_is_unknown_from_the_first_call_without_a_price() -> None:
    driver = Driver()
    driver.respond(tool_calls(100, cost=0.02, prefix="a"))
    driver.finish(ok("a_0", "add"))
    driver.respond(tool_calls(100, cost=None, prefix="b"))
    assert driver.state.usage.cost_usd is None
    driver.finish(ok("b_0", "add"))
    driver.respond(final(100, cost=0.01))
    outcome = driver.outcome
    # `Usage.__add__` would sum what is known (0.03): the turn says it does not know.
    assert outcome.status == "completed" and outcome.usage.cost_usd is None
    assert outcome.usage.total_tokens == 300
    # Each model_responded event says its cost, null when no price is known (the key is always there).
    assert [event["usage"]["cost_usd"] for event in driver.emitted("model_responded")] == [0.02, None, 0.01]


def test_a_failed_call_does_not_make_the_cost_unknown() -> None:
    driver = Driver(limits=Limits(max_model_retries=0), model=["openai:a", "openai:b"])
    driver.feed(ModelFailed(error=ProviderError(provider="openai", message="x", retryable=True), at=1000.5))
    driver.respond(final(100, cost=0.01))
    assert driver.outcome.usage.cost_usd == pytest.approx(0.01)


def test_the_first_call_sets_the_cost_whether_known_or_not() -> None:
    known, unknown = Driver(), Driver()
    known.respond(final(100, cost=0.0))
    unknown.respond(final(100))
    assert (known.outcome.usage.cost_usd, unknown.outcome.usage.cost_usd) == (0.0, None)


def test_a_dollar_budget_with_a_model_of_unknown_price_fails_at_start() -> None:
    driver = Driver(
        model=["openai:priced", "openai:local"], unpriced=["openai:local"], limits=Limits(max_cost_usd=1)
    )
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("failed", "max_cost", False)
    assert outcome.llm_calls == 0 and not of_type(driver.log, CallModel)
    assert "no price is known for openai:local" in (outcome.text or "")
    assert "TOOLLOOP_MODEL_PRICES" in (outcome.text or "")


def test_a_setting_the_resolved_model_cannot_honour_fails_the_turn_at_start() -> None:
    # The submitting process could not resolve the tier; the runtime asked the provider once it did.
    refused = ["model_settings.seed: seed is not supported by anthropic (model anthropic:m)"]
    driver = Driver(model="anthropic:m", refused=refused)
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("failed", "provider_error", False)
    assert outcome.llm_calls == 0 and not of_type(driver.log, CallModel)
    assert outcome.error is not None and outcome.error.type == "unsupported_setting"
    assert "seed is not supported by anthropic" in outcome.error.message
    assert "seed is not supported by anthropic" in (outcome.text or "")


def test_an_unknown_price_does_not_matter_without_a_dollar_budget() -> None:
    driver = Driver(unpriced=["openai:m"], limits=Limits(max_total_tokens=10_000))
    assert driver.state.outcome is None and driver.call_model()


def test_a_call_of_unknown_cost_under_a_dollar_budget_fails_the_turn_before_the_next_call() -> None:
    # The price table changed under the turn (another orchestrator took it over): the budget cannot be kept.
    driver = Driver(limits=Limits(max_cost_usd=1.0))
    driver.respond(tool_calls(100, cost=None))
    assert not of_type(driver.last, DispatchTools)
    driver.echo_writes()
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("failed", "max_cost", False)
    assert "cannot be kept: no price is known for m" in (outcome.text or "")
