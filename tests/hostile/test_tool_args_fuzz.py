"""Hypothesis over tool arguments through `Client.call_tool` (the direct path, a real prefork worker):
wrong types, unknown fields, deep nesting, huge values, odd strings. Every call ends as an outcome —
a success or a failure with its kind — never an exception, and the worker keeps serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import Client
from tests.support.processes import WorkerHandle
from workers.contract import FailureKind

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
arguments = st.one_of(
    st.dictionaries(st.sampled_from(["text", "times", "extra", "password", ""]), json_values, max_size=4),
    st.fixed_dictionaries({"text": st.text(max_size=100), "times": st.integers(-5, 5)}),
    st.fixed_dictionaries({"text": json_values, "times": json_values}),
    st.integers(1, 300).map(lambda n: {"text": _nest(n), "times": 1}),
    st.integers(60_000, 80_000).map(lambda n: {"text": "x" * n}),  # around max_args_bytes
)
FAILURES = {FailureKind.VALIDATION, FailureKind.PAYLOAD_LIMIT, FailureKind.EXECUTION_ERROR}


def _nest(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.fixture(scope="module")
def client(redis_url: str, worker: WorkerHandle) -> Iterator[Client]:
    with Client(redis_url) as c:
        yield c


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=arguments)
def test_any_arguments_end_as_an_outcome(client: Client, worker: WorkerHandle, args: dict[str, Any]) -> None:
    outcome = client.call_tool("echo", args, timeout_s=20)
    if outcome.ok:
        assert isinstance(outcome.result, str)
    else:
        assert outcome.failure_kind in FAILURES, outcome
        assert outcome.content.startswith("Error: ")
    assert worker.process.poll() is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=40), args=json_values.filter(lambda v: isinstance(v, dict)) | st.just({}))
def test_any_tool_name_ends_as_an_outcome(client: Client, name: str, args: dict[str, Any]) -> None:
    outcome = client.call_tool(name, args, timeout_s=20)
    if not outcome.ok:
        assert outcome.content.startswith("Error: ")
    assert outcome.failure_kind != FailureKind.WORKER_LOST


def test_the_worker_still_serves_after_the_fuzzing(client: Client, worker: WorkerHandle) -> None:
    outcome = client.call_tool("echo", {"text": "ab", "times": 2}, timeout_s=20)
    assert outcome.ok and outcome.result == "abab"
    assert worker.process.poll() is None
