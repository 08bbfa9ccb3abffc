"""`orchestrator.outage`: what kind of outage a Redis error is, how it is told and counted, and the retry that
rides it out (issue 12: OOM and read-only replicas included, never fatal)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.exceptions as rx
from prometheus_client import REGISTRY

from orchestrator.outage import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    Backoff,
    RedisOutage,
    RedisRetry,
    build_backoff_s,
    build_outage_kind,
    is_redis_failure,
)
from tests.support.fake_time import ManualClock
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.timeout(10)

URL = "redis://:hunter2@redis:6379/0"
SCRIPT_OOM = (
    "Error running script (call to f_c5fb): @user_script:12: @user_script: 12: -OOM command not allowed when "
    "used memory > 'maxmemory'."
)
PIPELINE_OOM = (
    "Command # 1 (ZREM o x) of pipeline caused error: command not allowed when used memory > 'maxmemory'."
)
SCRIPT_READONLY = (
    "Error running script (call to f_1): @user_script:3: -READONLY You can't write against a replica."
)


def longest() -> float:
    """The jitter's draw that gives the longest pause: the capped doubling without jitter."""
    return 0.0


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "toolloop.orchestrator"]


def wrapped(cause: Exception) -> Exception:
    """An error kombu raises from a Redis one (its publish batch does so)."""
    try:
        raise RuntimeError("Redis publish batch failed; delivery is uncertain") from cause
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "out of memory"),
        (rx.ResponseError(SCRIPT_OOM), "out of memory"),
        (rx.ResponseError(PIPELINE_OOM), "out of memory"),
        (wrapped(rx.OutOfMemoryError(PIPELINE_OOM)), "out of memory"),
        (rx.ReadOnlyError("You can't write against a read only replica."), "failover"),
        (rx.ResponseError(SCRIPT_READONLY), "failover"),
        (rx.ConnectionError("Connection refused"), "unreachable"),
        (rx.TimeoutError("Timeout reading from socket"), "unreachable"),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (ConnectionResetError("reset by peer"), "unreachable"),
        (
            rx.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it cannot"),
            "cannot persist",
        ),
        (rx.ResponseError("MASTERDOWN Link with MASTER is down"), "failover"),
        (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), "unexpected"),
    ],
)
def test_each_redis_error_has_its_kind(error: Exception, kind: str) -> None:
    assert build_outage_kind(error) == kind
    assert is_redis_failure(error)


def test_other_errors_are_not_redis_failures() -> None:
    assert not is_redis_failure(ValueError("bad message"))
    assert not is_redis_failure(wrapped(ValueError("bad message")))


def test_backoff_doubles_from_a_tenth_of_a_second_to_two() -> None:
    assert [build_backoff_s(n, rand=longest) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert build_backoff_s(1, rand=longest) == BACKOFF_MIN_S
    assert build_backoff_s(100, rand=longest) == BACKOFF_MAX_S


def test_redis_out_of_memory_is_told_as_such_and_over_once_writes_pass_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    outage = RedisOutage(URL, report_s=10, settle_s=5, clock=clock)
    for _ in range(30):  # 15 s of refusals; reads pass meanwhile, which proves nothing about writes
        outage.failed(rx.ResponseError(SCRIPT_OOM), "steps")
        outage.succeeded()
        clock.now += 0.5
    clock.now += 4
    outage.succeeded()  # 4.5 s without a refusal: not yet
    assert outage.ongoing
    clock.now += 1
    outage.succeeded()
    assert not outage.ongoing
    lines = [line.split(" (")[0] for line in told(caplog)]
    assert lines == [
        "Redis at redis://:**@redis:6379/0 refuses writes: out of memory",
        "Redis at redis://:**@redis:6379/0 still refuses writes after 10 s: out of memory",
        "Redis at redis://:**@redis:6379/0 is back after 20.0 s",
    ]
    assert told(caplog)[0].endswith("); retrying until it accepts them")


def test_a_change_of_kind_is_told(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = RedisOutage(URL, clock=ManualClock())
    outage.failed(rx.ConnectionError("Connection refused"), "inbox")
    outage.failed(rx.ReadOnlyError("You can't write against a read only replica."), "steps")
    outage.failed(rx.ReadOnlyError("You can't write against a read only replica."), "steps")
    assert [line.split(" (")[0] for line in told(caplog)] == [
        "Redis at redis://:**@redis:6379/0 is unreachable",
        "Redis at redis://:**@redis:6379/0 refuses writes: read-only replica or failover",
    ]


def test_an_unexpected_error_is_logged_with_its_traceback_once_per_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = RedisOutage(URL, clock=ManualClock())
    for _ in range(3):
        outage.failed(rx.ResponseError("WRONGTYPE Operation against a key"), "steps")
    outage.failed(rx.ResponseError("ERR unknown command 'FOO'"), "inbox")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.exc_info is not None for r in errors] == [True, True]
    assert "steps" in errors[0].getMessage() and "inbox" in errors[1].getMessage()


def test_every_failure_is_counted_by_loop_and_exception_class() -> None:
    labels = {"loop": "test-loop", "kind": "OutOfMemoryError"}
    before = REGISTRY.get_sample_value("toolloop_redis_errors_total", labels) or 0.0
    outage = RedisOutage(URL, clock=ManualClock())
    outage.failed(rx.OutOfMemoryError("command not allowed"), "test-loop")
    outage.failed(wrapped(rx.OutOfMemoryError("command not allowed")), "test-loop")
    assert REGISTRY.get_sample_value("toolloop_redis_errors_total", labels) == before + 2


async def test_a_retried_call_goes_on_until_it_succeeds() -> None:
    retry = RedisRetry(RedisOutage(URL))
    errors = [rx.OutOfMemoryError("full"), rx.ReadOnlyError("replica"), rx.ConnectionError("refused")]

    async def write() -> str:
        if errors:
            raise errors.pop(0)
        return "written"

    assert await retry.call("steps", write) == "written"
    assert not errors


async def test_a_retried_call_gives_up_once_the_process_stops() -> None:
    retry = RedisRetry(RedisOutage(URL))
    tries = 0

    async def write() -> None:
        nonlocal tries
        tries += 1
        raise rx.OutOfMemoryError("full")

    task = asyncio.create_task(retry.call("steps", write))
    await async_wait_until(lambda: tries >= 3, "three tries")
    assert not task.done()
    tries_before_stop = tries
    retry.stopping.set()
    with pytest.raises(rx.OutOfMemoryError):
        await task
    # The pause ended with the stop, and the next failure was raised instead of retried.
    assert tries == tries_before_stop + 1


def test_a_loop_backoff_starts_again_after_a_success() -> None:
    backoff = Backoff(RedisRetry(RedisOutage(URL, clock=ManualClock())), "claim", rand=longest)
    assert [backoff.failed(rx.ConnectionError("x")) for _ in range(3)] == [0.1, 0.2, 0.4]
    backoff.succeeded()
    assert backoff.failed(rx.ConnectionError("x")) == 0.1


def test_a_sentinel_url_is_shown_with_every_password_hidden() -> None:
    outage = RedisOutage("sentinel://:hunter2@h1:26379;sentinel://:hunter2@h2:26379/0")
    assert outage.url == "sentinel://:**@h1:26379/;sentinel://:**@h2:26379/0"
