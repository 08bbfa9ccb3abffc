"""A tool between workers: sorted served / waiting for a worker / gone, and a call that waits in its queue.

The classification is a pure function of the catalogue snapshot (`classify_tool`, `ToolCatalogue`); the
machine marks a call the runtime sent while no live worker served its tool (`ToolWaitingForWorker`) until a
worker starts it.
"""

from __future__ import annotations

import pytest

from orchestrator.machine.events import ArmTimer, TimerFired, ToolStarted, ToolWaitingForWorker
from orchestrator.machine.validation import ToolAvailability, classify_tool
from orchestrator.store.catalogue import ToolCatalogue
from orchestrator.store.turn_view import build_waiting_for_worker
from tests.unit.machine.harness import CATALOGUE, Driver, calls, of_type, ok
from workers.contract import FailureKind

pytestmark = pytest.mark.timeout(30)

ADD = CATALOGUE["add"]
NOW = 1000.0

SERVED = ToolAvailability.SERVED
WAITING = ToolAvailability.WAITING_FOR_WORKER
GONE = ToolAvailability.GONE


@pytest.mark.parametrize(
    ("live", "served_at", "gone_after_s", "expected"),
    [
        ({"add"}, {}, 60.0, SERVED),  # a live worker serves it
        ({"add"}, {"add": 1.0}, 60.0, SERVED),  # live wins over an old record
        (set(), {"add": NOW - 3.0}, 60.0, WAITING),  # its only worker restarts
        (set(), {"add": NOW - 60.0}, 60.0, WAITING),  # the window is inclusive
        (set(), {"add": NOW - 60.5}, 60.0, GONE),  # served longer ago than the window
        (set(), {"add": NOW - 3.0}, 2.0, GONE),  # a shorter window (TOOLLOOP_TOOL_GONE_AFTER_S)
        (set(), {"add": NOW + 2.0}, 60.0, WAITING),  # a worker's clock a little ahead
        (set(), {}, 60.0, GONE),  # never served
        ({"echo"}, {"echo": NOW}, 60.0, GONE),  # others are served, not this one
    ],
)
def test_a_tool_is_served_waiting_for_a_worker_or_gone(
    live: set[str], served_at: dict[str, float], gone_after_s: float, expected: ToolAvailability
) -> None:
    assert classify_tool("add", live, served_at, NOW, gone_after_s) is expected


@pytest.mark.parametrize(
    ("catalogue", "known"),
    [
        (ToolCatalogue(), []),
        (ToolCatalogue({"add": ADD}), ["add"]),
        (ToolCatalogue({}, {"add": (NOW - 5.0, ADD)}), ["add"]),  # between workers: still callable
        (ToolCatalogue({}, {"add": (NOW - 61.0, ADD)}), []),  # gone
        (ToolCatalogue({"fetch": CATALOGUE["fetch"]}, {"add": (NOW, ADD)}), ["add", "fetch"]),
    ],
)
def test_the_tools_a_call_may_be_sent_to_are_the_live_and_the_recently_served(
    catalogue: ToolCatalogue, known: list[str]
) -> None:
    assert list(catalogue.known(NOW, 60.0)) == known


def test_the_live_spec_wins_over_the_one_last_recorded() -> None:
    moved = ADD.model_copy(update={"queue": "tool.add.v2"})
    catalogue = ToolCatalogue({"add": moved}, {"add": (NOW - 5.0, ADD)})
    assert catalogue.known(NOW, 60.0)["add"].queue == "tool.add.v2"


# --- the machine -----------------------------------------------------------------------------------------


def waiting_call() -> Driver:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    [dispatch] = driver.dispatched()
    assert dispatch.call_id == "call_0"
    driver.feed(ToolWaitingForWorker(call_id="call_0", attempt=1, last_served_at=998.0, at=1001.5))
    return driver


def test_a_call_sent_while_no_worker_serves_its_tool_is_marked_until_a_worker_starts_it() -> None:
    driver = waiting_call()
    [call] = driver.state.current.calls if driver.state.current else []
    assert call.waiting_for_worker_since == 1001.5
    assert driver.emitted("tool_waiting_for_worker") == [
        {"turn_id": "turn1", "call_id": "call_0", "tool": "add", "attempt": 1, "last_served_at": 998.0}
    ]
    [waiting] = build_waiting_for_worker(driver.state)
    assert (waiting.call_id, waiting.tool, waiting.since) == ("call_0", "add", 1001.5)
    # A worker comes up 30 s later: the tool's limits count from its start, not from the dispatch.
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w2", at=1031.5))
    assert build_waiting_for_worker(driver.state) == []
    [timer] = of_type(driver.last, ArmTimer)
    assert timer.at == 1031.5 + ADD.time_limit_s + driver.state.lost_grace_s
    driver.finish(ok("call_0", "add", "3"))
    assert driver.state.current is None and driver.state.history[-1].content == "3"


@pytest.mark.parametrize(
    "late",
    [
        ToolWaitingForWorker(call_id="call_0", attempt=1, at=1001.5),  # the start came first
        ToolWaitingForWorker(call_id="call_0", attempt=2, at=1001.5),  # another attempt's
        ToolWaitingForWorker(call_id="call_9", attempt=1, at=1001.5),  # no such call
    ],
)
def test_a_late_or_foreign_wait_report_is_ignored(late: ToolWaitingForWorker) -> None:
    driver = Driver()
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.feed(ToolStarted(call_id="call_0", attempt=1, worker="w1", at=1001.2))
    assert driver.feed(late) == []
    assert build_waiting_for_worker(driver.state) == [] and driver.emitted("tool_waiting_for_worker") == []


def test_a_second_report_of_the_same_wait_keeps_the_first() -> None:
    driver = waiting_call()
    assert driver.feed(ToolWaitingForWorker(call_id="call_0", attempt=1, at=1003.0)) == []
    [waiting] = build_waiting_for_worker(driver.state)
    assert waiting.since == 1001.5


def test_a_call_still_waiting_at_the_deadline_is_answered_deadline_exceeded() -> None:
    driver = waiting_call()
    deadline = driver.state.deadline_at
    driver.feed(TimerFired(timer_id="deadline", at=deadline))
    [answer] = driver.writes()
    assert (answer.call_id, answer.failure_kind, answer.synthetic) == (
        "call_0",
        FailureKind.DEADLINE_EXCEEDED,
        True,
    )
    assert "no worker of 'add' came up to run it" in answer.content
    assert build_waiting_for_worker(driver.state) == []  # answered: no longer shown as waiting
