"""Outcome building, retry schedule and send options: pure functions."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from orchestrator.publishing.publisher import build_limits, build_send_options
from orchestrator.store.catalogue import build_catalogue
from workers import keys
from workers.contract import ToolCallRequest, ToolSpec
from workers.errors import InvalidResultError
from workers.outcomes import (
    build_args_digest,
    build_idempotency_key,
    build_success,
    build_truncation,
    decide_retry,
)

SPEC = ToolSpec(name="t", max_result_bytes=10, retries=2, retry_backoff_s=1, retry_backoff_max_s=3)
REQUEST = ToolCallRequest(call_id="c1", tool="t", arguments={"password": "p", "q": 1}, turn_id="turn1")


def test_string_passes_through_and_json_otherwise() -> None:
    spec = SPEC.model_copy(update={"max_result_bytes": 1000})
    assert (
        build_success(
            REQUEST, spec, "hé", attempts=1, duration_ms=1, worker="w", finished_at=0
        ).outcome.content
        == "hé"
    )
    record = build_success(REQUEST, spec, {"b": "é"}, attempts=1, duration_ms=1, worker="w", finished_at=0)
    assert record.outcome.content == '{"b": "é"}' and record.full_result_json is None


def test_truncation_marker_and_full_result() -> None:
    record = build_success(REQUEST, SPEC, "é" * 8, attempts=1, duration_ms=1, worker="w", finished_at=0)
    outcome = record.outcome
    assert outcome.truncated and outcome.result is None and outcome.result_bytes == 16
    assert outcome.content == "é" * 5 + "\n[truncated: result was 16 bytes, showing the first 10]"
    assert outcome.full_result_key == keys.full_result("c1")
    assert json.loads(record.full_result_json or "") == "é" * 8


def test_truncation_never_splits_a_character() -> None:
    cut = build_truncation("aé" * 10, 2)
    assert cut is not None and cut[0].startswith("a\n[truncated")


@pytest.mark.parametrize("bad", [{1, 2}, object(), float("nan"), b"bytes"])
def test_non_json_results_are_invalid(bad: object) -> None:
    with pytest.raises(InvalidResultError):
        build_success(REQUEST, SPEC, bad, attempts=1, duration_ms=1, worker="w", finished_at=0)


def test_idempotency_keys() -> None:
    args_spec = SPEC.model_copy(update={"idempotency": "args"})

    def key(spec: ToolSpec, arguments: dict[str, int], tenant: str = "default") -> str | None:
        return build_idempotency_key(spec, arguments, tenant)

    assert key(SPEC, {}) is None
    assert key(args_spec, {"a": 1, "b": 2}) == key(args_spec, {"b": 2, "a": 1})
    assert key(args_spec, {"a": 1}) != key(args_spec, {"a": 2})
    fixed = SPEC.model_copy(update={"idempotency": "key:daily"})
    assert key(fixed, {"a": 1}) == key(fixed, {"a": 2})
    # One tenant's stored success is never another's replay; the default tenant's keys kept their layout.
    for spec in (args_spec, fixed):
        assert key(spec, {"a": 1}, "acme") != key(spec, {"a": 1}, "globex")
    digest = build_args_digest({})
    assert (
        key(args_spec, {})
        == keys.idempotency(SPEC.name, digest, "default")
        == f"{keys.PREFIX}idem:t:{digest}"
    )


def test_retry_schedule_exponential_with_jitter_capped_and_deadline() -> None:
    assert decide_retry(1, SPEC, None, 0, 0.0) == 0.5
    assert decide_retry(1, SPEC, None, 0, 0.999) == pytest.approx(1.0, abs=0.01)
    assert decide_retry(2, SPEC, None, 0, 0.0) == 1.0
    assert decide_retry(3, SPEC, None, 0, 0.0) is None  # retries=2: three attempts in all
    capped = SPEC.model_copy(update={"retries": 10})
    assert decide_retry(6, capped, None, 0, 0.999) == pytest.approx(3.0, abs=0.01)
    assert decide_retry(1, SPEC, 100.4, 100.0, 0.0) is None  # would pass the deadline


def test_send_options() -> None:
    spec = ToolSpec(name="t", queue="q1", soft_time_limit_s=5, time_limit_s=10)
    request = REQUEST.model_copy(update={"deadline_at": 1000.0, "attempt": 2})
    options = build_send_options(spec, request, now=500.0)
    assert options["name"] == "tool.t" and options["queue"] == "q1" and options["task_id"] == "c1:2"
    assert (options["soft_time_limit"], options["time_limit"]) == (5, 10)
    assert options["expires"] == datetime.fromtimestamp(1000.0, tz=UTC)
    assert options["kwargs"]["arguments"]["password"] == "p"
    shown = json.loads(options["kwargsrepr"])
    assert shown["arguments"] == {"password": "***", "q": 1} and shown["turn_id"] == "turn1"
    assert shown["call_id"] == "c1"
    assert options["headers"] == {"toolloop_turn_id": "turn1", "toolloop_call_id": "c1"}


def test_limits_capped_by_deadline() -> None:
    spec = ToolSpec(name="t", soft_time_limit_s=5, time_limit_s=10)
    request = REQUEST.model_copy(update={"deadline_at": 104.0})
    soft, hard = build_limits(spec, request, now=100.0)
    assert hard == 5.0 and soft == pytest.approx(4.5)  # past the deadline (104): it answers first
    assert build_limits(spec, REQUEST, now=100.0) == (5, 10)


def test_catalogue_merge_skips_stale_and_malformed() -> None:
    fresh = json.dumps(
        {"seen_at": 100.0, "tools": [ToolSpec(name="a").model_dump(), ToolSpec(name="b").model_dump()]}
    )
    newer = json.dumps({"seen_at": 101.0, "tools": [ToolSpec(name="a", description="new").model_dump()]})
    stale = json.dumps({"seen_at": 1.0, "tools": [ToolSpec(name="old").model_dump()]})
    merged = build_catalogue({"w1": fresh, "w2": newer, "w3": stale, "w4": "not json"}, now=110.0)
    assert list(merged) == ["a", "b"] and merged["a"].description == "new"
