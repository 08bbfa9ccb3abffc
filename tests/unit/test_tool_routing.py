"""Routing tool calls: each tool's own queue, the queues a worker consumes, the answer to an unserved call."""

from __future__ import annotations

import pytest

from workers.app import build_worker_queues
from workers.contract import FailureKind, ToolCallRequest, ToolSpec
from workers.tools import ToolRegistry, tool
from workers.unserved import build_unserved_outcome

pytestmark = pytest.mark.timeout(10)


def test_a_tool_has_its_own_queue_unless_it_names_one() -> None:
    reg = ToolRegistry()

    @tool(registry=reg)
    def lookup_order(order_id: str) -> str:
        """Look up an order."""
        return order_id

    @tool(registry=reg, queue="payments")
    def refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    @tool(registry=reg, queue="payments")
    def capture(order_id: str) -> str:
        """Capture a payment."""
        return order_id

    assert {spec.name: spec.queue for spec in reg.specs()} == {
        "lookup_order": "tool.lookup_order",
        "refund": "payments",
        "capture": "payments",
    }


SPECS = [
    ToolSpec(name="a", queue="tool.a"),
    ToolSpec(name="b", queue="shared"),
    ToolSpec(name="c", queue="shared"),
]


@pytest.mark.parametrize(
    ("requested", "consumed"),
    [(None, ["shared", "tool.a"]), (["shared"], ["shared"]), ([" tool.a", "tool.a", ""], ["tool.a"])],
    ids=["every queue of its tools", "narrowed", "spaces and repeats"],
)
def test_a_worker_consumes_the_queues_of_its_tools(requested: list[str] | None, consumed: list[str]) -> None:
    assert build_worker_queues(SPECS, requested) == consumed


@pytest.mark.parametrize(
    ("specs", "requested", "message"),
    [
        (SPECS, ["tools"], "--queues tools: no tool of this worker uses that queue"),
        (SPECS, ["shared", "x", "y"], "--queues x, y: no tool of this worker uses these queues"),
        (SPECS, [""], "--queues (empty)"),
        ([], None, "no tool to serve"),
    ],
    ids=["foreign queue", "two foreign queues", "empty", "no tools"],
)
def test_a_queue_no_tool_uses_is_refused(
    specs: list[ToolSpec], requested: list[str] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        build_worker_queues(specs, requested)
    if specs:
        assert "its tools' queues are shared, tool.a" in str(caught.value)


def test_an_unserved_call_is_answered_not_found_naming_the_tool_the_worker_and_the_queue() -> None:
    request = ToolCallRequest(call_id="t1/c1", tool="lookup_order", turn_id="t1", reply_key="r")
    served = [f"tool_{i}" for i in range(12)]
    outcome = build_unserved_outcome(request, worker="w1@host", queue="shared", served=served, now=5.0)
    assert (outcome.call_id, outcome.turn_id, outcome.ok) == ("t1/c1", "t1", False)
    assert (outcome.failure_kind, outcome.worker, outcome.attempts) == (FailureKind.NOT_FOUND, "w1@host", 0)
    assert not outcome.synthetic and not outcome.retryable
    assert outcome.error == (
        "tool 'lookup_order' is not served by worker w1@host (it serves: tool_0, tool_1, tool_2, tool_3, "
        "tool_4, tool_5, tool_6, tool_7, …); the call reached it from queue 'shared' and was not run"
    )
