"""The retry loop a pool child rides a Redis outage with: capped backoff, a bound, interruptions."""

from __future__ import annotations

import pytest
import redis

from workers.redis_retry import BACKOFF_MAX_S, BACKOFF_MIN_S, RedisRetry, build_backoff_s

pytestmark = pytest.mark.timeout(10)


class Clock:
    """A clock that moves only when the retry loop sleeps."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.pauses: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.t += seconds


class Interrupted(Exception):
    """Stands for Celery's SoftTimeLimitExceeded."""


def test_backoff_doubles_and_is_capped() -> None:
    assert build_backoff_s(1) == BACKOFF_MIN_S
    assert build_backoff_s(2) == 2 * BACKOFF_MIN_S
    assert build_backoff_s(50) == BACKOFF_MAX_S
    assert [build_backoff_s(n) for n in range(1, 20)] == sorted(build_backoff_s(n) for n in range(1, 20))


def test_retries_until_redis_answers_and_tells_the_step_how_often_it_failed() -> None:
    clock = Clock()
    seen: list[int] = []

    def step(failures: int) -> str:
        seen.append(failures)
        if failures < 4:
            raise redis.exceptions.ConnectionError("Connection refused")
        return "written"

    retry = RedisRetry(clock.now() + 60, clock.now, clock.sleep)
    assert retry.call(step, "a test") == "written"
    assert seen == [0, 1, 2, 3, 4]
    assert clock.pauses == [build_backoff_s(n) for n in range(1, 5)]


def test_gives_up_with_the_last_error_before_passing_the_bound() -> None:
    clock = Clock()
    start = clock.now()

    def step(_failures: int) -> None:
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    retry = RedisRetry(start + 5.0, clock.now, clock.sleep)
    with pytest.raises(redis.exceptions.TimeoutError):
        retry.call(step, "a test")
    assert clock.now() <= start + 5.0
    assert clock.now() + BACKOFF_MAX_S > start + 5.0  # it waited as long as the bound allowed


def test_a_redis_still_loading_is_waited_for() -> None:
    clock = Clock()
    answers = iter([redis.exceptions.BusyLoadingError("LOADING"), "ok"])

    def step(_failures: int) -> object:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test") == "ok"


def test_a_command_error_is_raised_at_once() -> None:
    clock = Clock()
    calls: list[int] = []

    def step(failures: int) -> None:
        calls.append(failures)
        raise redis.exceptions.ResponseError("WRONGTYPE")

    with pytest.raises(redis.exceptions.ResponseError):
        RedisRetry(clock.now() + 10, clock.now, clock.sleep).call(step, "a test")
    assert calls == [0]


def test_interruptions_in_a_try_or_a_pause_are_ridden_out() -> None:
    clock = Clock()
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
