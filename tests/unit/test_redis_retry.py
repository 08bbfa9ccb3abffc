"""The retry loop a pool child rides a Redis outage with: capped backoff, a bound, interruptions."""

from __future__ import annotations

import kombu.exceptions
import pytest
import redis

from tests.support.fake_time import SleepingClock
from workers.redis_retry import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    RedisRetry,
    build_backoff_s,
    find_redis_error,
    is_unavailable,
)

pytestmark = pytest.mark.timeout(10)


class Interrupted(Exception):
    """Stands for Celery's SoftTimeLimitExceeded."""


def longest() -> float:
    """The jitter's draw that gives the longest pause: the capped doubling without jitter."""
    return 0.0


def test_backoff_doubles_and_is_capped() -> None:
    assert build_backoff_s(1, longest) == BACKOFF_MIN_S
    assert build_backoff_s(2, longest) == 2 * BACKOFF_MIN_S
    assert build_backoff_s(50, longest) == BACKOFF_MAX_S
    steps = [build_backoff_s(n, longest) for n in range(1, 20)]
    assert steps == sorted(steps)
    assert all(step / 2 < build_backoff_s(n) <= step for n, step in enumerate(steps, 1))


def test_retries_until_redis_answers_and_tells_the_step_how_often_it_failed() -> None:
    clock = SleepingClock(1000.0)
    seen: list[int] = []

    def step(failures: int) -> str:
        seen.append(failures)
        if failures < 4:
            raise redis.exceptions.ConnectionError("Connection refused")
        return "written"

    retry = RedisRetry(clock.now() + 60, clock.now, clock.sleep, rand=longest)
    assert retry.call(step, "a test") == "written"
    assert seen == [0, 1, 2, 3, 4]
    assert clock.pauses == [build_backoff_s(n, longest) for n in range(1, 5)]


def test_gives_up_with_the_last_error_before_passing_the_bound() -> None:
    clock = SleepingClock(1000.0)
    start = clock.now()

    def step(_failures: int) -> None:
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    retry = RedisRetry(start + 5.0, clock.now, clock.sleep)
    with pytest.raises(redis.exceptions.TimeoutError):
        retry.call(step, "a test")
    assert clock.now() <= start + 5.0
    assert clock.now() + BACKOFF_MAX_S > start + 5.0  # it waited as long as the bound allowed


def test_a_redis_still_loading_is_waited_for() -> None:
    clock = SleepingClock(1000.0)
    answers = iter([redis.exceptions.BusyLoadingError("LOADING"), "ok"])

    def step(_failures: int) -> object:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test") == "ok"


def test_a_command_error_is_raised_at_once() -> None:
    clock = SleepingClock(1000.0)
    calls: list[int] = []

    def step(failures: int) -> None:
        calls.append(failures)
        raise redis.exceptions.ResponseError("WRONGTYPE")

    with pytest.raises(redis.exceptions.ResponseError):
        RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test")
    assert calls == [0]


def test_interruptions_in_a_try_or_a_pause_are_ridden_out() -> None:
    clock = SleepingClock(1000.0)
    interrupted_pause = [True]

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if interrupted_pause[0]:
            interrupted_pause[0] = False
            raise Interrupted

    def step(failures: int) -> str:
        if failures == 0:
            raise redis.exceptions.ConnectionError("down")
        if failures == 1:
            raise Interrupted
        return "written"

    retry = RedisRetry(clock.now() + 10, clock.now, sleep, interruptions=(Interrupted,))
    assert retry.call(step, "a test") == "written"
    with pytest.raises(Interrupted):  # without it among `interruptions`, it is not swallowed
        RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test")


SCRIPT_OOM = (
    "Error running script (call to f_4de8ee855b77bb03f67fb740939aa8a297b12ed6): @user_script:18: "
    "@user_script: 18: -OOM command not allowed when used memory > 'maxmemory'."
)


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.MasterDownError(
            "Link with MASTER is down and replica-serve-stale-data is set to 'no'."
        ),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.ResponseError(
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable"
        ),
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
        redis.exceptions.ResponseError(SCRIPT_OOM),
        redis.exceptions.ResponseError("Command # 1 (EVALSHA …) of pipeline caused error: " + SCRIPT_OOM),
    ],
    ids=lambda error: type(error).__name__ + ":" + str(error)[:12],
)
def test_redis_refusing_for_now_is_unavailable_and_retried(error: redis.RedisError) -> None:
    assert is_unavailable(error)
    clock = SleepingClock(1000.0)

    def step(failures: int) -> str:
        if failures < 2:
            raise error
        return "written"

    assert RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test") == "written"


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.exceptions.ResponseError("ERR unknown command 'SETT'"),
        redis.exceptions.ResponseError("BUSYGROUP Consumer Group name already exists"),
        redis.exceptions.NoScriptError("NOSCRIPT No matching script."),
        redis.exceptions.DataError("Invalid input of type: 'NoneType'"),
    ],
    ids=lambda error: str(error)[:12],
)
def test_a_wrong_command_is_not_unavailable(error: redis.RedisError) -> None:
    assert not is_unavailable(error)


def test_a_retry_kombu_could_not_publish_is_found_behind_its_wrapper() -> None:
    # kombu raises a failed publish as its own OperationalError: the OOM behind it must still read as "Redis
    # refuses for now" (publish the retry again), or Celery would drop the call unrequeued.
    oom = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    try:
        try:
            raise oom
        except redis.RedisError as exc:
            raise kombu.exceptions.OperationalError(str(exc)) from exc
    except kombu.exceptions.OperationalError as wrapped:
        assert find_redis_error(wrapped) is oom
    assert find_redis_error(ValueError("no redis here")) is None
    assert find_redis_error(None) is None
