"""`RedisOutage`: an outage is told once at once, again every `report_s` while it lasts, and when it ends —
however many loops report the failures — with the URL's password hidden."""

from __future__ import annotations

import logging

import pytest

from orchestrator.runtime.process import RedisOutage
from tests.support.fake_time import ManualClock

URL = "redis://:hunter2@redis:6379/0"


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "toolloop.orchestrator"]


def test_an_outage_is_told_once_then_every_report_period_then_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    outage = RedisOutage(URL, report_s=10, clock=clock)
    # Four loops fail every half second for 25 s.
    for _ in range(50):
        for _loop in range(4):
            outage.failed(ConnectionError("Connection refused"))
        clock.now += 0.5
    assert outage.ongoing
    outage.succeeded()
    outage.succeeded()
    lines = told(caplog)
    assert lines == [
        "Redis at redis://:**@redis:6379/0 is unreachable (Connection refused); retrying until it is back",
        "Redis at redis://:**@redis:6379/0 still unreachable after 10 s (Connection refused); retrying",
        "Redis at redis://:**@redis:6379/0 still unreachable after 20 s (Connection refused); retrying",
        "Redis at redis://:**@redis:6379/0 is back after 25.0 s",
    ]
    assert not outage.ongoing
    assert all("hunter2" not in line for line in lines)


def test_success_without_an_outage_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = RedisOutage(URL, clock=ManualClock())
    outage.succeeded()
    assert told(caplog) == []


def test_a_second_outage_is_told_afresh(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    outage = RedisOutage(URL, report_s=10, clock=clock)
    outage.failed(TimeoutError("timed out"))
    clock.now += 1
    outage.succeeded()
    clock.now += 1
    outage.failed(TimeoutError("timed out"))
    assert [line.split(" (")[0] for line in told(caplog)] == [
        "Redis at redis://:**@redis:6379/0 is unreachable",
        "Redis at redis://:**@redis:6379/0 is back after 1.0 s",
        "Redis at redis://:**@redis:6379/0 is unreachable",
    ]
