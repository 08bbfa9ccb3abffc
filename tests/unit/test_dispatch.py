"""Send options of a tool task (pure): task ids, and time limits capped past the turn's deadline."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.publishing.publisher import (
    DEADLINE_MARGIN_S,
    build_limits,
    build_send_options,
    build_task_id,
)
from workers.contract import ToolCallRequest, ToolSpec

pytestmark = pytest.mark.timeout(10)

NOW = 1_700_000_000.0


def _spec(soft: float, hard: float) -> ToolSpec:
    return ToolSpec(name="work", soft_time_limit_s=soft, time_limit_s=hard, queue="q")


def _request(left_s: float | None, attempt: int = 1) -> ToolCallRequest:
    deadline = None if left_s is None else NOW + left_s
    return ToolCallRequest(call_id="t1:c0", tool="work", turn_id="t1", attempt=attempt, deadline_at=deadline)


# (soft, hard) of the tool, seconds left before the deadline -> (soft, hard) sent with the task.
LIMIT_CASES = [
    pytest.param(5.0, 10.0, None, (5.0, 10.0), id="no deadline: the tool's own"),
    pytest.param(5.0, 10.0, 100.0, (5.0, 10.0), id="both end well before the deadline"),
    pytest.param(5.0, 10.0, 9.6, (5.0, 10.0), id="hard ends inside the margin: kept"),
    pytest.param(5.0, 10.0, 8.0, (5.0, 9.0), id="hard capped, soft ends before the deadline"),
    pytest.param(5.0, 10.0, 5.0, (5.0, 6.0), id="soft ends at the deadline: kept"),
    pytest.param(5.0, 10.0, 4.8, (5.0, 5.8), id="soft ends inside the soft margin: kept"),
    pytest.param(5.0, 10.0, 3.0, (3.5, 4.0), id="both capped past the deadline"),
    pytest.param(60.0, 90.0, 0.2, (0.7, 1.2), id="almost no time left"),
    pytest.param(60.0, 90.0, -4.0, (0.5, 1.0), id="deadline already passed"),
    pytest.param(0.3, 0.6, 0.4, (0.3, 0.6), id="short tool near the deadline"),
]


@pytest.mark.parametrize(("soft", "hard", "left_s", "expected"), LIMIT_CASES)
def test_limits(soft: float, hard: float, left_s: float | None, expected: tuple[float, float]) -> None:
    assert build_limits(_spec(soft, hard), _request(left_s), NOW) == pytest.approx(expected)


@pytest.mark.parametrize("left_s", [-1.0, 0.0, 0.01, 0.5, 1.0, 2.9, 3.0, 4.99, 5.0, 5.2, 9.5, 10.0, 50.0])
@pytest.mark.parametrize(("soft", "hard"), [(5.0, 10.0), (0.5, 1.5), (1.0, 1.2), (20.0, 21.0)])
def test_the_deadline_always_answers_first(soft: float, hard: float, left_s: float) -> None:
    capped_soft, capped_hard = build_limits(_spec(soft, hard), _request(left_s), NOW)
    left = max(left_s, 0.0)
    assert 0 < capped_soft < capped_hard
    assert capped_soft <= soft and capped_hard <= hard  # never longer than the tool allows
    # The hard limit ends at or after deadline + margin, unless the tool's own ends earlier.
    assert capped_hard == pytest.approx(min(hard, left + DEADLINE_MARGIN_S))
    # A soft limit reaching past the deadline is never cut to end before it.
    if soft >= left:
        assert capped_soft >= left
    else:
        assert capped_soft == soft


def test_send_options_default_task_id_is_call_and_attempt() -> None:
    request = _request(30.0, attempt=2)
    options = build_send_options(_spec(5, 10), request, NOW)
    assert options["task_id"] == build_task_id(request) == "t1:c0:2"
    assert options["name"] == "tool.work" and options["queue"] == "q"
    assert (options["soft_time_limit"], options["time_limit"]) == (5, 10)
    assert options["expires"] == datetime.fromtimestamp(NOW + 30.0, tz=UTC)
    assert options["headers"] == {"toolloop_turn_id": "t1", "toolloop_call_id": "t1:c0"}


def test_send_options_use_the_given_task_id() -> None:
    options = build_send_options(_spec(5, 10), _request(3.0), NOW, task_id="t1:r1:c0:a1")
    assert options["task_id"] == "t1:r1:c0:a1"
    assert (options["soft_time_limit"], options["time_limit"]) == pytest.approx((3.5, 4.0))


def test_no_deadline_no_expiry() -> None:
    assert "expires" not in build_send_options(_spec(5, 10), _request(None), NOW)
