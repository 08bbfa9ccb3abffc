"""Fallback: with a list of models, the next one takes a call the current one failed after its
own retries, or at once when the current one cannot be used from here; its retries start again."""

from __future__ import annotations

import pytest

from orchestrator.context.budget import ContextBudget
from orchestrator.machine import resume
from orchestrator.machine.events import ArmTimer, CallModel, ModelFailed, TimerFired
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.model import AssistantMessage, Limits, ProviderError, Turn, Usage
from tests.unit.machine.harness import Driver, calls, of_type, ok

pytestmark = pytest.mark.timeout(30)

MODELS = ["openai:primary", "anthropic:second", "openai:third"]


def unavailable(provider: str = "openai", status: int = 503) -> ProviderError:
    return ProviderError(provider=provider, status=status, message="unavailable", retryable=True)


def fail(driver: Driver, error: ProviderError) -> None:
    driver.feed(ModelFailed(error=error, at=driver.now(), llm_call_index=driver.state.awaiting_model))


def fail_with_retries(driver: Driver, error: ProviderError) -> None:
    """The current model fails its call and every retry it has."""
    for _ in range(driver.state.limits.max_model_retries):
        fail(driver, error)
        [timer] = of_type(driver.last, ArmTimer)
        driver.feed(TimerFired(timer_id=timer.timer_id, at=timer.at))
    fail(driver, error)


def final(text: str, provider: str, model: str) -> Turn:
    usage = Usage(input_tokens=5, output_tokens=2, total_tokens=7)
    return Turn(type="final_answer", text=text, provider=provider, model=model, usage=usage)


def test_the_next_model_takes_the_call_after_the_retries_of_the_first() -> None:
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=2))
    assert driver.call_model().model == "openai:primary"
    fail_with_retries(driver, unavailable())
    call = driver.call_model()
    assert (call.model, call.llm_call_index) == ("anthropic:second", 3)
    [event] = driver.emitted("model_fallback")
    assert (event["from"], event["to"], event["llm_call_index"]) == ("openai:primary", "anthropic:second", 2)
    assert event["error"]["status"] == 503 and event["error"]["message"] == "unavailable"
    assert (driver.state.model, driver.state.model_index, driver.state.model_retries) == (MODELS[1], 1, 0)
    # Its own retries start again: one failure is retried on the same model.
    fail(driver, unavailable("anthropic"))
    assert of_type(driver.last, ArmTimer) and not driver.emitted("model_fallback")[1:]
    [timer] = of_type(driver.last, ArmTimer)
    driver.feed(TimerFired(timer_id=timer.timer_id, at=timer.at))
    assert driver.call_model().model == "anthropic:second"
    driver.respond(final("done", "anthropic", "second-2025"), at=timer.at)
    outcome = driver.outcome
    assert (outcome.status, outcome.model, outcome.llm_calls) == ("completed", "anthropic:second", 5)
    records = outcome.llm_call_records
    # Every record names its model as the provider-less name, and its provider apart.
    assert [r.model for r in records] == [*["primary"] * 3, "second", "second-2025"]
    assert [r.error is None for r in records] == [False, False, False, False, True]


def test_the_whole_order_is_tried_then_the_turn_fails_with_the_last_error() -> None:
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=0))
    fail(driver, unavailable())
    fail(driver, unavailable("anthropic", 529))
    assert driver.call_model().model == "openai:third"
    fail(driver, unavailable(status=502))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.model) == (
        "failed",
        "provider_error",
        "openai:third",
    )
    assert outcome.error is not None and outcome.error.status == 502
    assert [(e["from"], e["to"]) for e in driver.emitted("model_fallback")] == [
        ("openai:primary", "anthropic:second"),
        ("anthropic:second", "openai:third"),
    ]


def test_an_error_the_request_itself_causes_does_not_fall_back() -> None:
    driver = Driver(model=MODELS)
    fail(driver, ProviderError(provider="openai", status=400, message="bad request"))
    assert (driver.outcome.stop_reason, driver.outcome.model) == ("provider_error", "openai:primary")
    assert driver.emitted("model_fallback") == []


@pytest.mark.parametrize(
    "error",
    [
        ProviderError(provider="openai", type="missing_api_key", code="missing_api_key", message="no key"),
        ProviderError(provider="nowhere", type="invalid_model", message="unknown provider"),
        ProviderError(provider="openai", status=401, message="bad key"),
        ProviderError(provider="openai", status=404, message="no such model"),
    ],
    ids=["missing key", "invalid model", "401", "404"],
)
def test_a_model_that_cannot_be_used_from_here_falls_back_at_once(error: ProviderError) -> None:
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=3))
    fail(driver, error)
    assert not of_type(driver.last, ArmTimer)
    assert driver.call_model().model == "anthropic:second"


def test_a_single_model_fails_as_before() -> None:
    driver = Driver(model="openai:primary", limits=Limits(max_model_retries=0))
    fail(driver, unavailable())
    assert driver.outcome.stop_reason == "provider_error" and driver.emitted("model_fallback") == []
    assert driver.state.models == []


def test_no_fallback_past_max_llm_calls() -> None:
    driver = Driver(model=MODELS, limits=Limits(max_llm_calls=1, max_model_retries=0))
    fail(driver, unavailable())
    assert driver.outcome.stop_reason == "provider_error" and driver.emitted("model_fallback") == []


def test_the_view_adapts_to_the_new_provider_and_the_turn_keeps_the_new_model() -> None:
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=0))
    driver.respond(calls(("add", {"a": 1, "b": 2})))  # an OpenAI tool call in the history
    driver.finish(ok("call_0", "add", "3"))
    fail(driver, unavailable())
    call = driver.call_model()
    assert call.model == "anthropic:second"
    flattened = [m for m in call.messages if isinstance(m, AssistantMessage)]
    assert flattened and not any(m.tool_calls for m in flattened)  # another provider's calls, as text
    assert any(d.kind == "flattened_tool_calls" for r in driver.state.view_diagnostics for d in r.diagnostics)
    driver.respond(calls(("add", {"a": 3, "b": 4}), prefix="b"))
    driver.finish(ok("b_0", "add", "7"))
    assert driver.call_model().model == "anthropic:second"


def test_the_window_of_the_model_that_takes_over_applies() -> None:
    budget = ContextBudget(
        window_tokens=100_000, cap_tokens=50_000, model_windows={"anthropic:second": 8_000}
    )
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=0), context_budget=budget)
    fail(driver, unavailable())
    assert (driver.state.context_budget.window_tokens, driver.state.context_budget.cap_tokens) == (
        8_000,
        None,
    )
    fail(driver, unavailable("anthropic"))
    assert driver.state.context_budget.window_tokens is None  # no window known: the table's


def test_a_resumed_turn_calls_the_model_that_took_over() -> None:
    driver = Driver(model=MODELS, limits=Limits(max_model_retries=0))
    fail(driver, unavailable())
    call = driver.call_model()
    state = driver.state
    copy = load_state(dump_state(state), dump_entries(state.history), dump_log(state))
    assert (copy.model, copy.models, copy.model_index) == ("anthropic:second", MODELS, 1)
    _, commands = resume(copy, at=1001.5)
    assert of_type(commands, CallModel) == [call]
