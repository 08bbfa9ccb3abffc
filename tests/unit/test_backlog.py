"""The backlog's pure parts (`orchestrator.store.backlog`): kombu's list names, a message's dispatch time,
bounded labels, counts; and their exposition (`metrics.render_latest`). Redis and the processes:
tests/integration/test_backlog_metrics.py."""

from __future__ import annotations

import base64
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import metrics
from orchestrator.model import TurnStatus
from orchestrator.store.backlog import (
    OTHER,
    Backlog,
    ToolQueue,
    TurnCount,
    build_priorities,
    build_queue_lists,
    build_tool_queues,
    build_turn_labels,
    count_turns,
    parse_dispatched_at,
)

pytestmark = pytest.mark.timeout(10)


def kombu_message(kwargs: dict[str, object]) -> str:
    """A task message as kombu's Redis transport stores it (protocol 2 body, base64)."""
    body = base64.b64encode(json.dumps([[], kwargs, {}]).encode()).decode()
    return json.dumps({"body": body, "headers": {}, "properties": {"body_encoding": "base64"}})


def test_queue_lists_are_kombus_priority_lists() -> None:
    assert build_queue_lists("tool.echo") == (
        "tool.echo",
        "tool.echo\x06\x163",
        "tool.echo\x06\x166",
        "tool.echo\x06\x169",
    )


def test_dispatch_time_of_a_message() -> None:
    assert parse_dispatched_at(kombu_message({"call_id": "c", "dispatched_at": 1700.5})) == 1700.5
    assert parse_dispatched_at(kombu_message({"call_id": "c"})) is None
    assert parse_dispatched_at("not json") is None
    assert parse_dispatched_at(None) is None


def test_tool_queue_sums_its_lists_and_ages_its_oldest() -> None:
    old, new = kombu_message({"dispatched_at": 100.0}), kombu_message({"dispatched_at": 130.0})
    replies = [2, new, 0, None, 1, old, 0, None]
    assert build_tool_queues(["tool.a"], replies, now=160.0) == {"tool.a": ToolQueue("tool.a", 3, 60.0)}
    assert build_tool_queues(["tool.a"], [0, None] * 4, now=160.0) == {"tool.a": ToolQueue("tool.a", 0, 0.0)}


def test_labels_stay_bounded() -> None:
    priorities = build_priorities()
    tenants = frozenset({"default", "acme"})
    assert build_turn_labels(json.dumps({"tenant": "acme"}), tenants, priorities)[0] == "acme"
    assert build_turn_labels(json.dumps({"tenant": "zeta"}), tenants, priorities)[0] == OTHER
    assert build_turn_labels(json.dumps({"priority": "x" * 50}), tenants, priorities) == ("default", OTHER)
    assert build_turn_labels(None, tenants, priorities) == ("default", "normal")


def test_counts_keep_every_pair() -> None:
    labels = {"t1": ("acme", "normal"), "t2": ("acme", "normal"), "t3": (OTHER, "normal")}
    statuses = {"t1": TurnStatus.QUEUED, "t2": TurnStatus.RUNNING, "t3": TurnStatus.WAITING, "t4": None}
    counts = count_turns(statuses, labels, ["default", "acme"], ["normal"])
    assert counts == {
        ("acme", "normal"): TurnCount(1, 1),
        ("default", "normal"): TurnCount(0, 0),
        (OTHER, "normal"): TurnCount(0, 0),
    }


def test_exposition_names() -> None:
    backlog = Backlog(
        0.0,
        {"tool.a": ToolQueue("tool.a", 4, 2.5)},
        {("acme", "normal"): TurnCount(3, 1)},
        {"openai": 2},
    )
    body, _ = metrics.render_latest(backlog)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("toolloop_tool_queue_length", (("queue", "tool.a"),))] == 4
    assert samples[("toolloop_tool_queue_oldest_age_seconds", (("queue", "tool.a"),))] == 2.5
    assert samples[("toolloop_turns_queued", (("priority", "normal"), ("tenant", "acme")))] == 3
    assert samples[("toolloop_turns_running", (("priority", "normal"), ("tenant", "acme")))] == 1
    assert samples[("toolloop_model_calls_waiting", (("limit", "openai"),))] == 2
    assert b"toolloop_tool_queue_length" not in metrics.render_latest()[0]  # an orchestrator's: none
