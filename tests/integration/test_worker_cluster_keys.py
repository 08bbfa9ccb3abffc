"""A worker's call on one Redis and on a Redis Cluster (`ops.redis_cluster`), through its real
scripts.

On one Redis `start.lua` and `write_outcome.lua` notify the turn's owner themselves, with exactly the fields
`workers.scripts` builds for a cluster (held equal here, byte for byte). On a cluster every script of a call
runs in one slot — its turn's, or a direct call's own — and the worker adds those notifications to the owner's
inbox itself: a started and finished turn call is told there, a direct call answers on its reply list, the
slots, the idempotency claim, the progress and waiting events, a reload of scripts Redis forgot and the
catalogue's transaction all work.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster

from ops.redis_cluster import RedisCluster
from workers import keys, packing, scripts
from workers.call_store import CallStore, OutcomeWrite
from workers.catalogue import publish_catalogue, remove_catalogue
from workers.concurrency import SlotStore, build_slot_claim
from workers.connect import connect_redis
from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec
from workers.poison import NamedCall, is_waited_for
from workers.progress import SOCKET_TIMEOUT_S, ProgressSink, build_event_fields
from workers.settings import get_worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OWNER = "orch-cluster-keys"


def _inbox(client: Any) -> list[list[tuple[str, str]]]:
    """The notifications in the owner's inbox, oldest first, each its fields in order."""
    return [
        [(_text(k), _text(v)) for k, v in fields.items()] for _, fields in client.xrange(keys.inbox(OWNER))
    ]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _open_turn(client: Any) -> str:
    """A running turn: its request, events and lease (the owner's), and the owner's inbox, as an orchestrator
    keeps it (`keep_inbox.lua`: created empty, by an entry trimmed at once)."""
    turn_id = f"turn_ck_{uuid.uuid4().hex[:10]}"
    client.set(keys.turn_request(turn_id), "{}")
    client.xadd(keys.turn_events(turn_id), build_event_fields("turn_queued", {}, time.time()))
    client.set(keys.turn_lease(turn_id), OWNER)
    client.xadd(keys.inbox(OWNER), {"kind": "open"}, maxlen=0, approximate=False)
    return turn_id


def _outcome(request: ToolCallRequest, content: str = "done") -> ToolOutcome:
    return ToolOutcome(
        call_id=request.call_id, tool=request.tool, turn_id=request.turn_id, ok=True, content=content
    )


# --- one Redis: the scripts write the fields the worker writes on a cluster ------------------------------


@pytest.fixture
def one_redis(db_url: str) -> Iterator[CallStore]:
    client = redis.Redis.from_url(db_url)
    yield CallStore(client)
    client.close()


@pytest.mark.parametrize(
    # Large: past the limit even compressed (random hex digits shrink to 58 %).
    "content",
    ["small", random.Random(0).randbytes(keys.INBOX_OUTCOME_MAX_BYTES).hex()],
    ids=["inline", "large"],
)
def test_on_one_redis_the_scripts_notify_with_the_fields_the_worker_builds(
    one_redis: CallStore, content: str
) -> None:
    assert not keys.is_cluster_layout()
    client = one_redis.client
    turn_id = _open_turn(client)
    request = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    assert one_redis.start(request, token="1|w:1:a", running_ttl_s=10, worker="w@host") == (1, 0)
    outcome = _outcome(request, content)
    write = OutcomeWrite.of(outcome, scripts.Fence(1, "1|w:1:a"), holder="1|w:1:a")
    assert one_redis.finish(write) is scripts.WriteResult.WON
    started, told = _inbox(client)
    at = dict(started)["at"]
    assert started == list(
        scripts.build_started_notification(
            turn_id, request.call_id, attempt=1, worker="w@host", at=at
        ).items()
    )
    assert told == list(
        scripts.build_outcome_notification(turn_id, request.call_id, packing.pack(write.outcome_json)).items()
    )
    assert client.xlen(keys.inbox(OWNER)) == 2, "each notification once"


# --- a Redis Cluster -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture
def cluster_layout() -> Iterator[None]:
    get_worker_settings()  # built (and cached) first: building settings sets the layout they name
    keys.use_cluster_layout(True)
    try:
        yield
    finally:
        keys.use_cluster_layout(False)


@pytest.fixture
def on_cluster(cluster: RedisCluster, cluster_layout: None) -> Iterator[CallStore]:
    client = connect_redis(cluster.url, decode_responses=False)
    assert isinstance(client, redis.cluster.RedisCluster)
    yield CallStore(client)
    client.close()


def test_on_a_cluster_a_turn_calls_start_and_outcome_reach_its_owners_inbox(on_cluster: CallStore) -> None:
    client = on_cluster.client
    turn_id = _open_turn(client)
    request = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    token = "1|w:1:a"
    assert on_cluster.start(request, token=token, running_ttl_s=10, worker="w@host") == (1, 0)
    assert on_cluster.start(request, token=token, running_ttl_s=10, worker="w@host") == (1, 0)  # a lost reply
    assert on_cluster.is_current(request.call_id, turn_id, token)
    assert on_cluster.read_holder(request.call_id, turn_id) == token
    assert on_cluster.read_attempts(request.call_id, turn_id) == 1
    idem_key = keys.idempotency("scrape", uuid.uuid4().hex, "default")
    assert on_cluster.claim_idempotency(idem_key, holder=token, lock_ttl_s=5) == (
        scripts.IdempotencyClaim.CLAIMED,
        None,
    )
    outcome = _outcome(request)
    write = OutcomeWrite.of(
        outcome,
        scripts.Fence(1, token),
        holder=token,
        idempotency_lock=keys.idempotency_lock(idem_key),
        idempotency_key=idem_key,
        idempotency_record='{"result": "done"}',
    )
    assert on_cluster.finish(write) is scripts.WriteResult.WON
    # The repeated start (its first reply "lost") told the owner again, with its own time: the owner drops a
    # duplicate.
    first, again, finished = _inbox(client)
    for started in (first, again):
        expected = scripts.build_started_notification(
            turn_id, request.call_id, attempt=1, worker="w@host", at=dict(started)["at"]
        )
        assert started == list(expected.items())
    told = scripts.build_outcome_notification(turn_id, request.call_id, packing.pack(write.outcome_json))
    assert finished == list(told.items())
    assert on_cluster.read_outcome(request.call_id, turn_id) == outcome
    assert client.exists(keys.running(request.call_id, turn_id), keys.idempotency_lock(idem_key)) == 0
    assert client.get(idem_key) == b'{"result": "done"}'
    # A write tried again after its reply was lost finds its outcome landed, and tells the owner once more.
    assert on_cluster.finish(write, check_landed=True) is scripts.WriteResult.WON
    assert _inbox(client)[-2:] == [list(told.items())] * 2
    # Another writer loses, and tells nobody.
    assert on_cluster.finish(OutcomeWrite.of(_outcome(request, "late"), None)) is scripts.WriteResult.LOST
    assert len(_inbox(client)) == 4


def test_on_a_cluster_a_superseded_execution_and_a_gone_turn_write_nothing(on_cluster: CallStore) -> None:
    client = on_cluster.client
    gone = ToolCallRequest(call_id="turn_gone/call_1", tool="scrape", turn_id="turn_gone")
    assert on_cluster.start(gone, token="1|w:1:a", running_ttl_s=10, worker="w") == (
        scripts.StartResult.TURN_GONE,
        0,
    )
    turn_id = _open_turn(client)
    first = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    assert on_cluster.start(first, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    on_cluster.release(first.call_id, turn_id, "1|w:1:a")
    second = first.model_copy(update={"attempt": 2})
    assert on_cluster.start(second, token="2|w:2:b", running_ttl_s=10, worker="w") == (2, 0)
    assert not on_cluster.is_current(first.call_id, turn_id, "1|w:1:a")
    fenced = OutcomeWrite.of(_outcome(first), scripts.Fence(1, "1|w:1:a"))
    assert on_cluster.finish(fenced) is scripts.WriteResult.FENCED
    assert [dict(fields)["kind"] for fields in _inbox(client)] == ["started", "started"]


def test_on_a_cluster_a_direct_call_answers_on_its_reply_list(on_cluster: CallStore) -> None:
    client = on_cluster.client
    call_id = f"direct_{uuid.uuid4().hex[:10]}"
    request = ToolCallRequest(call_id=call_id, tool="scrape", reply_key=keys.reply(call_id, None))
    assert is_waited_for(on_cluster, NamedCall(call_id, "scrape"))
    assert on_cluster.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    write = OutcomeWrite.of(
        _outcome(request), scripts.Fence(1, "1|w:1:a"), reply_key=request.reply_key, holder="1|w:1:a"
    )
    assert on_cluster.finish(write) is scripts.WriteResult.WON
    assert client.lrange(keys.reply(call_id, None), 0, -1) == [call_id.encode()]
    assert not is_waited_for(on_cluster, NamedCall(call_id, "scrape"))


def test_on_a_cluster_a_write_after_redis_forgot_its_scripts_lands_once(on_cluster: CallStore) -> None:
    client = on_cluster.client
    turn_id = _open_turn(client)
    request = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    assert on_cluster.start(request, token="1|w:1:a", running_ttl_s=10, worker="w") == (1, 0)
    client.script_flush()
    write = OutcomeWrite.of(_outcome(request), scripts.Fence(1, "1|w:1:a"), holder="1|w:1:a")
    assert on_cluster.finish(write) is scripts.WriteResult.WON
    assert client.exists(keys.running(request.call_id, turn_id)) == 0
    assert [dict(fields)["kind"] for fields in _inbox(client)] == ["started", "outcome"]


@pytest.mark.parametrize(("fleet", "per_tenant"), [(1, None), (None, 1), (1, 1)])
def test_on_a_cluster_slots_are_taken_and_given_back(
    on_cluster: CallStore, fleet: int | None, per_tenant: int | None
) -> None:
    slots = SlotStore(on_cluster.client)
    spec = ToolSpec(
        name=f"limited_{uuid.uuid4().hex[:8]}", max_concurrency=fleet, max_concurrency_per_tenant=per_tenant
    )
    claim = build_slot_claim(spec, "acme")
    assert claim is not None
    assert slots.acquire(claim, "1|w:1:a", ttl_s=10) == (scripts.SlotResult.ACQUIRED, 0)
    full = scripts.SlotResult.TOOL_FULL if fleet else scripts.SlotResult.TENANT_FULL
    assert slots.acquire(claim, "1|w:2:b", ttl_s=10) == (full, 1)
    assert slots.release(claim.keys, "1|w:1:a") == (2 if fleet and per_tenant else 1)
    assert slots.acquire(claim, "1|w:2:b", ttl_s=10) == (scripts.SlotResult.ACQUIRED, 0)


def test_on_a_cluster_progress_and_waiting_reach_the_turns_stream(
    cluster: RedisCluster, on_cluster: CallStore
) -> None:
    client = on_cluster.client
    turn_id = _open_turn(client)
    request = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    claim = build_slot_claim(ToolSpec(name="scrape", max_concurrency=1), request.tenant)
    assert claim is not None
    slots = SlotStore(client)
    told = slots.tell_waiting(request, claim, scripts.SlotResult.TOOL_FULL, 1)
    assert told is scripts.SlotWaitingResult.ADDED
    assert (
        slots.tell_waiting(request, claim, scripts.SlotResult.TOOL_FULL, 1) is scripts.SlotWaitingResult.TOLD
    )
    sink = ProgressSink(cluster.url)
    fields = build_event_fields("tool_progress", {"message": "half"}, time.time())
    assert sink.append(turn_id, request.call_id, "1|w:1:a", fields) is scripts.ProgressResult.ADDED
    entries: Any = client.xrange(keys.turn_events(turn_id))
    names = [_text(entry[b"name"]) for _, entry in entries]
    assert names == ["turn_queued", "tool_waiting_for_slot", "tool_progress"]
    # Its client gives up fast and never retries, on every node it knows.
    registered = sink._connect().registered_client
    assert isinstance(registered, redis.cluster.RedisCluster)
    progress_client: Any = registered  # redis-py's cluster client is untyped
    assert progress_client.retry.get_retries() == 0
    for node in progress_client.get_nodes():
        if node.redis_connection is not None:
            options = node.redis_connection.connection_pool.connection_kwargs
            assert options["socket_timeout"] == options["socket_connect_timeout"] == SOCKET_TIMEOUT_S
    progress_client.close()


def test_on_a_cluster_the_catalogue_is_published_and_removed_in_one_transaction(
    on_cluster: CallStore,
) -> None:
    client = on_cluster.client
    worker_id = f"w_{uuid.uuid4().hex[:8]}@host"
    spec = ToolSpec(name=f"listed_{uuid.uuid4().hex[:8]}")
    publish_catalogue(client, worker_id, [spec])
    assert client.hexists(keys.CATALOGUE, worker_id)
    assert client.hexists(keys.TOOLS_SERVED, spec.name)
    remove_catalogue(client, worker_id, [spec])
    assert not client.hexists(keys.CATALOGUE, worker_id)
