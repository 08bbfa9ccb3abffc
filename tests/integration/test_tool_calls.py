"""Tool calls through a real redis-server and a real prefork worker (issue 2, "Done when").

No test here times a call (speed belongs in `make bench`): each waits, with a generous timeout, for what it
expects — an outcome, a pool process replaced, the broker done with a message — and then checks it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from orchestrator.client.direct import build_direct_request, call_tool
from orchestrator.client.redis_client import Client
from orchestrator.publishing.publisher import build_task_id, dispatch_call, get_producer_app, revoke_call
from orchestrator.settings import Settings
from tests.support.broker import broker_holds
from tests.support.calls import wait_tool_outcome
from tests.support.processes import WorkerHandle
from tests.support.tools import COUNT_PREFIX
from tests.support.waiting import wait_for, wait_until
from workers import keys, packing, scripts
from workers.contract import FailureKind, ToolOutcome, ToolSpec, build_failure, parse_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _tag() -> str:
    return uuid.uuid4().hex


def _runs(client: redis.Redis, tag: str) -> int:
    return int(client.get(COUNT_PREFIX + tag) or 0)


@pytest.fixture
def call(redis_url: str, worker: WorkerHandle) -> Any:
    def run(name: str, arguments: dict[str, Any], timeout_s: float = 15.0, **kw: Any) -> ToolOutcome:
        return call_tool(redis_url, name, arguments, timeout_s=timeout_s, **kw)

    return run


def test_result(call: Any, worker: WorkerHandle) -> None:
    outcome = call("echo", {"text": "ab", "times": 2})
    assert outcome.ok and outcome.result == "abab" and outcome.content == "abab"
    assert outcome.attempts == 1 and outcome.worker == worker.hostname and outcome.failure_kind is None


def test_execution_error(call: Any) -> None:
    outcome = call("boom", {"message": "disk on fire"})
    assert not outcome.ok and outcome.failure_kind is FailureKind.EXECUTION_ERROR
    assert outcome.content == "Error: ValueError: disk on fire" and not outcome.retryable


def test_validation_failure(call: Any) -> None:
    outcome = call("echo", {"times": "x", "extra": 1})
    assert outcome.failure_kind is FailureKind.VALIDATION
    assert outcome.content.startswith("Error: invalid arguments for 'echo': 'text' is a required property")
    assert outcome.worker is None  # never dispatched


def test_unknown_tool_lists_available_public_tools(call: Any) -> None:
    outcome = call("nope", {})
    assert outcome.failure_kind is FailureKind.NOT_FOUND
    assert outcome.content.startswith("Error: unknown tool 'nope'; available: big, boom, counted,")
    assert "secret_tool" not in outcome.content


def test_sensitive_tool_callable_when_named(call: Any) -> None:
    assert call("secret_tool", {}).result == "hidden"


def test_context_reaches_the_tool(call: Any) -> None:
    outcome = call("whoami", {}, context={"user": "ann"})
    assert outcome.result["user"] == "ann" and outcome.result["attempt"] == 1


def test_the_soft_limit_ends_the_call_as_a_timeout(call: Any) -> None:
    outcome = call("sleepy", {"seconds": 5})
    # The worker's own answer at the soft limit (1 s), not the caller giving up (15 s) nor the hard limit.
    assert outcome.failure_kind is FailureKind.TIMEOUT and not outcome.synthetic
    assert outcome.content == "Error: timed out after 1 s"


def test_hard_limit_kills_a_deaf_cpu_bound_tool_and_worker_serves_next(
    call: Any, worker: WorkerHandle, redis_client: redis.Redis
) -> None:
    before = set(worker.child_pids())
    tag = _tag()
    outcome = call("spin", {"tag": tag})
    assert outcome.failure_kind is FailureKind.TIMEOUT and not outcome.synthetic
    assert "timed out after 1.5 s (hard limit" in outcome.content
    assert _runs(redis_client, tag) == 1
    assert call("echo", {"text": "next"}).result == "next"
    wait_until(lambda: set(worker.child_pids()) != before, "the killed child to be replaced")


def test_sigkilled_child_is_retried(call: Any, redis_client: redis.Redis) -> None:
    tag = _tag()
    outcome = call("die_once", {"tag": tag}, timeout_s=20)
    assert outcome.ok and outcome.result == "survived" and outcome.attempts == 2
    assert _runs(redis_client, tag) == 2


def test_sigkilled_child_without_retries_is_worker_lost(call: Any, redis_client: redis.Redis) -> None:
    tag = _tag()
    outcome = call("die_always", {"tag": tag}, timeout_s=20)
    assert outcome.failure_kind is FailureKind.WORKER_LOST and outcome.retryable
    assert outcome.attempts == 1
    # Celery requeues the lost delivery; its copy meets the outcome and runs nothing. Once the broker holds
    # no message of the call, that copy has been and gone.
    queue = _spec(redis_client, "die_always").queue
    wait_until(
        lambda: not broker_holds(redis_client, outcome.call_id, queue), "the requeued copy to be acked"
    )
    assert _runs(redis_client, tag) == 1


def test_oversized_arguments_refused_before_dispatch(call: Any) -> None:
    outcome = call("small_args", {"text": "y" * 200})
    assert outcome.failure_kind is FailureKind.PAYLOAD_LIMIT
    assert "the limit is 100" in outcome.content and outcome.worker is None


def test_oversized_result_truncated_with_marker_and_full_result_kept(
    call: Any, redis_client: redis.Redis
) -> None:
    outcome = call("big", {"size": 5000})
    assert outcome.ok and outcome.truncated and outcome.result_bytes == 5000
    assert outcome.content.startswith("x" * 1000)
    key = keys.full_result(outcome.call_id)
    assert outcome.full_result_key == key
    # The model is told how much it is not shown, never a Redis key it cannot read.
    assert outcome.content == "x" * 1000 + "\n[truncated: result was 5000 bytes, showing the first 1000]"
    assert json.loads(redis_client.get(key) or b"") == "x" * 5000
    assert 0 < redis_client.ttl(key) <= keys.FULL_RESULT_TTL_S


def test_invalid_result(call: Any) -> None:
    outcome = call("not_json", {})
    assert outcome.failure_kind is FailureKind.INVALID_RESULT
    assert "not JSON-serialisable" in outcome.content


def test_idempotent_tool_runs_once(call: Any, redis_client: redis.Redis) -> None:
    tag = _tag()
    first = call("idem", {"tag": tag, "value": 7})
    second = call("idem", {"tag": tag, "value": 7})
    assert first.ok and not first.idempotent_replay
    assert second.ok and second.idempotent_replay and second.result == first.result
    assert _runs(redis_client, tag) == 1
    assert call("idem", {"tag": tag, "value": 8}).result == {"value": 8, "runs": 2}


def test_a_stored_success_is_never_replayed_to_another_tenant(
    redis_url: str, worker: WorkerHandle, redis_client: redis.Redis
) -> None:
    # One tenant's result replayed to another was a leak of its data through a shared idempotent tool.
    tag = _tag()
    with Client(redis_url) as client:
        acme = [client.call_tool("idem", {"tag": tag, "value": 7}, tenant="acme") for _ in range(2)]
        globex = client.call_tool("idem", {"tag": tag, "value": 7}, tenant="globex")
    assert [o.idempotent_replay for o in acme] == [False, True]
    assert globex.ok and not globex.idempotent_replay and globex.result == {"value": 7, "runs": 2}
    assert _runs(redis_client, tag) == 2


def test_fixed_key_with_other_arguments_conflicts(call: Any, redis_client: redis.Redis) -> None:
    tag = _tag()
    redis_client.delete(
        keys.idempotency("fixed_key", __import__("hashlib").sha256(b"fixed-report").hexdigest(), "default")
    )
    assert call("fixed_key", {"tag": tag, "value": 1}).ok
    assert call("fixed_key", {"tag": tag, "value": 1}).idempotent_replay
    conflict = call("fixed_key", {"tag": tag, "value": 2})
    assert conflict.failure_kind is FailureKind.IDEMPOTENCY_CONFLICT
    assert _runs(redis_client, tag) == 1


def test_transient_failures_retried_with_backoff(call: Any, redis_client: redis.Redis) -> None:
    tag = _tag()
    outcome = call("flaky", {"tag": tag, "failures": 2})
    # Two retries (their backoff, 0.1 then 0.2 s with jitter, is `decide_retry`'s: tests/unit), then success.
    assert outcome.ok and outcome.attempts == 3 and outcome.result["attempt"] == 3
    assert _runs(redis_client, tag) == 3
    # The idempotency key given to the tool is stable across retries (the call id).
    assert outcome.result["key"] == outcome.call_id


def test_transient_failures_exhausted(call: Any) -> None:
    outcome = call("flaky", {"tag": _tag(), "failures": 10})
    assert outcome.failure_kind is FailureKind.EXECUTION_ERROR and outcome.retryable
    assert outcome.attempts == 4 and "after 4 attempts" in outcome.content


def _spec(redis_client: redis.Redis, name: str) -> ToolSpec:
    from orchestrator.store.catalogue import read_catalogue

    return read_catalogue(redis_client)[name]


def test_redelivered_message_does_not_run_a_finished_tool_again(
    redis_url: str, worker: WorkerHandle, redis_client: redis.Redis
) -> None:
    tag = _tag()
    app = get_producer_app(Settings(redis_url=redis_url))
    spec = _spec(redis_client, "counted")
    request = build_direct_request("counted", {"tag": tag}, None, 60.0, time.time())
    dispatch_call(app, spec, request)
    outcome = wait_tool_outcome(redis_client, request.call_id)
    dispatch_call(app, spec, request)  # the same message again, as a redelivery would bring it
    dispatch_call(app, spec, request)
    wait_until(lambda: not broker_holds(redis_client, request.call_id, spec.queue), "both copies to be acked")
    assert outcome.ok and outcome.result == 1
    assert _runs(redis_client, tag) == 1
    assert redis_client.llen(keys.late_outcomes(request.call_id)) == 0


def test_concurrent_writers_leave_exactly_one_outcome(redis_client: redis.Redis) -> None:
    call_id = f"race-{_tag()}"
    script = redis_client.register_script(scripts.WRITE_OUTCOME.source)
    barrier = threading.Barrier(8)
    wins: list[scripts.WriteResult] = []

    def write(i: int) -> None:
        outcome = build_failure((call_id, "echo", None), FailureKind.TIMEOUT, f"writer {i}")
        script_keys, args = scripts.build_write_outcome_call(
            call_id, None, packing.pack(outcome.model_dump_json())
        )
        client = redis.Redis(connection_pool=redis_client.connection_pool)
        barrier.wait()
        wins.append(scripts.parse_write_result(script(keys=script_keys, args=args, client=client)))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == [scripts.WriteResult.LOST] * 7 + [scripts.WriteResult.WON]
    winner = parse_tool_outcome(redis_client.get(keys.outcome(call_id)) or b"")
    late = [parse_tool_outcome(raw) for raw in redis_client.lrange(keys.late_outcomes(call_id), 0, -1)]
    assert len(late) == 7 and winner.error not in {o.error for o in late}


def test_revoked_task_is_cancelled(redis_url: str, worker: WorkerHandle, redis_client: redis.Redis) -> None:
    app = get_producer_app(Settings(redis_url=redis_url))
    # A tool that would run 4.5 s (under its 5 s soft limit): ample time to revoke it while it runs.
    request = build_direct_request("counted", {"tag": _tag(), "sleep_s": 4.5}, None, 30.0, time.time())
    dispatch_call(app, _spec(redis_client, "counted"), request)
    wait_until(lambda: redis_client.get(keys.fence(request.call_id)), "the call to start")
    revoke_call(app, build_task_id(request), terminate=True)
    outcome = wait_tool_outcome(redis_client, request.call_id)
    assert outcome.failure_kind is FailureKind.CANCELLED
    assert outcome.content == "Error: the call was cancelled (task revoked)"


def test_a_vanished_catalogue_entry_is_published_again_before_the_refresh(
    worker: WorkerHandle, redis_client: redis.Redis
) -> None:
    # Redis restarted empty (or a failover to a replica without it) drops the entry: until it is back,
    # every turn would find the worker's tools unserved. It comes back at the worker's next check, not at
    # the periodic refresh, which is due `CATALOGUE_REFRESH_S` after the worker's last publish. That publish
    # is made just before the second removal (the first one's republish), so an entry back before the
    # refresh was due came back because it had vanished — an order of the worker's own timestamps.
    def entry() -> bytes | None:
        raw = redis_client.hget(keys.CATALOGUE, worker.hostname)
        assert not isinstance(raw, str)  # a client that does not decode
        return raw

    def vanish_and_return() -> float:
        redis_client.hdel(keys.CATALOGUE, worker.hostname)
        raw = wait_for(entry, "the entry to be back")
        seen_at: float = json.loads(raw)["seen_at"]
        return seen_at

    published_at = vanish_and_return()
    assert vanish_and_return() < published_at + keys.CATALOGUE_REFRESH_S


def test_a_tool_call_message_carries_its_redacted_arguments_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    # Served by no worker: the message stays on its queue to be read. Celery would also copy the reprs (and
    # an RPC reply address) into the message's properties, stored twice more by Redis (queue, unacked).
    spec = ToolSpec(name="held_for_reading", queue="tool.held_for_reading")
    request = build_direct_request(
        "held_for_reading", {"password": "hunter2", "n": 1}, None, 10.0, time.time()
    )
    dispatch_call(get_producer_app(Settings(redis_url=redis_url)), spec, request)
    (raw,) = redis_client.lrange("tool.held_for_reading", 0, -1)
    message = json.loads(raw)
    assert "hunter2" not in message["headers"]["kwargsrepr"] and '"n": 1' in message["headers"]["kwargsrepr"]
    assert message["headers"]["argsrepr"] == "()"
    assert not {"argsrepr", "kwargsrepr", "reply_to"} & set(message["properties"])
