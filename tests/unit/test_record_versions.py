"""Records read across releases: each model that crosses processes, as an older release wrote it and as a
newer one would (fields added since, a value added to a closed set, a higher version).

The rule (`workers.records`): unknown fields of a stored record are ignored, missing ones defaulted, an
unknown failure kind read as `execution_error`; what a person sends still refuses unknown fields; a state of a
version this code does not read is refused whole (`StateVersionError`), and its turn set aside, not retried.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.errors import StateVersionError
from orchestrator.machine.layout import STATIC, dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.model import (
    AssistantMessage,
    Limits,
    Message,
    ToolCall,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    UserMessage,
)
from orchestrator.runtime.adopt import (
    OVERDUE_GRACE_S,
    SetAside,
    Unrunnable,
    build_fallback_deadline,
    build_overdue_outcome,
    drop_unanswered,
    read_deadline_at,
)
from orchestrator.runtime.inbox import build_control_event
from orchestrator.store import codec, history, operations
from orchestrator.store.history import StoredState
from tests.unit.machine.harness import Driver, calls
from workers.contract import (
    MAX_CONTEXT_BYTES,
    FailureKind,
    ToolCallRequest,
    ToolSpec,
    dump_tool_outcome,
    parse_tool_outcome,
)
from workers.records import STORED, warn_once

# A request as the release before the model controls stored it: every limit it knew, written out whole.
OLD_REQUEST: dict[str, Any] = {
    "prompt": "hi",
    "messages": [],
    "tools": None,
    "model": "scripted:demo",
    "limits": {
        "max_llm_calls": 3,
        "max_tool_executions": 50,
        "max_tool_rounds": None,
        "deadline_s": 300.0,
        "stop_on_confirmation_denied": True,
        "stop_on_policy_denied": True,
        "stop_on_tool_failure": False,
        "stop_on_repeated_failure": True,
        "repeat_guard_rounds": 3,
        "max_empty_answer_retries": 2,
        "max_model_retries": 3,
    },
    "context": {},
    "conversation_id": None,
    "tool_choice": None,
}
# The same, as a newer release might write it: fields added at the top, in limits and in model settings.
NEWER_REQUEST: dict[str, Any] = {
    "prompt": "hi",
    "model": "scripted:demo",
    "limits": {"max_llm_calls": 3, "max_wall_clock_s": 9.0},
    "model_settings": {"temperature": 0.5, "verbosity": "low"},
    "priority": "high",
}


def test_a_request_of_an_older_release_reads_with_the_newer_fields_at_their_defaults() -> None:
    request = codec.parse_request(json.dumps(OLD_REQUEST))
    assert request is not None and request.limits.max_llm_calls == 3
    assert (request.limits.max_output_retries, request.limits.max_cost_usd, request.stream) == (2, None, True)


def test_a_request_of_a_newer_release_reads_without_the_fields_it_added() -> None:
    request = codec.parse_request(json.dumps(NEWER_REQUEST))
    assert request is not None
    assert (request.limits.max_llm_calls, request.model_settings.temperature) == (3, 0.5)
    assert request.model_dump(exclude_defaults=True) == {
        "prompt": "hi",
        "model": "scripted:demo",
        "limits": {"max_llm_calls": 3},
        "model_settings": {"temperature": 0.5},
    }


@pytest.mark.parametrize(
    ("sent", "where"),
    [
        ({"prompt": "hi", "limit": {}}, ("limit",)),
        ({"prompt": "hi", "limits": {"max_llm_cals": 3}}, ("limits", "max_llm_cals")),
        ({"prompt": "hi", "model_settings": {"temprature": 1}}, ("model_settings", "temprature")),
    ],
)
def test_what_a_person_sends_still_refuses_unknown_fields(
    sent: dict[str, Any], where: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as refused:
        TurnRequest.model_validate(sent)
    assert [(e["type"], e["loc"]) for e in refused.value.errors()] == [("extra_forbidden", where)]


def test_a_context_too_large_for_a_task_message_is_refused_at_submit_and_read_when_stored() -> None:
    context = {"blob": "é" * (MAX_CONTEXT_BYTES // 6 + 1)}  # escaped as kombu writes it: \u00e9, 6 bytes
    with pytest.raises(ValidationError) as refused:
        TurnRequest.model_validate({"prompt": "hi", "context": context})
    assert [e["loc"] for e in refused.value.errors()] == [("context",)]
    assert "every tool call of the turn carries it" in str(refused.value)
    TurnRequest.model_validate({"prompt": "hi", "context": {"blob": "é" * (MAX_CONTEXT_BYTES // 6 - 4)}})
    stored = codec.parse_request(json.dumps({"prompt": "hi", "context": context}))
    assert stored is not None and stored.context == context


def test_a_stored_request_writes_only_the_limits_and_settings_it_sets() -> None:
    # What an older release, whose models refuse fields they do not know, reads without the newer ones.
    request = TurnRequest(prompt="hi", limits=Limits(max_llm_calls=3), model_settings={"seed": 7})
    assert json.loads(codec.dump_request(request)) == {
        "prompt": "hi",
        "limits": {"max_llm_calls": 3},
        "model_settings": {"seed": 7},
    }
    assert codec.parse_request(codec.dump_request(request)) == request


def test_a_claimed_request_that_does_not_parse_is_reported_not_raised() -> None:
    newer = json.dumps({"prompt": "hi", "model_settings": {"reasoning_effort": "extreme"}})
    claimed = codec.parse_claim([1, "turn1", newer, 0])
    assert isinstance(claimed, codec.ClaimedTurn) and claimed.request is None and not claimed.has_state
    assert claimed.unreadable is not None and "reasoning_effort" in claimed.unreadable
    assert codec.parse_claim([1, "turn1", json.dumps(OLD_REQUEST), 1]) == codec.ClaimedTurn(
        "turn1", codec.parse_request(json.dumps(OLD_REQUEST)), True
    )


def test_outcome_envelopes_of_either_release_read() -> None:
    full = {"call_id": "t/c", "tool": "add", "turn_id": "t", "ok": True, "result": 5, "content": "5"}
    without_content = {key: value for key, value in full.items() if key != "content"}
    newer = {
        **full,
        "ok": False,
        "content": "Error: the task message could not be read",
        "failure_kind": "some_later_kind",
        "cost_usd": 0.1,
    }
    assert parse_tool_outcome(json.dumps(full)).content == "5"
    assert parse_tool_outcome(json.dumps(without_content)).content == "5"
    read = parse_tool_outcome(json.dumps(newer))
    assert (read.failure_kind, read.content) == (FailureKind.EXECUTION_ERROR, newer["content"])
    # Today's writer leaves a derivable content out, as the previous release writes and reads it.
    assert "content" not in json.loads(dump_tool_outcome(parse_tool_outcome(json.dumps(full))))


def test_one_unreadable_outcome_leaves_the_others_of_its_batch(caplog: pytest.LogCaptureFixture) -> None:
    good = json.dumps({"call_id": "t/a", "tool": "add", "ok": True, "result": 5})
    bad = f"t/{uuid.uuid4().hex}"  # `warn_once` remembers for the whole process
    read = operations.read_outcomes(dict.fromkeys(["t/a", bad, "t/c"], "t"))
    with caplog.at_level(logging.WARNING):
        found = read.parse([good, '{"ok": "neither"}', None])
        assert read.parse([good, '{"ok": "neither"}', None]) == found
    assert list(found) == ["t/a"]
    # Told once, however often it is read.
    assert len(caplog.records) == 1 and bad in caplog.records[0].getMessage()


def test_history_messages_and_outcomes_of_a_newer_release_read() -> None:
    newer = {"role": "tool", "tool_call_id": "c", "name": "t", "content": "Error: x", "failure_kind": "later"}
    messages = history.parse_messages([json.dumps({**newer, "shown_at": 1.0})])
    assert messages == [
        ToolMessage(tool_call_id="c", name="t", content="Error: x", failure_kind="execution_error")
    ]
    stored = json.dumps(
        {"turn_id": "t", "status": "completed", "text": "ok", "messages": [newer], "rating": 5}
    )
    outcome = codec.parse_outcome(stored)
    assert outcome is not None and outcome.text == "ok"
    assert isinstance(outcome, TurnOutcome) and outcome.messages[0].role == "tool"


def test_control_entries_of_a_newer_kind_are_passed_over() -> None:
    entry = codec.parse_control("5-0", {"kind": "pause", "at": "1.0"})
    assert (entry.id, entry.kind) == ("5-0", "unreadable")
    assert build_control_event(entry) is None
    assert codec.parse_control("6-0", {"at": "1.0"}).kind == "unreadable"
    cancel = codec.parse_control("7-0", {"kind": "cancel", "at": "2.0", "by": "someone"})
    assert (cancel.kind, cancel.at) == ("cancel", 2.0)


def test_task_kwargs_and_catalogue_specs_of_a_newer_release_read() -> None:
    kwargs = {"call_id": "t/c", "tool": "add", "arguments": {"a": 1}, "priority": 3}
    assert ToolCallRequest.model_validate(kwargs).arguments == {"a": 1}
    spec = ToolSpec.model_validate({"name": "add", "cost_class": "cheap"})
    assert (spec.name, spec.queue) == ("add", "tool.add")


def mid_round_state() -> tuple[str, list[str], list[str]]:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    state = driver.state
    assert state.current is not None and state.current.calls[0].in_flight
    return dump_state(state), dump_entries(state.history), dump_log(state)


def test_a_state_of_the_same_version_with_newer_fields_loads_without_them() -> None:
    text, entries, log = mid_round_state()
    before = load_state(text, entries, log)
    data = json.loads(text)
    data["newer_turn_field"] = {"x": 1}
    data["current"]["calls"][0]["waiting_since"] = 12.5
    data["current"]["assistant"]["signature"] = "abc"
    newer_log = [
        json.dumps([STATIC, {**json.loads(e)[1], "limits": {"max_llm_calls": 10, "newer_limit": 1}}])
        if json.loads(e)[0] == STATIC
        else e
        for e in log
    ]
    assert load_state(json.dumps(data), entries, newer_log) == before


def test_a_state_at_the_default_settings_holds_no_field_the_previous_release_lacks() -> None:
    # The previous release refuses a static field it does not know: the lost-call wait (added since) is
    # written only when an orchestrator runs with another value than the default.
    from orchestrator.settings import Settings

    wait_s = Settings().lost_call_wait_s
    state = Driver().state.model_copy(update={"lost_wait_s": wait_s})
    static = next(json.loads(e)[1] for e in dump_log(state) if json.loads(e)[0] == STATIC)
    assert "lost_wait_s" not in static
    changed = state.model_copy(update={"lost_wait_s": wait_s + 1})
    static = next(json.loads(e)[1] for e in dump_log(changed) if json.loads(e)[0] == STATIC)
    assert static["lost_wait_s"] == wait_s + 1


def test_a_state_of_a_newer_version_is_refused_whole() -> None:
    text, entries, log = mid_round_state()
    data = {**json.loads(text), "version": 4}
    with pytest.raises(StateVersionError) as refused:
        load_state(json.dumps(data), entries, log)
    assert refused.value.found == 4


def test_a_turn_set_aside_is_left_alone_until_its_hold_ends() -> None:
    now = [100.0]
    aside = SetAside(hold_s=30.0, clock=lambda: now[0])
    aside.add("t1")
    assert "t1" in aside and "t2" not in aside
    now[0] += 29.0
    assert "t1" in aside
    now[0] += 2.0
    assert "t1" not in aside and len(aside) == 0


def test_a_record_is_told_of_once(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("toolloop.test_records")
    with caplog.at_level(logging.WARNING, logger=log.name):
        record = f"turn_{uuid.uuid4().hex}"
        told = [warn_once(log, record, "turn %s: %s", record, n) for n in range(3)]
    assert told == [True, False, False] and len(caplog.records) == 1


def test_the_stored_context_is_what_relaxes_a_model() -> None:
    assert Limits.model_validate({"newer": 1}, context=STORED) == Limits()
    with pytest.raises(ValidationError):
        Limits.model_validate({"newer": 1})


def test_a_turn_nobody_can_run_is_ended_once_well_past_its_deadline() -> None:
    said: list[Message] = [
        UserMessage(content="hi"),
        AssistantMessage(content=None, tool_calls=[ToolCall(id="c", name="t")]),
    ]
    stored = StoredState(
        json.dumps({"version": 99, "deadline_at": 1000.0, "model": "x:y"}), dump_entries(said), []
    )
    unrunnable = Unrunnable("turn state version 99 is not supported", stored, None)
    assert build_overdue_outcome("t1", unrunnable, 1000.0 + OVERDUE_GRACE_S - 1) is None
    ended = build_overdue_outcome("t1", unrunnable, 1000.0 + OVERDUE_GRACE_S)
    assert ended is not None
    assert (ended.status, ended.stop_reason, ended.limit_reached, ended.model) == (
        "stopped",
        "deadline",
        True,
        "x:y",
    )
    # The unanswered round is left out: a history never ends on calls without answers.
    assert ended.messages == said[:1]
    assert ended.error is not None and "version 99" in ended.error.message
    for text in ("{}", json.dumps({"deadline_at": "soon"}), "not json"):
        assert build_overdue_outcome("t1", Unrunnable("x", StoredState(text, [], [])), 1e12) is None
    assert build_overdue_outcome("t1", Unrunnable("no state"), 1e12) is None


def test_a_turn_whose_state_says_no_deadline_is_ended_by_its_submit_time_and_requests_deadline() -> None:
    # Garbage, or a state without one: the fallback (submit time + the request's deadline_s) decides.
    assert build_fallback_deadline(1000.0, json.dumps({"limits": {"deadline_s": 5}})) == 1005.0
    default = Limits().deadline_s
    for request in (None, "{not json", json.dumps({"limits": {"deadline_s": "soon"}}), json.dumps([1])):
        assert build_fallback_deadline(1000.0, request) == 1000.0 + default
    assert build_fallback_deadline(None, json.dumps({"limits": {"deadline_s": 5}})) is None
    garbage = Unrunnable("x", StoredState("\ufffdgarbage", [], []), None, fallback_deadline_at=1005.0)
    assert build_overdue_outcome("t1", garbage, 1005.0 + OVERDUE_GRACE_S - 1) is None
    ended = build_overdue_outcome("t1", garbage, 1005.0 + OVERDUE_GRACE_S)
    assert ended is not None and (ended.status, ended.stop_reason, ended.messages) == (
        "stopped",
        "deadline",
        [],
    )
    # A deadline the state says wins over the fallback.
    said = Unrunnable("x", StoredState(json.dumps({"deadline_at": 2000.0}), [], []), fallback_deadline_at=1.0)
    assert build_overdue_outcome("t1", said, 1900.0) is None
    assert read_deadline_at(json.dumps({"deadline_at": 2000})) == 2000.0
    assert read_deadline_at(json.dumps({"deadline_at": True})) is None


def test_only_a_last_round_without_all_its_answers_is_dropped() -> None:
    call = AssistantMessage(tool_calls=[ToolCall(id="a", name="t"), ToolCall(id="b", name="t")])
    answer_a = ToolMessage(tool_call_id="a", name="t", content="1")
    answer_b = ToolMessage(tool_call_id="b", name="t", content="2")
    user = UserMessage(content="hi")
    assert drop_unanswered([user, call, answer_a, answer_b]) == [user, call, answer_a, answer_b]
    assert drop_unanswered([user, call, answer_a]) == [user]
    assert drop_unanswered([user]) == [user]
