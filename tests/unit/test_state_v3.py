"""State version 3: the history is not in the state's JSON but in its list; versions 1 and 2 still load.

Also what a step appends (`runtime.persist.build_append`): only the messages past those the list holds, the
outcome keys their tool messages consume, and the whole history again when the list lost some.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.machine.layout import count_log_entries, dump_log
from orchestrator.machine.state import (
    STATE_VERSION,
    dump_entries,
    dump_state,
    load_state,
)
from orchestrator.model import ToolMessage, UserMessage
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.persist import build_append
from tests.unit.machine.harness import Driver, answer, calls, ok
from workers import keys

FIXTURES = Path(__file__).parent.parent / "fixtures"


def finished_driver() -> Driver:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add", "3"))
    driver.respond(answer("three"))
    return driver


def test_a_version_3_state_holds_no_history_and_says_where_it_is() -> None:
    state = finished_driver().state
    assert STATE_VERSION == 3 and len(state.history) == 4
    text = dump_state(state, history_key="toolloop:turn:turn1:history")
    data = json.loads(text)
    assert "history" not in data and data["version"] == 3
    assert (data["history_key"], data["history_len"]) == ("toolloop:turn:turn1:history", 4)
    # The terminal state's outcome would copy the history: its messages are left out too.
    assert "messages" not in data["outcome"]
    assert "three" not in text.replace('"text":"three"', "")  # the final answer only as the outcome's text
    restored = load_state(text, dump_entries(state.history), dump_log(state))
    assert restored == state and restored.outcome is not None
    assert restored.outcome.messages == state.history


def test_a_step_state_is_small_whatever_the_history() -> None:
    short, long = Driver(), Driver(prior_history=[UserMessage(content="x" * 50_000)])
    assert abs(len(dump_state(long.state)) - len(dump_state(short.state))) < 100


def test_a_version_2_state_upgrades_with_its_inline_history() -> None:
    fixture = json.loads((FIXTURES / "v2_midround_turn.json").read_text())
    raw = json.loads(fixture["state"])
    assert raw["version"] == 2 and len(raw["history"]) == 3
    state = load_state(fixture["state"], ["ignored: a version 2 state holds its own"])
    assert state.version == STATE_VERSION
    assert [m.role for m in state.history] == ["user", "assistant", "tool"]
    assert state.current is not None and state.current.calls[0].tool == "e2e_sleep"
    again = dump_state(state, history_key=keys.turn_history(state.turn_id))
    assert json.loads(again)["history_len"] == 3 and "history" not in json.loads(again)
    assert load_state(again, dump_entries(state.history), dump_log(state)) == state


def test_a_step_appends_only_the_entries_past_those_stored() -> None:
    driver = Driver()
    handle = TurnHandle("turn1", driver.state, conversation_id=None)
    before = driver.state
    append, entries, log = build_append(handle, before, driver.state, [])
    assert append is not None and (append.start, len(append.messages)) == (0, 1)  # the prompt
    assert append.history_key == keys.turn_history("turn1") and entries == list(append.messages)
    # The log starts with the fields fixed at the start (the request's essentials, the tools offered).
    assert [json.loads(e)[0] for e in append.log] == ["static"] and log == list(append.log)
    handle.set_state(driver.state, dump_state(driver.state), entries, log)
    nothing, same, same_log = build_append(handle, driver.state, driver.state, [])
    assert nothing is None and same == entries and same_log == log  # nothing new: nothing written

    # The model's answer adds its call's record to the log, and no message yet (its round is open).
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    append, entries, log = build_append(handle, before, driver.state, [])
    assert append is not None and append.messages == () and append.log_key == keys.turn_log("turn1")
    assert [json.loads(e)[0] for e in append.log] == ["llm_call_records"] and append.log_start == 1
    handle.set_state(driver.state, dump_state(driver.state), entries, log)

    before = driver.state
    outcome = ok("call_0", "add", "3", turn_id="turn1")
    driver.finish(outcome)
    append, entries, log = build_append(handle, before, driver.state, [outcome])
    assert append is not None and append.start == 1 and append.log == ()
    assert [json.loads(m)["role"] for m in append.messages] == ["assistant", "tool"]
    # The tool message consumes its call's outcome key, named by the call's wire id.
    assert [c.call_id for c in append.consumed] == ["turn1/call_0"]
    assert entries == dump_entries(driver.state.history) and log == dump_log(driver.state)

    whole, rewritten, relogged = build_append(handle, before, driver.state, [outcome], whole=True)
    assert whole is not None and whole.start == 0 and list(whole.messages) == rewritten == entries
    assert whole.log_start == 0 and list(whole.log) == relogged == log


def test_a_conversation_turn_appends_to_the_conversation_list() -> None:
    prior = [UserMessage(content="earlier"), ToolMessage(tool_call_id="x", name="add", content="1")]
    driver = Driver(prior_history=prior[:1])
    handle = TurnHandle("turn1", driver.state, conversation_id="c1", entries=dump_entries(prior[:1]))
    append, _, _ = build_append(handle, driver.state, driver.state, [])
    assert append is not None and append.history_key == keys.conversation_history("c1")
    assert append.start == 1 and len(append.messages) == 1


def test_the_audit_lists_are_in_the_log_not_in_the_state() -> None:
    driver = Driver()
    for i in range(3):
        driver.respond(calls(("add", {"a": i, "b": 1}), prefix=f"r{i}"))
        driver.finish(ok(f"r{i}_0", "add", "x"))
    state = driver.state
    data = json.loads(dump_state(state, log_key=keys.turn_log("turn1")))
    assert "llm_call_records" not in data and "offered" not in data and "limits" not in data
    assert data["log_len"] == 4 and len(state.llm_call_records) == 3  # the static fields, then 3 records
    assert data["log_key"] == keys.turn_log("turn1")
    log = dump_log(state)
    assert count_log_entries(log) == (3, 0, 0)
    assert load_state(dump_state(state), dump_entries(state.history), log) == state
