"""The clients' one retry policy, in the runners (`store.runner.Patience`): which failures are ridden out,
capped backoff within the caller's time, a follower of events resuming after the last event it yielded, and
the one line a person sees when Redis stayed away (its URL, password hidden)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from orchestrator.commands.turns_api import build_redis_failure
from orchestrator.errors import RedisUnavailableError
from orchestrator.model import TurnRequest
from orchestrator.store import flows, operations
from orchestrator.store.connection import build_shown_url
from orchestrator.store.runner import AsyncRunner, Patience, SyncRunner, check_layout, is_transient
from orchestrator.store.scripts import SubmitResult
from tests.support.fake_time import SleepingClock
from workers import keys
from workers.errors import RedisConfigError
from workers.redis_retry import BACKOFF_MAX_S, BACKOFF_MIN_S

pytestmark = pytest.mark.timeout(10)

URL = "redis://:s3cret@db.example:6379/0"
SHOWN = "redis://:**@db.example:6379/0"
EVENTS = [("1-0", "turn_queued"), ("2-0", "tool_started"), ("3-0", "tool_finished"), ("4-0", "turn_finished")]


def longest() -> float:
    """The jitter's draw that gives the longest pause: the capped doubling without jitter."""
    return 0.0


def _order(entry_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in entry_id.split("-"))


class FlakyRedis:
    """A turn's status and events stream, two events a read; the calls numbered in `failures` raise."""

    def __init__(self, failures: dict[int, Exception] | None = None) -> None:
        self.failures = failures or {}
        self.calls: list[tuple[Any, ...]] = []

    def answer(self, words: tuple[Any, ...]) -> Any:
        index = len(self.calls)
        self.calls.append(words)
        if index in self.failures:
            raise self.failures[index]
        if words[0] == "GET":
            return "running"
        assert words[0] == "XREAD", words
        newer = [(i, n) for i, n in EVENTS if _order(i) > _order(str(words[-1]))][:2]
        entries = [[i, {"name": n, "at": "1", "data": "{}"}] for i, n in newer]
        return [["events", entries]] if entries else None

    def execute_command(self, *words: Any) -> Any:
        return self.answer(words)

    def reads_after(self) -> list[str]:
        return [str(words[-1]) for words in self.calls if words[0] == "XREAD"]


class FlakyAsyncRedis(FlakyRedis):
    """The same, with redis.asyncio's shape: the error or the reply comes when awaited."""

    def execute_command(self, *words: Any) -> Any:
        async def later() -> Any:
            return self.answer(words)

        return later()


def test_the_failures_ridden_out_are_redis_being_away_not_redis_refusing() -> None:
    away = [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.OutOfMemoryError("OOM command not allowed"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
        redis.exceptions.TryAgainError("TRYAGAIN"),
        redis.ResponseError("Error running script (call to f_1): @user_script:9: -OOM command not allowed"),
    ]
    refusing = [
        redis.exceptions.AuthenticationError("WRONGPASS invalid username-password pair"),
        redis.exceptions.AuthorizationError("NOPERM"),
        redis.ResponseError("ERR unknown command"),
        ValueError("a bug"),
    ]
    assert all(is_transient(exc) for exc in away)
    assert not any(is_transient(exc) for exc in refusing)


def test_patience_backs_off_capped_and_ends_at_its_deadline() -> None:
    clock = SleepingClock()
    endless = Patience.for_s(None, clock.now, longest)
    assert [endless.build_pause_s(n) for n in (1, 2)] == [BACKOFF_MIN_S, 2 * BACKOFF_MIN_S]
    assert endless.build_pause_s(50) == BACKOFF_MAX_S
    jittered = Patience.for_s(None, clock.now)
    assert all(BACKOFF_MAX_S / 2 < (jittered.build_pause_s(50) or 0) <= BACKOFF_MAX_S for _ in range(100))
    bounded = Patience.for_s(0.3, clock.now, longest)
    clock.t += 0.25
    assert bounded.build_pause_s(50) == pytest.approx(0.05)  # cut to end at the deadline, not past it
    clock.t += 0.05
    assert bounded.build_pause_s(1) is None


def test_a_sync_follower_rides_out_failures_mid_stream_and_resumes_after_its_last_event() -> None:
    clock = SleepingClock()
    # The first status read, a read of events, then the status check before the third read fail.
    fake = FlakyRedis(
        {
            0: redis.ConnectionError("Connection refused"),
            3: redis.exceptions.BusyLoadingError("LOADING"),
            5: redis.ConnectionError("Connection reset by peer"),
        }
    )
    runner = SyncRunner(fake, where=SHOWN, sleep=clock.sleep)  # type: ignore[arg-type]
    flow = flows.follow_events("t", "0", block_ms=None, cap_ms=100)
    seen = [event.id for event in runner.iter_flow(flow, Patience.for_s(None, clock.now, longest))]
    assert seen == [i for i, _ in EVENTS]  # none lost, none repeated
    assert fake.reads_after() == ["0", "0", "2-0"]  # the failed read is sent again from the same id
    assert clock.pauses == [BACKOFF_MIN_S] * 3


async def test_an_async_follower_rides_out_the_same_failures() -> None:
    clock = SleepingClock()
    fake = FlakyAsyncRedis({2: redis.TimeoutError("Timeout"), 3: redis.ConnectionError("refused")})
    runner = AsyncRunner(fake, where=SHOWN, sleep=clock.asleep)  # type: ignore[arg-type]
    flow = flows.follow_events("t", "1-0", block_ms=None, cap_ms=100)
    seen = [event.id async for event in runner.iter_flow(flow, Patience.for_s(None, clock.now, longest))]
    assert seen == ["2-0", "3-0", "4-0"]
    assert fake.reads_after() == ["1-0", "1-0", "1-0", "3-0"]
    assert clock.pauses == [BACKOFF_MIN_S, 2 * BACKOFF_MIN_S]  # the second failure in a row waits longer


def test_past_its_patience_a_call_raises_one_line_naming_the_url_without_its_password() -> None:
    clock = SleepingClock()
    fake = FlakyRedis({n: redis.ConnectionError(f"Error 111 connecting.\nrefused {n}") for n in range(100)})
    runner = SyncRunner(fake, where=SHOWN, sleep=clock.sleep)  # type: ignore[arg-type]
    with pytest.raises(RedisUnavailableError) as raised:
        runner.run(operations.get_status("t"), Patience.for_s(2.0, clock.now))
    assert clock.t == pytest.approx(102.0)  # gave up at the deadline, not a pause later
    assert isinstance(raised.value, redis.ConnectionError) and isinstance(raised.value, TimeoutError)
    message = str(raised.value)
    assert SHOWN in message and "s3cret" not in message and "\n" not in message
    assert build_redis_failure(URL, raised.value) == message
    assert (
        build_redis_failure(URL, redis.ResponseError("ERR\nboom"))
        == f"cannot reach Redis at {SHOWN}: ERR boom"
    )


@pytest.mark.parametrize(
    "error",
    [redis.exceptions.AuthenticationError("WRONGPASS"), redis.ResponseError("ERR wrong number of arguments")],
)
def test_a_refusal_raises_at_once_and_without_patience_nothing_is_retried(error: Exception) -> None:
    clock = SleepingClock()
    runner = SyncRunner(FlakyRedis({0: error}), sleep=clock.sleep)  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        runner.run(operations.get_status("t"), Patience.for_s(None, clock.now))
    away = SyncRunner(FlakyRedis({0: redis.ConnectionError("refused")}), sleep=clock.sleep)  # type: ignore[arg-type]
    with pytest.raises(redis.ConnectionError):
        away.run(operations.get_status("t"))  # the runtime's own calls: its loops do the retrying
    assert clock.pauses == []


class LostReplyRedis:
    """Runs a script, then loses its reply once (the connection dropped after Redis ran it)."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    def register_script(self, source: str) -> Callable[..., Any]:
        def call(keys: list[str], args: list[str]) -> int:
            if args[0] in self.stored:
                return SubmitResult.EXISTS.value
            self.stored.append(args[0])
            if len(self.stored) == 1:
                raise redis.ConnectionError("Connection reset by peer")
            return SubmitResult.QUEUED.value

        return call


def test_a_submit_retried_after_its_reply_was_lost_stores_the_turn_once() -> None:
    clock = SleepingClock()
    fake = LostReplyRedis()
    runner = SyncRunner(fake, sleep=clock.sleep)  # type: ignore[arg-type]
    flow = flows.submit(TurnRequest(prompt="hi"), None, 1.0)
    turn_id = runner.run_flow(flow, Patience.for_s(10.0, clock.now))
    # The id is chosen before the first try; the retry finds it stored, and submit.lua does nothing.
    assert fake.stored == [turn_id] and len(clock.pauses) == 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (URL, SHOWN),
        ("redis://user:p@ss@h:1/0", "redis://user:**@h:1/0"),
        ("redis://h:1/0?socket_timeout=5", "redis://h:1/0?socket_timeout=5"),
        ("rediss://h:1/0?password=x&ssl_cert_reqs=none", "rediss://h:1/0?password=**&ssl_cert_reqs=none"),
        (
            "sentinel://:a@h1:26379;sentinel://:b@h2:26379/0",
            "sentinel://:**@h1:26379;sentinel://:**@h2:26379/0",
        ),
    ],
)
def test_a_shown_url_hides_every_password(url: str, shown: str) -> None:
    assert build_shown_url(url) == shown


@pytest.mark.parametrize(
    "reply",
    [
        redis.exceptions.MovedError("3999 127.0.0.1:30002"),
        redis.exceptions.ClusterCrossSlotError("CROSSSLOT Keys in request don't hash to the same slot"),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    ],
    ids=["moved", "crossslot", "clusterdown"],
)
def test_a_reply_only_a_cluster_gives_is_a_setting_to_fix_on_one_redis(reply: Exception) -> None:
    with pytest.raises(RedisConfigError, match="set TOOLLOOP_REDIS_CLUSTER=true"):
        check_layout(reply, "redis://node-1:6379/0")
    keys.use_cluster_layout(True)
    try:
        check_layout(reply, "redis://node-1:6379/0")  # on a cluster: the cluster's own business
    finally:
        keys.use_cluster_layout(False)
    check_layout(redis.ConnectionError("Connection refused"), "redis://node-1:6379/0")


class WriterGoneRedis:
    """An asyncio client whose first command meets what redis-py's pipeline met while a cluster's master was
    replaced: a connection another task closed, its writer gone (redis-py's own code raises)."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute_command(self, *words: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            await redis.asyncio.connection.Connection()._send_packed_command([b"GET t\r\n"])
        return "running"


async def test_a_connection_closed_under_redis_py_is_a_lost_connection_ridden_out() -> None:
    clock = SleepingClock()
    runner = AsyncRunner(WriterGoneRedis(), where=SHOWN, sleep=clock.asleep)  # type: ignore[arg-type]
    status = await runner.run(operations.get_status("t"), Patience.for_s(2.0, clock.now))
    assert status == "running"
    with pytest.raises(redis.ConnectionError, match="the connection was lost"):
        await AsyncRunner(WriterGoneRedis()).run(operations.get_status("t"))  # type: ignore[arg-type]


async def test_any_other_attribute_error_is_a_bug_raised_as_it_is() -> None:
    class Broken:
        async def execute_command(self, *words: Any) -> Any:
            return None.writelines  # type: ignore[attr-defined]

    with pytest.raises(AttributeError):
        await AsyncRunner(Broken()).run(operations.get_status("t"))  # type: ignore[arg-type]


def test_a_redis_that_answers_but_refuses_is_said_to_refuse_not_to_be_out_of_reach() -> None:
    clock = SleepingClock()
    full = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    fake = FlakyRedis({n: full for n in range(100)})
    runner = SyncRunner(fake, where=SHOWN, sleep=clock.sleep)  # type: ignore[arg-type]
    with pytest.raises(RedisUnavailableError) as raised:
        runner.run(operations.get_status("t"), Patience.for_s(2.0, clock.now))
    assert str(raised.value).startswith(f"Redis at {SHOWN} refused the request (out of memory; tried for ")
    assert "cannot reach" not in str(raised.value)
