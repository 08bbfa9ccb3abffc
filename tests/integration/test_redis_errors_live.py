"""`workers.redis_errors` against a real redis-server (issue 35, item 1): what Redis really refuses with — out
of memory under `maxmemory` with `noeviction`, a replica's READONLY, BUSY while a script runs — is classified
as the module says, through every path a refusal takes (a command, a Lua script, a MULTI/EXEC, a pipeline)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from orchestrator.redis_server import RedisServer
from tests.support.waiting import wait_for
from workers.redis_errors import RedisErrorClass, RedisErrorKind, classify

pytestmark = pytest.mark.timeout(60)


def meaning_of(call: object) -> RedisErrorClass:
    """What the Redis error `call()` raises means."""
    assert callable(call)
    with pytest.raises(redis.RedisError) as raised:
        call()
    meaning = classify(raised.value)
    assert meaning is not None, repr(raised.value)
    return meaning


@pytest.fixture
def full_redis() -> Iterator[redis.Redis]:
    """A redis-server at `maxmemory 1mb` under `noeviction`, filled until it refuses a write (an empty Redis
    may use more than 1 MB already)."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1mb")
        try:
            for n in range(200):  # at most 20 MB: a 1 MB Redis refuses long before
                client.set(f"fill:{n}", b"x" * 100_000)
        except redis.exceptions.OutOfMemoryError:
            pass
        yield client
        client.close()


def test_a_full_redis_refuses_writes_as_out_of_memory_however_they_come(full_redis: redis.Redis) -> None:
    out_of_memory = RedisErrorClass(RedisErrorKind.OUT_OF_MEMORY, "OOM")
    assert meaning_of(lambda: full_redis.set("k", "v")) == out_of_memory
    script = full_redis.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    assert meaning_of(lambda: script(keys=["k"], args=["v"])) == out_of_memory
    # A MULTI/EXEC (kombu's ack): redis-py raises the queued command's refusal, not a bare EXECABORT.
    transaction = full_redis.pipeline(transaction=True).set("k", "v").zrem("z", "m")
    assert meaning_of(transaction.execute) == out_of_memory
    pipeline = full_redis.pipeline(transaction=False).set("k", "v")
    assert meaning_of(pipeline.execute) == out_of_memory
    meaning = classify(redis.exceptions.OutOfMemoryError())
    assert meaning is not None and meaning.transient and not meaning.reconnect and not meaning.maybe_ran
    assert full_redis.get("absent") is None  # reads pass throughout


def test_a_replica_refuses_writes_as_a_failover() -> None:
    with RedisServer() as master, RedisServer() as replica:
        client = redis.Redis.from_url(replica.url)
        client.replicaof(master.host, master.port)
        failover = RedisErrorClass(RedisErrorKind.FAILOVER, "READONLY")
        assert meaning_of(lambda: client.set("k", "v")) == failover
        script = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
        assert meaning_of(lambda: script(keys=["k"], args=["v"])) == failover
        assert failover.transient and failover.reconnect  # a new connection finds the new master
        client.close()


def test_a_redis_busy_running_a_script_refuses_as_loading_and_a_killed_script_is_a_script_error() -> None:
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.config_set("busy-reply-threshold", 100)  # ms a script runs before others get BUSY
        looping = redis.Redis.from_url(server.url)
        ended: list[BaseException] = []

        def run_forever() -> None:
            try:
                looping.eval("while true do end", 0)
            except redis.RedisError as exc:
                ended.append(exc)

        thread = threading.Thread(target=run_forever, daemon=True)
        thread.start()

        def busy() -> redis.RedisError | None:
            try:
                admin.ping()
            except redis.RedisError as exc:
                return exc
            return None

        refusal = wait_for(busy, "Redis to answer BUSY while the script runs", timeout_s=20)
        assert classify(refusal) == RedisErrorClass(RedisErrorKind.LOADING, "BUSY")
        admin.script_kill()
        thread.join(timeout=20)
        assert ended, "the script was killed"
        killed = classify(ended[0])
        assert killed is not None and killed.kind is RedisErrorKind.SCRIPT_ERROR and killed.bug
        admin.ping()
        admin.close()
        looping.close()


def test_a_wrong_command_on_a_real_redis_is_a_bug() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.rpush("list", "a")
        meaning = meaning_of(lambda: client.get("list"))
        assert meaning == RedisErrorClass(RedisErrorKind.WRONG_COMMAND, "WRONGTYPE") and meaning.bug
        assert meaning_of(lambda: client.evalsha("0" * 40, 0)).kind is RedisErrorKind.NO_SCRIPT
        client.close()
