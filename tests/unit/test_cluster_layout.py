"""Where a Redis Cluster puts the turn queue's shards and a conversation's turns (`workers.keys`): the shards'
slots spread evenly, a named tenant's turns in one shard and the default tenant's spread; a conversation's
turn ids share its slot whatever the conversation id; one Redis keeps the one queue it always had."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from orchestrator.store import codec
from workers import keys
from workers.contract import DEFAULT_TENANT

pytestmark = pytest.mark.timeout(30)

# A cluster made by `redis-cli --cluster create` with three masters: even runs of slots.
THREE_MASTERS = ((0, 5460), (5461, 10922), (10923, 16383))


@pytest.fixture
def cluster_layout() -> Iterator[None]:
    keys.use_cluster_layout(True)
    try:
        yield
    finally:
        keys.use_cluster_layout(False)


def _master_of(slot: int) -> int:
    return next(i for i, (low, high) in enumerate(THREE_MASTERS) if low <= slot <= high)


@pytest.mark.usefixtures("cluster_layout")
def test_the_shards_spread_evenly_over_three_masters_and_keep_their_keys_together() -> None:
    shards = keys.all_queue_shards()
    assert len(shards) == keys.QUEUE_SHARDS
    slots = []
    for shard in shards:
        names = [shard.queue, shard.active, shard.claiming, shard.parked, shard.recent, shard.homes]
        names += [
            shard.turn_queue("batch", "acme"),
            shard.lane_tenants("normal"),
            shard.tenant_running("acme"),
        ]
        assert len({key_slot(name.encode()) for name in names}) == 1, names
        slots.append(key_slot(shard.queue.encode()))
    assert Counter(_master_of(slot) for slot in slots) == {0: 4, 1: 4, 2: 4}
    ready = {key_slot(keys.ready_tokens(lane).encode()) for lane in keys.TURN_LANES}
    assert len(ready) == 1  # one BLPOP waits on the three lanes


@pytest.mark.usefixtures("cluster_layout")
def test_a_named_tenants_turns_share_one_shard_and_the_default_tenants_spread() -> None:
    ids = [codec.new_turn_id() for _ in range(600)]
    assert len({keys.queue_shard(t, "acme") for t in ids}) == 1
    spread = Counter(keys.queue_shard(t, DEFAULT_TENANT).index for t in ids)
    assert len(spread) == keys.QUEUE_SHARDS and min(spread.values()) > 20


def test_one_redis_keeps_its_one_queue() -> None:
    shard = keys.queue_shard("turn_x", "acme")
    assert keys.all_queue_shards() == [shard]
    assert (shard.queue, shard.active, shard.homes) == (keys.TURN_QUEUE, keys.TURNS_ACTIVE, keys.TURNS_HOMES)
    assert shard.queue == "toolloop:turns:pending"
    assert shard.tenant_running("acme") == "toolloop:tenant:acme:running"


@pytest.mark.parametrize("conversation", ["chat-1", "a}b{c", "{x}", "ü" * 40, "}{"])
def test_a_conversations_turn_ids_share_its_slot_and_look_as_any_other(conversation: str) -> None:
    for _ in range(50):
        turn_id = codec.new_turn_id(conversation)
        assert keys.turn_slot(turn_id) == keys.conversation_slot(conversation)
        assert turn_id.startswith(codec.TURN_ID_PREFIX) and len(turn_id) == len(codec.new_turn_id())
        int(turn_id.removeprefix(codec.TURN_ID_PREFIX), 16)  # hex, as every turn id
    keys.use_cluster_layout(True)
    try:
        # As the cluster names the keys: the turn's and its conversation's in one slot.
        turn_id = codec.new_turn_id(conversation)
        names = [
            keys.turn_state(turn_id),
            keys.outcome("call_1", turn_id),
            keys.conversation_lock(conversation),
        ]
        names += [keys.conversation_history(conversation), keys.conversation_waiting(conversation)]
        assert len({key_slot(name.encode()) for name in names}) == 1, names
    finally:
        keys.use_cluster_layout(False)


@pytest.mark.usefixtures("cluster_layout")
@pytest.mark.parametrize("turn_id", ["}x", "}", "a}b", "{y}", "turn_{z"])
def test_a_callers_odd_turn_id_keeps_its_keys_in_one_slot(turn_id: str) -> None:
    names = [keys.turn_state(turn_id), keys.turn_events(turn_id), keys.outcome("call_1", turn_id)]
    names += [keys.fence("call_1", turn_id), keys.turn_history(turn_id)]
    assert len({key_slot(name.encode()) for name in names}) == 1, names
    assert len(set(names)) == len(names)


def test_an_id_not_made_for_a_conversation_seldom_shares_its_slot() -> None:
    stems = [f"turn_{uuid.uuid4().hex[:28]}" for _ in range(200)]
    fitted = [keys.fit_turn_id(stem, "chat-1") for stem in stems]
    assert 0.6 < sum(f is not None for f in fitted) / len(fitted) < 0.95  # about four stems in five fit
    assert sum(keys.turn_slot(stem + "0000") == keys.conversation_slot("chat-1") for stem in stems) < 3
