"""How a tool task reports its call to Celery (and so to Flower): pure parts, no worker.

The failure a task raises crosses from the pool child to the worker's parent pickled, and is named in the
`task-failed` event by its repr; the redacted copy of the task's kwargs is all Flower ever gets.
"""

from __future__ import annotations

import json
import pickle

from workers.contract import FailureKind, ToolCallRequest, build_failure, build_task_reprs
from workers.errors import ToolCallFailed, ToolCallRetried, ToolloopError
from workers.tasks import ToolTask, build_task_failure

REQUEST = ToolCallRequest(
    call_id="c1",
    tool="lookup",
    arguments={"q": "x", "api_token": "tok-1", "nested": [{"password": "p"}]},
    turn_id="t1",
    context={"user_email": "alice@example.com", "tenant": {"id": 7}},
)


def test_a_failure_outcome_becomes_a_failed_task_named_by_its_kind_and_message() -> None:
    outcome = build_failure(REQUEST, FailureKind.EXECUTION_ERROR, "ValueError: account closed")
    exc = build_task_failure(outcome)
    assert str(exc) == "execution_error: ValueError: account closed"
    assert repr(exc) == "ToolCallFailed('execution_error: ValueError: account closed')"
    assert (exc.kind, exc.message) == ("execution_error", "ValueError: account closed")


def test_the_failure_survives_the_trip_from_the_pool_child_to_the_parent() -> None:
    exc = pickle.loads(pickle.dumps(ToolCallFailed("timeout", "timed out after 5 s")))
    assert isinstance(exc, ToolCallFailed) and isinstance(exc, ToolloopError)
    assert (exc.kind, exc.message, str(exc)) == (
        "timeout",
        "timed out after 5 s",
        "timeout: timed out after 5 s",
    )
    reason = pickle.loads(pickle.dumps(ToolCallRetried("transient failure: busy")))
    assert repr(reason) == "ToolCallRetried('transient failure: busy')"


def test_the_tool_task_expects_its_failures_and_acks_them() -> None:
    assert ToolTask.throws == (ToolCallFailed,)
    assert ToolTask.acks_late and ToolTask.acks_on_failure and ToolTask.acks_on_timeout
    assert not getattr(ToolTask, "autoretry_for", ())  # Celery never retries a failure by itself


def test_flower_gets_ids_redacted_arguments_and_only_the_keys_of_the_context() -> None:
    argsrepr, kwargsrepr = build_task_reprs(REQUEST)
    assert argsrepr == "()"
    assert json.loads(kwargsrepr) == {
        "turn_id": "t1",
        "call_id": "c1",
        "attempt": 1,
        "tenant": "default",
        "arguments": {"q": "x", "api_token": "***", "nested": [{"password": "***"}]},
        "context": {"user_email": "***", "tenant": "***"},
    }
    for secret in ("tok-1", '"p"', "alice@example.com", '"id"'):
        assert secret not in kwargsrepr
