"""The loop of a turn: model → parallel calls → ordered tool messages → model … → final answer."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.machine.events import ArmTimer, CallModel, ModelResponded, ToolFinished
from orchestrator.model import AssistantMessage, Limits, ToolCall, ToolMessage, UserMessage
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok
from workers.contract import REDACTED, FailureKind

pytestmark = pytest.mark.timeout(30)


def test_start_arms_the_deadline_and_calls_the_model() -> None:
    driver = Driver(limits=Limits(deadline_s=60))
    timers = of_type(driver.last, ArmTimer)
    assert [(t.timer_id, t.at) for t in timers] == [("deadline", 1060.0)]
    call = driver.call_model()
    assert call.llm_call_index == 0
    assert call.messages == [UserMessage(content="do it")]
    assert sorted(t.name for t in call.tools) == ["add", "delete", "fetch", "slow", "tiny"]  # not sensitive
    assert call.id_prefix == "turn1-m0"
    assert driver.emitted("turn_started")[0]["turn_id"] == "turn1"


def test_a_round_of_parallel_calls_then_a_final_answer() -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2}), ("fetch", {"url": "x"}), ("slow", {})))
    dispatched = driver.dispatched()
    assert [d.call_id for d in dispatched] == ["call_0", "call_1", "call_2"]
    assert len({d.task_id for d in dispatched}) == 3
    assert all(d.attempt == 1 and d.deadline_at == driver.state.deadline_at for d in dispatched)
    assert driver.state.history == [UserMessage(content="do it")]  # the round enters only when complete
    # Outcomes arrive in reverse order; the tool messages follow the order of the calls.
    driver.finish(ok("call_2", "slow", "s"))
    driver.finish(ok("call_1", "fetch", "f"))
    assert not of_type(driver.last, CallModel)
    driver.finish(ok("call_0", "add", "3"))
    history = driver.state.history
    assert isinstance(history[1], AssistantMessage) and len(history[1].tool_calls) == 3
    assert [(m.tool_call_id, m.content) for m in history[2:] if isinstance(m, ToolMessage)] == [
        ("call_0", "3"),
        ("call_1", "f"),
        ("call_2", "s"),
    ]
    model_call = driver.call_model()
    assert model_call.llm_call_index == 1 and model_call.messages == history
    driver.respond(answer("three"))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.text) == ("completed", None, "three")
    assert outcome.llm_calls == 2 and outcome.tool_executions == 3
    assert outcome.usage.total_tokens == 15 + 27
    assert [r.usage.total_tokens for r in outcome.llm_call_records] == [15, 27]
    assert outcome.model == "openai:m"
    assert not driver.state.timers


REJECTIONS: list[tuple[str, dict[str, Any], str | None, FailureKind, str]] = [
    (
        "nope",
        {},
        None,
        FailureKind.NOT_FOUND,
        "unknown tool 'nope'; available: add, delete, fetch, slow, tiny",
    ),
    ("secret", {}, None, FailureKind.NOT_ALLOWED, "not allowed"),
    ("add", {"a": 1}, None, FailureKind.VALIDATION, "'b' is a required property"),
    ("add", {}, "arguments are not valid JSON", FailureKind.VALIDATION, "not valid JSON"),
    ("tiny", {"text": "x" * 40}, None, FailureKind.PAYLOAD_LIMIT, "the limit is 10"),
]


@pytest.mark.parametrize(("tool", "arguments", "arguments_error", "kind", "message"), REJECTIONS)
def test_invalid_calls_are_answered_without_dispatch(
    tool: str, arguments: dict[str, Any], arguments_error: str | None, kind: FailureKind, message: str
) -> None:
    driver = Driver()
    bad = ToolCall(
        id="bad", name=tool, arguments=arguments, arguments_error=arguments_error, raw_arguments="{"
    )
    driver.respond(calls(bad, ("add", {"a": 1, "b": 1})))
    assert [d.call_id for d in driver.dispatched()] == ["call_1"]
    [written] = driver.writes()
    assert (written.call_id, written.failure_kind, written.synthetic) == ("bad", kind, False)
    assert message in written.content and written.content.startswith("Error: ")
    driver.echo_writes()
    driver.finish(ok("call_1", "add", "2"))
    tool_messages = [m for m in driver.state.history if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.is_error, m.failure_kind) for m in tool_messages] == [
        ("bad", True, kind),
        ("call_1", False, None),
    ]
    assert driver.state.tool_executions == 1


def test_a_requested_outcome_is_not_final_until_it_comes_back() -> None:
    driver = Driver()
    driver.respond(calls(("nope", {})))
    requested = driver.state.current.calls[0].requested if driver.state.current is not None else None
    assert requested is not None and requested.failure_kind is FailureKind.NOT_FOUND
    assert driver.writes() == [requested]
    assert not of_type(driver.last, CallModel)
    driver.echo_writes()
    assert of_type(driver.last, CallModel)


def test_duplicate_call_ids_within_a_turn_are_replaced() -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 1})))
    driver.finish(ok("call_0", "add", "2"))
    driver.respond(calls(("add", {"a": 2, "b": 2}), ("add", {"a": 3, "b": 3})))
    ids = [d.call_id for d in driver.dispatched()]
    assert ids == ["turn1-r2-c0", "call_1"]


def test_tool_choice_forced_on_the_first_model_call_only() -> None:
    driver = Driver(tool_choice="add")
    assert driver.call_model().tool_choice == "add"
    driver.respond(calls(("add", {"a": 1, "b": 1})))
    driver.finish(ok("call_0", "add", "2"))
    assert driver.call_model().tool_choice == "auto"


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_unforced_tool_choice_is_kept(choice: str | None) -> None:
    driver = Driver(tool_choice=choice)
    driver.respond(calls(("add", {"a": 1, "b": 1})))
    driver.finish(ok("call_0", "add", "2"))
    assert driver.call_model().tool_choice == choice


def test_events_redact_sensitive_arguments_and_name_the_call() -> None:
    driver = Driver()
    driver.respond(calls(("fetch", {"url": "u", "api_key": "sk-1", "nested": {"password": "p"}})))
    [dispatched] = driver.emitted("tool_dispatched")
    assert dispatched["arguments"] == {"url": "u", "api_key": REDACTED, "nested": {"password": REDACTED}}
    assert (dispatched["call_id"], dispatched["tool"], dispatched["turn_id"]) == ("call_0", "fetch", "turn1")
    assert driver.dispatched()[0].arguments["api_key"] == "sk-1"  # the worker gets the real value
    driver.finish(ok("call_0", "fetch", "x", duration_ms=5.0))
    [finished] = driver.emitted("tool_finished")
    assert finished["duration_ms"] == 5.0 and finished["ok"] is True


def test_context_and_deadline_travel_with_each_dispatch() -> None:
    driver = Driver(context={"user_id": 7}, limits=Limits(deadline_s=30))
    driver.respond(calls(("slow", {})))
    [dispatch] = driver.dispatched()
    assert dispatch.context == {"user_id": 7} and dispatch.deadline_at == 1030.0


def test_duplicate_and_stale_events_change_nothing() -> None:
    driver = Driver()
    event = ModelResponded(turn=calls(("slow", {})), at=1001.0, llm_call_index=0)
    driver.feed(event)
    before = driver.state
    assert driver.feed(event) == [] and driver.state == before
    assert driver.feed(ModelResponded(turn=answer("x"), at=1001.0, llm_call_index=7)) == []
    finished = ToolFinished(outcome=ok("call_0", "slow"), at=1002.0)
    driver.feed(finished)
    after = driver.state
    assert driver.feed(finished) == [] and driver.state == after


def test_prior_history_of_a_conversation_comes_first() -> None:
    prior = [UserMessage(content="earlier"), AssistantMessage(content="reply")]
    driver = Driver(prior_history=prior, prompt="now")
    assert driver.call_model().messages == [*prior, UserMessage(content="now")]
