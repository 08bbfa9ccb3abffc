"""A typed answer: a final answer is parsed and validated against the turn's output schema; one
that does not fit is sent back with the errors, up to `max_output_retries` times, then `invalid_output`."""

from __future__ import annotations

import json

import pytest

from orchestrator.machine import resume
from orchestrator.machine.answers import build_output_feedback
from orchestrator.machine.events import CallModel
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.machine.validation import validate_output
from orchestrator.model import AssistantMessage, Limits, UserMessage
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok

pytestmark = pytest.mark.timeout(30)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
GOOD = '{"city": "Lyon", "population": 522000}'


def typed(**fields: object) -> Driver:
    return Driver(output_schema=SCHEMA, **fields)


def test_a_valid_answer_completes_with_the_parsed_output() -> None:
    driver = typed()
    driver.respond(answer(GOOD))
    outcome = driver.outcome
    assert (outcome.status, outcome.output, outcome.llm_calls) == (
        "completed",
        {"city": "Lyon", "population": 522000},
        1,
    )
    assert outcome.text == GOOD
    assert driver.emitted("output_invalid") == []


def test_a_turn_without_a_schema_has_no_output_even_for_json() -> None:
    driver = Driver()
    driver.respond(answer(GOOD))
    assert (driver.outcome.status, driver.outcome.output) == ("completed", None)


def test_an_answer_that_breaks_the_schema_is_sent_back_with_the_errors_then_fits() -> None:
    driver = typed()
    driver.respond(answer('{"city": "Lyon", "population": "many"}'))
    assert driver.state.outcome is None
    [event] = driver.emitted("output_invalid")
    assert event["llm_call_index"] == 0 and event["retrying"] is True and event["retries"] == 1
    assert event["errors"] == ["population: 'many' is not of type 'integer'"]
    # The answer stays in the history, followed by the errors; the next call sends both.
    *_, kept, feedback = driver.state.history
    assert isinstance(kept, AssistantMessage) and "many" in (kept.content or "")
    assert isinstance(feedback, UserMessage)
    assert feedback.content == build_output_feedback(event["errors"])
    assert "population: 'many' is not of type 'integer'" in feedback.content
    call = driver.call_model()
    assert call.llm_call_index == 1 and call.messages[-1] == feedback
    driver.respond(answer(GOOD))
    outcome = driver.outcome
    assert (outcome.status, outcome.llm_calls, outcome.output) == (
        "completed",
        2,
        {"city": "Lyon", "population": 522000},
    )


@pytest.mark.parametrize(("retries", "calls_made"), [(0, 1), (1, 2), (2, 3)])
def test_an_answer_that_never_fits_fails_invalid_output_after_the_retries(
    retries: int, calls_made: int
) -> None:
    driver = typed(limits=Limits(max_output_retries=retries))
    for _ in range(calls_made):
        driver.respond(answer("It is Lyon, about half a million people."))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.limit_reached) == ("failed", "invalid_output", False)
    assert outcome.output is None and outcome.llm_calls == calls_made
    events = driver.emitted("output_invalid")
    assert [e["retrying"] for e in events] == [True] * retries + [False]
    assert all(e["errors"][0].startswith("the answer is not JSON") for e in events)
    assert "did not match the output schema" in (outcome.text or "")
    # Every answer kept, each sent back but the last.
    feedback = [m for m in driver.state.history if isinstance(m, UserMessage)][1:]
    assert len(feedback) == retries


def test_the_default_is_two_retries() -> None:
    assert Limits().max_output_retries == 2
    test_an_answer_that_never_fits_fails_invalid_output_after_the_retries(2, 3)


def test_each_retry_counts_against_max_llm_calls() -> None:
    driver = typed(limits=Limits(max_llm_calls=2, max_output_retries=5))
    driver.respond(answer("no"))
    driver.respond(answer("still no"))
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.llm_calls) == ("stopped", "max_llm_calls", 2)
    assert outcome.output is None


def test_the_retries_are_counted_per_turn_across_tool_rounds() -> None:
    driver = typed(limits=Limits(max_output_retries=1))
    driver.respond(answer("[]"))
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add", "3"))
    driver.respond(answer("{}"))
    assert (driver.outcome.stop_reason, driver.outcome.llm_calls) == ("invalid_output", 3)


def test_an_answer_in_a_code_fence_is_read_inside_it() -> None:
    driver = typed()
    driver.respond(answer(f"```json\n{GOOD}\n```"))
    assert driver.outcome.output == {"city": "Lyon", "population": 522000}


def test_a_schema_that_is_not_a_json_schema_fails_the_turn_before_any_model_call() -> None:
    driver = Driver(output_schema={"type": "no-such-type"})
    outcome = driver.outcome
    assert (outcome.status, outcome.stop_reason, outcome.llm_calls) == ("failed", "invalid_output", 0)
    assert not of_type(driver.log, CallModel)
    assert "not a valid JSON Schema" in (outcome.text or "")


def test_an_invalid_schema_in_a_running_state_is_guarded_without_retrying() -> None:
    driver = typed()
    broken = driver.state.model_copy(update={"output_schema": {"type": 5}})
    driver.state = broken
    driver.respond(answer(GOOD))
    assert (driver.outcome.stop_reason, driver.outcome.llm_calls) == ("invalid_output", 1)
    assert driver.emitted("output_invalid") == []


def test_the_errors_sent_back_are_bounded() -> None:
    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}
    value = {f"p{i}": "x" * 2_000 for i in range(40)}
    parsed, errors = validate_output(many, json.dumps(value))
    assert parsed is None and len(errors) == 10 and all(len(e) <= 300 for e in errors)
    assert len(build_output_feedback(errors)) < 3_500


def test_a_retry_in_flight_is_resumed_as_the_same_call() -> None:
    driver = typed()
    driver.respond(answer("nope"))
    call = driver.call_model()
    state = driver.state
    copy = load_state(dump_state(state), dump_entries(state.history), dump_log(state))
    assert (copy.output_retries, copy.output_schema) == (1, SCHEMA)
    _, commands = resume(copy, at=1001.5)
    assert of_type(commands, CallModel) == [call]
