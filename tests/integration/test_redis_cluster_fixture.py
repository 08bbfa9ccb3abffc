"""The Redis Cluster fixture (`ops.redis_cluster`) is a real cluster: keys spread over three masters
by hash tag, one tag's keys meet in one Lua script, a failover (CLUSTER FAILOVER, then SIGKILL) keeps what
was written and replicated, and `command_counts` grows on the master that served the commands.

One cluster for the module; the tests that fail a master over ask it who leads now instead of assuming.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.cluster

from ops.redis_cluster import ClusterNode, RedisCluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Both keys of the script are in the {order:7} slot; {order:8} is another slot.
SET_BOTH = """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
return redis.call('MGET', KEYS[1], KEYS[2])
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture
def client(cluster: RedisCluster) -> redis.cluster.RedisCluster:
    # A fresh one per test (closed with the cluster): the slots it learns first are the current ones.
    return cluster.client()


def node_at(cluster: RedisCluster, port: int) -> ClusterNode:
    return next(node for node in cluster.nodes if node.port == port)


def keys_on(cluster: RedisCluster, master: ClusterNode, prefix: str, count: int) -> list[str]:
    """`count` keys, each with its own hash tag, in slots `master` serves."""
    keys: list[str] = []
    index = 0
    while len(keys) < count:
        key = f"{{{prefix}:{index}}}:value"
        if cluster.master_of(key) is master:
            keys.append(key)
        index += 1
    return keys


def test_any_node_names_the_cluster(cluster: RedisCluster) -> None:
    assert len(cluster.urls) == 6
    assert cluster.url in cluster.urls
    masters = cluster.masters()
    assert len(masters) == 3
    assert {cluster.replica_of(master).port for master in masters}.isdisjoint(m.port for m in masters)
    with redis.cluster.RedisCluster.from_url(cluster.urls[-1], decode_responses=True) as client:
        assert {node.port for node in client.get_primaries()} == {master.port for master in masters}


def test_hash_tags_spread_keys_over_the_masters(
    cluster: RedisCluster, client: redis.cluster.RedisCluster
) -> None:
    written: dict[int, list[str]] = {}
    for index in range(30):
        key = f"{{user:{index}}}:name"
        client.set(key, key)
        written.setdefault(cluster.master_of(key).port, []).append(key)

    assert set(written) == {master.port for master in cluster.masters()}
    for port, keys in written.items():
        # The master of their slots holds the keys; any other redirects.
        assert [cluster.node_client(node_at(cluster, port)).get(key) for key in keys] == keys
        other = next(master for master in cluster.masters() if master.port != port)
        with pytest.raises(redis.exceptions.MovedError):
            cluster.node_client(other).get(keys[0])


def test_keys_of_one_tag_meet_in_one_script(
    cluster: RedisCluster, client: redis.cluster.RedisCluster
) -> None:
    assert client.eval(SET_BOTH, 2, "{order:7}:a", "{order:7}:b", "paid") == ["paid", "paid"]

    owner = cluster.master_of("{order:7}:a")
    with pytest.raises(redis.ResponseError, match="same slot"):
        cluster.node_client(owner).eval(SET_BOTH, 2, "{order:7}:a", "{order:8}:b", "paid")


def test_counts_grow_on_the_master_that_served(
    cluster: RedisCluster, client: redis.cluster.RedisCluster
) -> None:
    key = "{counted}:hits"
    owner = cluster.master_of(key).port
    cluster.reset_stats()
    before = cluster.command_counts()

    for _ in range(20):
        client.incr(key)

    after = cluster.command_counts()
    assert after[owner] - before[owner] >= 20
    assert {port: after[port] for port in after if port != owner} == {
        port: before[port] for port in before if port != owner
    }


def test_failover_keeps_what_was_written(cluster: RedisCluster, client: redis.cluster.RedisCluster) -> None:
    master = cluster.masters()[0]
    replica = cluster.replica_of(master)
    keys = keys_on(cluster, master, "failover", 10)
    writer = cluster.node_client(master)
    for key in keys:
        writer.set(key, key)
    assert writer.wait(1, 5000) == 1

    new = cluster.failover(master)

    assert new is replica
    assert cluster.replica_of(new) is master
    assert master not in cluster.masters()
    # The client follows the MOVED replies to the new master.
    assert [client.get(key) for key in keys] == keys
    client.set(keys[0], "after")
    assert cluster.node_client(new).get(keys[0]) == "after"


def test_kill_master_keeps_what_was_replicated(
    cluster: RedisCluster, client: redis.cluster.RedisCluster
) -> None:
    master = cluster.masters()[1]
    replica = cluster.replica_of(master)
    killed_pid = master.pid
    keys = keys_on(cluster, master, "kill", 10)
    writer = cluster.node_client(master)
    for key in keys:
        writer.set(key, key)
    assert writer.wait(1, 5000) == 1

    new = cluster.kill_master(master)

    assert new is replica
    assert master.pid not in (None, killed_pid)
    assert cluster.replica_of(new) is master
    assert [client.get(key) for key in keys] == keys
    # The restarted node synced from the new master: it holds what the new master holds.
    wait_until(
        lambda: cluster.node_client(master).dbsize() == cluster.node_client(new).dbsize(),
        "the rejoined node in sync",
    )
