"""The worker's channels send their commands through one Redis client each (`SharedClientChannel`):
kombu built a new client per publish, ack and unacked record. The one client keeps working where kombu's
fresh ones did: after the channel's pools are dropped and built again, in a forked process, and for a
Sentinel broker's channels (chosen here; the Sentinel fixture's tests run them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Producer

from workers.broker import (
    RestartSafeChannel,
    RestartSafeSentinelChannel,
    SharedClientChannel,
    SharedClientSentinelChannel,
    use_restart_safe_channels,
    use_shared_clients,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
def connection(redis_url: str) -> Iterator[Connection]:
    with Connection(redis_url) as conn:
        use_shared_clients(conn.transport)
        yield conn


def _client_of(channel: SharedClientChannel) -> redis.Redis:
    with channel.conn_or_acquire() as client:
        return client


def test_a_channel_publishes_through_one_client(connection: Connection, redis_client: redis.Redis) -> None:
    channel = connection.channel()
    assert isinstance(channel, SharedClientChannel)
    first = _client_of(channel)
    assert _client_of(channel) is first
    listener = redis_client.pubsub()
    listener.psubscribe("*celeryev*")
    listener.get_message(timeout=1)  # the subscription's own reply
    # Celery publishes its events to a fanout exchange on Redis (celery.events.event.get_exchange).
    producer = Producer(channel, exchange=Exchange("celeryev", type="fanout"), serializer="json")
    for n in range(3):
        producer.publish({"n": n}, routing_key="task.multi")
    received = [listener.get_message(timeout=2) for _ in range(3)]
    assert all(message is not None and message["type"] == "pmessage" for message in received)
    assert _client_of(channel) is first, "publishing built no client of its own"
    listener.close()


def test_a_pool_built_again_gets_a_client_of_its_own(connection: Connection) -> None:
    channel = connection.channel()
    first = _client_of(channel)
    channel._disconnect_pools()
    second = _client_of(channel)
    assert second is not first
    assert second.connection_pool is channel.pool
    assert second.ping()


def test_a_forked_process_uses_the_client_on_connections_of_its_own(connection: Connection) -> None:
    channel = connection.channel()
    client = _client_of(channel)
    assert client.ping()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only when its PING, on a connection of its own, answered
        code = 1
        try:
            code = 0 if _client_of(channel) is client and client.ping() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.ping(), "the parent's connection is still its own after the child used the pool"


def test_each_worker_connection_gets_its_kind_of_channel() -> None:
    for url, shared, restart_safe in (
        ("redis://localhost:1/0", SharedClientChannel, RestartSafeChannel),
        ("sentinel://localhost:1/0", SharedClientSentinelChannel, RestartSafeSentinelChannel),
    ):
        events, consumer = Connection(url), Connection(url)
        use_shared_clients(events.transport)
        use_restart_safe_channels(consumer.transport)
        assert events.transport.Channel is shared
        assert consumer.transport.Channel is restart_safe
        assert issubclass(restart_safe, SharedClientChannel)
