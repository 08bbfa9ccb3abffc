"""Turning inbox notifications into machine events, and the turn-scoped wire ids of tool calls (pure)."""

from __future__ import annotations

import pytest

from orchestrator.machine.events import ApprovalGiven, CancelRequested
from orchestrator.runtime.inbox import (
    build_control_event,
    build_wire_call_id,
    parse_inbox,
    parse_payloads,
    parse_wire_call_id,
    to_local_outcome,
    to_wire_outcome,
)
from orchestrator.store.codec import ControlRequest
from workers.contract import ToolOutcome

pytestmark = pytest.mark.timeout(10)


def test_entries_are_sorted_by_kind_and_malformed_ones_skipped() -> None:
    entries = [
        ("1-0", {"kind": "outcome", "turn": "t1", "call": "t1/call_a"}),
        (
            "2-0",
            {
                "kind": "started",
                "turn": "t1",
                "call": "t1/call_b",
                "attempt": "2",
                "worker": "w@h",
                "at": "5.5",
            },
        ),
        ("3-0", {"kind": "control", "turn": "t2", "control": "cancel", "id": "9-0"}),
        ("4-0", {"kind": "outcome", "turn": "", "call": "x"}),
        ("5-0", {"kind": "mystery", "turn": "t3", "call": "c"}),
        ("6-0", {"kind": "started", "turn": "t1", "call": "t1/call_c", "attempt": "nan?", "at": ""}),
    ]
    batch = parse_inbox(entries, now=100.0)
    assert batch.outcomes == {"t1": ["t1/call_a"]}
    started = batch.started["t1"]
    assert [(s.call_id, s.attempt, s.worker, s.at) for s in started] == [
        ("call_b", 2, "w@h", 5.5),
        ("call_c", 1, None, 100.0),
    ]
    assert batch.control == {"t2"}
    assert batch.turns == {"t1", "t2"}


def test_control_requests_become_cancel_and_approval_events() -> None:
    cancel = build_control_event(ControlRequest(id="1-0", kind="cancel", at=3.0))
    assert isinstance(cancel, CancelRequested) and cancel.at == 3.0
    approve = build_control_event(
        ControlRequest(id="2-0", kind="approval", call_id="c1", approved=False, at=4.0)
    )
    assert isinstance(approve, ApprovalGiven)
    assert (approve.call_id, approve.approved) == ("c1", False)
    assert build_control_event(ControlRequest(id="3-0", kind="approval", call_id=None, at=4.0)) is None


def test_wire_ids_are_turn_scoped_and_round_trip() -> None:
    wire = build_wire_call_id("turn_1", "call_r0_0")
    assert wire != build_wire_call_id("turn_2", "call_r0_0")
    assert parse_wire_call_id("turn_1", wire) == "call_r0_0"
    assert parse_wire_call_id("turn_2", wire) == wire  # not this turn's: left alone
    outcome = ToolOutcome(call_id="call_r0_0", tool="add", turn_id="turn_1", ok=True, content="3")
    assert to_wire_outcome(outcome).call_id == wire
    assert to_local_outcome(to_wire_outcome(outcome)) == outcome
    direct = ToolOutcome(call_id="direct", tool="add", ok=True, content="3")
    assert to_wire_outcome(direct) == direct


def test_outcomes_carried_by_notifications_are_parsed_and_bad_ones_left_to_the_key() -> None:
    good = ToolOutcome(call_id="t1/c1", tool="add", turn_id="t1", ok=True, result=3, content="3")
    entries = [
        ("1-0", {"kind": "outcome", "turn": "t1", "call": "t1/c1", "outcome": good.model_dump_json()}),
        ("2-0", {"kind": "outcome", "turn": "t1", "call": "t1/c2", "outcome": ""}),
        ("3-0", {"kind": "outcome", "turn": "t1", "call": "t1/c3", "outcome": "{not json"}),
    ]
    batch = parse_inbox(entries, now=1.0)
    assert batch.outcomes == {"t1": ["t1/c1", "t1/c2", "t1/c3"]}
    assert set(batch.payloads) == {"t1/c1", "t1/c3"}
    assert parse_payloads(batch.payloads) == {"t1/c1": good}


def test_an_approval_carries_its_edited_arguments_and_a_denial_its_reason() -> None:
    approved = ControlRequest(
        id="1-0", kind="approval", call_id="c1", approved=True, at=5.0, arguments={"amount": 1}
    )
    denied = ControlRequest(id="2-0", kind="approval", call_id="c1", approved=False, at=6.0, reason="no")
    assert build_control_event(approved) == ApprovalGiven(
        call_id="c1", approved=True, at=5.0, arguments={"amount": 1}
    )
    assert build_control_event(denied) == ApprovalGiven(call_id="c1", approved=False, at=6.0, reason="no")
    cancel = ControlRequest(id="3-0", kind="cancel", at=7.0, reason="user left")
    assert build_control_event(cancel) == CancelRequested(at=7.0, reason="user left")
