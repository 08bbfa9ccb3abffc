"""The fence (issue 12, item 4) and the gone-turn refusal, executing calls in plain Python on a real Redis.

`execute_call` is what the pool child runs; here it runs in-process (no Celery: it takes none) against a real
redis-server, and "another execution started meanwhile" is staged by writing what its start script writes —
the call's fence — at the moment a frozen worker would have slept through it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.support.store_db import store_db_url
from workers import keys, tool
from workers.call_store import CallStore
from workers.connect import connect_redis
from workers.contract import FailureKind, ToolCallRequest
from workers.execution import Finished, Skipped, execute_call
from workers.fence import build_process_holder
from workers.outcomes import build_idempotency_key
from workers.parent import handle_hard_timeout, handle_revoked
from workers.tools import Tool, registry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

FENCE_DB = 5
RUNS: list[str] = []
# What happens while a body runs (the test's staging of a frozen worker), run by the body after it recorded.
DURING_BODY: list[Callable[[], None]] = []


@pytest.fixture
def store(redis_url: str) -> Iterator[CallStore]:
    client = connect_redis(store_db_url(redis_url, FENCE_DB), decode_responses=False)
    client.flushdb()
    RUNS.clear()
    DURING_BODY.clear()
    yield CallStore(client)
    client.close()


def _supersede(client: redis.Redis, call_id: str) -> None:
    """What the start script of attempt 2, on another worker, leaves: the fence is its token now."""
    client.set(keys.fence(call_id), "2|other@host:7:abcdef012345")


@tool(idempotency="args", soft_time_limit=5, time_limit=6)
def fence_work(tag: str) -> str:
    """Runs its body once per call of the test (recorded in RUNS); the test may supersede it meanwhile."""
    RUNS.append(tag)
    for staged in DURING_BODY:
        staged()
    return f"done {tag}"


def _tool(name: str) -> Tool[Any, Any]:
    found = registry.get(name)
    assert found is not None
    return found


def _request(tag: str, *, attempt: int = 1, turn_id: str | None = None) -> ToolCallRequest:
    return ToolCallRequest(
        call_id=f"call-{uuid.uuid4().hex[:8]}",
        tool="fence_work",
        arguments={"tag": tag},
        attempt=attempt,
        turn_id=turn_id,
    )


def _execute(store: CallStore, request: ToolCallRequest, **options: Any) -> Any:
    return execute_call(
        store,
        _tool("fence_work"),
        request,
        worker="w@host",
        pid=1234,
        soft_limit_s=5,
        hard_limit_s=6,
        **options,
    )


def test_a_superseded_execution_stores_its_success_but_never_writes_its_outcome(store: CallStore) -> None:
    tag = uuid.uuid4().hex
    request = _request(tag)
    client = store.client
    # The worker froze mid-body; attempt 2 started elsewhere (and waits for this execution's lock).
    DURING_BODY.append(lambda: _supersede(client, request.call_id))
    decision = _execute(store, request)
    DURING_BODY.clear()
    assert isinstance(decision, Skipped) and "superseded" in decision.reason
    assert client.exists(keys.outcome(request.call_id), keys.late_outcomes(request.call_id)) == 0
    idem_key = build_idempotency_key(_tool("fence_work").spec, request.arguments, request.tenant)
    assert idem_key is not None and client.exists(idem_key) == 1, "its success is stored, to replay"
    assert client.exists(keys.idempotency_lock(idem_key)) == 0, "and its lock is dropped"
    # Attempt 2 replays the stored success instead of running the body again.
    second = _execute(store, request.model_copy(update={"attempt": 2}))
    assert isinstance(second, Finished) and second.won and second.outcome.idempotent_replay
    assert [tag] == RUNS


def test_an_execution_superseded_before_its_body_does_not_run_it(store: CallStore) -> None:
    tag = uuid.uuid4().hex
    request = _request(tag)
    idem_key = build_idempotency_key(_tool("fence_work").spec, request.arguments, request.tenant)
    assert idem_key is not None
    lock = keys.idempotency_lock(idem_key)
    store.client.set(lock, "an identical call", px=30_000)

    def frozen_while_waiting(_seconds: float) -> None:
        # The worker froze in its idempotency wait; meanwhile the call was dispatched again and started,
        # and the identical call ended without a stored success.
        _supersede(store.client, request.call_id)
        store.client.delete(lock)

    decision = _execute(store, request, sleep=frozen_while_waiting)
    assert isinstance(decision, Skipped) and "before the tool started" in decision.reason
    assert RUNS == []
    assert store.client.exists(keys.outcome(request.call_id), lock) == 0


def test_a_call_whose_turn_is_gone_is_not_run(store: CallStore) -> None:
    request = _request(uuid.uuid4().hex, turn_id="turn_vanished")
    decision = _execute(store, request)
    assert isinstance(decision, Skipped) and "no longer exists" in decision.reason
    assert RUNS == []
    assert store.client.exists(keys.outcome(request.call_id), keys.fence(request.call_id)) == 0
    store.client.set(keys.turn_request("turn_vanished"), "{}")
    assert isinstance(_execute(store, request), Finished) and len(RUNS) == 1


def test_the_parent_answers_only_for_its_own_execution(store: CallStore) -> None:
    request = _request(uuid.uuid4().hex)
    idem_key = build_idempotency_key(_tool("fence_work").spec, request.arguments, request.tenant)
    assert idem_key is not None
    store.start(request, token=build_process_holder(1, "w@host", 99) + "a1", running_ttl_s=10, worker="w")
    store.claim_idempotency(idem_key, holder=build_process_holder(1, "w@host", 99) + "a1", lock_ttl_s=10)
    store.client.delete(keys.running(request.call_id))
    second = request.model_copy(update={"attempt": 2})
    store.start(second, token=build_process_holder(2, "v@host", 5) + "b2", running_ttl_s=10, worker="v")
    # The first worker wakes: its parent kills its pool process (hard limit) and meets the revoke of the
    # first dispatch. Neither answers; the lock its process held goes, the second's guard stays.
    assert not handle_hard_timeout(
        store, request, limit_s=6, worker="w@host", pid=99, idempotency_key=idem_key
    )
    assert not handle_revoked(store, request, expired=False, worker="w@host", pid=None)
    assert store.client.exists(keys.outcome(request.call_id), keys.late_outcomes(request.call_id)) == 0
    assert store.client.exists(keys.idempotency_lock(idem_key)) == 0
    assert store.client.exists(keys.running(request.call_id)) == 1
    # The second attempt's own parent still answers for it.
    assert handle_hard_timeout(store, second, limit_s=6, worker="v@host", pid=5, idempotency_key=idem_key)
    outcome = store.read_outcome(request.call_id, request.turn_id)
    assert outcome is not None and outcome.failure_kind is FailureKind.TIMEOUT
    assert store.client.exists(keys.running(request.call_id)) == 0


def test_a_calls_fence_follows_the_retention_settings(
    store: CallStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.settings import get_worker_settings

    monkeypatch.setenv("TOOLLOOP_OUTCOME_TTL_S", "200")
    monkeypatch.setenv("TOOLLOOP_AUDIT_TTL_S", "100")
    get_worker_settings.cache_clear()
    try:
        request = _request(uuid.uuid4().hex)
        store.start(request, token=build_process_holder(1, "w@host", 99) + "a1", running_ttl_s=10, worker="w")
        ttls = [store.client.ttl(keys.fence(request.call_id))]
    finally:
        get_worker_settings.cache_clear()
    # As long as the outcome or the audit records, whichever is longer: not the built-in seven days.
    assert all(190 < ttl <= 200 for ttl in ttls), ttls
