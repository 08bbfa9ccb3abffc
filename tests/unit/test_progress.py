"""`ctx.progress`, pure: the event fields, redaction, the fraction, the rate limit on an injected
clock and timer, and that a report never raises (`workers.progress`)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import pytest
import redis
from billiard.exceptions import SoftTimeLimitExceeded

from orchestrator.runtime.inbox import WIRE_CALL_ID_SEPARATOR, build_wire_call_id, parse_wire_call_id
from orchestrator.store import codec
from tests.support.fake_time import ManualClock
from workers import ToolContext, tool
from workers import progress as p
from workers.contract import REDACTED
from workers.scripts import ProgressResult
from workers.tools import ToolRegistry

pytestmark = pytest.mark.timeout(10)

SECRET = "sk-live-0123456789"


class Timers:
    """An injected `schedule`: records each timer; a test fires them by hand."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None], list[bool]]] = []

    def __call__(self, delay_s: float, callback: Callable[[], None]) -> Any:
        cancelled = [False]
        self.armed.append((delay_s, callback, cancelled))

        class Handle:
            def cancel(self) -> None:
                cancelled[0] = True

        return Handle()

    def fire(self) -> None:
        _delay, callback, cancelled = self.armed.pop(0)
        assert not cancelled[0]
        callback()


class Sent:
    """An injected `send`: what went out, or a failure to raise."""

    def __init__(self) -> None:
        self.fields: list[Mapping[str, str]] = []
        self.failure: BaseException | None = None
        self.result = ProgressResult.ADDED

    def __call__(self, fields: Mapping[str, str]) -> ProgressResult:
        if self.failure is not None:
            raise self.failure
        self.fields.append(fields)
        return self.result

    @property
    def messages(self) -> list[str]:
        return [json.loads(f["data"])["message"] for f in self.fields]


def _reporter(
    sent: Sent, clock: ManualClock, timers: Timers, arguments: Mapping[str, Any] | None = None, **kw: Any
) -> p.ProgressReporter:
    return p.ProgressReporter(
        sent,
        call_id="call_0",
        tool="crawl",
        arguments=arguments or {},
        clock=clock,
        wall_clock=lambda: 1700000000.5,
        schedule=timers,
        **kw,
    )


# --- the event's fields -------------------------------------------------------------------------------------


def test_fields_are_the_orchestrators() -> None:
    data = {"call_id": "c", "tool": "t", "message": 'é "x" ***', "fraction": 0.5, "token": "hide"}
    assert p.build_event_fields("tool_progress", data, 12.25) == codec.build_event_fields(
        "tool_progress", data, 12.25
    )


def test_event_carries_the_models_call_id_and_tool() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    _reporter(sent, clock, timers).report("half", 0.5)
    (fields,) = sent.fields
    assert fields["name"] == "tool_progress" and fields["at"] == repr(1700000000.5)
    assert json.loads(fields["data"]) == {
        "call_id": "call_0",
        "tool": "crawl",
        "message": "half",
        "fraction": 0.5,
    }


@pytest.mark.parametrize("call_id", ["call_0", "toolu_01/x", "a/b/c"])
def test_model_call_id_is_the_orchestrators(call_id: str) -> None:
    assert p.WIRE_CALL_ID_SEPARATOR == WIRE_CALL_ID_SEPARATOR
    wire = build_wire_call_id("turn_1", call_id)
    assert p.build_model_call_id("turn_1", wire) == parse_wire_call_id("turn_1", wire) == call_id
    assert p.build_model_call_id("turn_1", "direct-1") == "direct-1"


# --- redaction, the cap, the fraction -----------------------------------------------------------------------


def test_sensitive_argument_values_are_replaced_wherever_they_appear() -> None:
    arguments = {"url": "https://x", "api_key": SECRET, "auth": {"nested_token": "tok-abcdef", "n": [1]}}
    arguments["headers"] = {"authorization": ["Bearer zz-99887766"], "pin": "1234567"}
    secrets = p.find_secrets(arguments)
    message = f"GET https://x with {SECRET}, tok-abcdef and Bearer zz-99887766 ({SECRET}) pin 1234567"
    shown = p.build_message(message, secrets)
    assert shown == f"GET https://x with {REDACTED}, {REDACTED} and {REDACTED} ({REDACTED}) pin 1234567"


def test_short_and_absent_secrets() -> None:
    assert p.find_secrets({"url": "https://x", "password": "abc"}) is None
    assert p.find_secrets({"password": True}) is None
    secrets = p.find_secrets({"password": 12345678})
    assert p.build_message("code 12345678", secrets) == f"code {REDACTED}"


def test_longest_secret_first() -> None:
    secrets = p.find_secrets({"api_key": "abcd", "secret": "abcdefgh"})
    assert p.build_message("abcdefgh abcd", secrets) == f"{REDACTED} {REDACTED}"


def test_message_is_text_and_capped() -> None:
    assert p.build_message(42, None) == "42"
    assert p.build_message("x" * p.MESSAGE_MAX_CHARS, None) == "x" * p.MESSAGE_MAX_CHARS
    long = p.build_message("y" * 5000, None)
    assert len(long) == p.MESSAGE_MAX_CHARS and long.endswith("…")


@pytest.mark.parametrize("offset", [990, 995, 999, 1000, 1001, 1010])
def test_a_secret_cut_by_the_cap_is_never_half_shown(offset: int) -> None:
    secrets = p.find_secrets({"api_key": SECRET})
    shown = p.build_message("a" * offset + SECRET + "b" * 50, secrets)
    assert len(shown) <= p.MESSAGE_MAX_CHARS and SECRET[:4] not in shown


def test_a_message_of_secrets_shows_markers_only() -> None:
    secrets = p.find_secrets({"api_key": SECRET})
    shown = p.build_message(SECRET * 2000, secrets)
    assert len(shown) == p.MESSAGE_MAX_CHARS and set(shown[:-1]) == {"*"} and shown[-1] == "…"


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (None, None),
        (0.5, 0.5),
        (1, 1.0),
        (Fraction(1, 4), 0.25),
        (-0.2, 0.0),
        (7, 1.0),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        (10**400, None),
        ("0.5", None),
        (True, None),
        ([0.5], None),
    ],
)
def test_fraction(given: object, shown: float | None) -> None:
    assert p.build_fraction(given) == shown


# --- the rate limit -----------------------------------------------------------------------------------------


def test_first_at_once_then_the_latest_at_the_next_allowed_moment() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    reporter.report("1")
    clock.now += 0.1
    reporter.report("2")
    reporter.report("3")
    assert sent.messages == ["1"] and [round(d, 6) for d, _, _ in timers.armed] == [0.15]
    clock.now += 0.15
    timers.fire()
    assert sent.messages == ["1", "3"] and reporter.dropped == 1
    clock.now += 0.3
    reporter.report("4")  # past the interval: at once
    assert sent.messages == ["1", "3", "4"] and not timers.armed


def test_the_latest_goes_out_when_the_tool_returns() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    for index in range(1, 51):
        reporter.report(f"item {index}", index / 50)
    reporter.close()
    assert sent.messages == ["item 1", "item 50"]
    assert json.loads(sent.fields[-1]["data"])["fraction"] == 1.0
    reporter.report("after")  # a thread the tool left behind
    assert sent.messages == ["item 1", "item 50"]


def test_a_timer_that_fires_after_close_sends_nothing() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    reporter.report("1")
    reporter.report("2")
    _delay, callback, _cancelled = timers.armed.pop()
    reporter.close()
    callback()  # it fired just as the tool returned, and waited for the lock
    assert sent.messages == ["1", "2"]


def test_the_interval_grows_for_a_chatty_tool() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    for _ in range(p.INTERVAL_DOUBLING_EVERY):
        reporter.report("x")
        clock.now += p.MIN_INTERVAL_S
    assert len(sent.fields) == p.INTERVAL_DOUBLING_EVERY
    reporter.report("early")
    assert len(sent.fields) == p.INTERVAL_DOUBLING_EVERY and timers.armed[0][0] == p.MIN_INTERVAL_S


# --- never failing the tool ---------------------------------------------------------------------------------


def test_redis_down_drops_logs_once_and_holds_back(caplog: pytest.LogCaptureFixture) -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    sent.failure = redis.ConnectionError("Connection refused")
    with caplog.at_level(logging.DEBUG, logger="workers.progress"):
        reporter.report("1")
        clock.now += 1.0
        reporter.report("2")  # held back: Redis failed a moment ago
        assert timers.armed[0][0] == pytest.approx(p.SUSPEND_S - 1.0)
        clock.now += p.SUSPEND_S
        timers.fire()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0].getMessage()
    assert reporter.dropped == 2
    sent.failure = None  # Redis is back
    clock.now += p.SUSPEND_S
    reporter.report("3")
    assert sent.messages == ["3"]


def test_close_while_held_back_drops_the_latest() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    sent.failure = redis.TimeoutError("Timeout reading from socket")
    reporter.report("1")
    sent.failure = None
    reporter.report("2")
    reporter.close()  # Redis failed a moment ago: the outcome is not held up by another try
    assert sent.messages == [] and reporter.dropped == 2


@pytest.mark.parametrize(
    "failure",
    [
        redis.ResponseError("OOM command not allowed"),
        redis.ReadOnlyError("READONLY"),
        MemoryError(),
        OSError(),
    ],
)
def test_any_failure_is_dropped(failure: BaseException) -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    sent.failure = failure
    reporter = _reporter(sent, clock, timers)
    reporter.report("1")
    reporter.close()
    assert reporter.dropped == 1


def test_a_message_that_cannot_be_shown_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        def __str__(self) -> str:
            raise RuntimeError(f"leaks {SECRET}")

    sent, clock, timers = Sent(), ManualClock(), Timers()
    reporter = _reporter(sent, clock, timers)
    with caplog.at_level(logging.WARNING, logger="workers.progress"):
        reporter.report(Bad())
    assert sent.fields == [] and reporter.dropped == 1
    assert "RuntimeError" in caplog.text and SECRET not in caplog.text


def test_a_soft_time_limit_is_the_tools() -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    sent.failure = SoftTimeLimitExceeded()
    reporter = _reporter(sent, clock, timers, passthrough=(SoftTimeLimitExceeded,))
    with pytest.raises(SoftTimeLimitExceeded):
        reporter.report("1")


@pytest.mark.parametrize("result", [ProgressResult.ENDED, ProgressResult.CALL_DONE])
def test_once_the_turn_or_call_ended_nothing_more_is_sent(result: ProgressResult) -> None:
    sent, clock, timers = Sent(), ManualClock(), Timers()
    sent.result = result
    reporter = _reporter(sent, clock, timers)
    reporter.report("1")
    clock.now += 1.0
    reporter.report("2")
    reporter.close()
    assert sent.messages == ["1"]


def test_sink_timeouts_win_over_the_urls() -> None:
    sink = p.ProgressSink("redis://127.0.0.1:9/0?socket_timeout=5&socket_connect_timeout=5")
    script = sink._connect()  # no connection is opened before a command
    options = script.registered_client.connection_pool.connection_kwargs
    assert options["socket_timeout"] == options["socket_connect_timeout"] == p.SOCKET_TIMEOUT_S
    assert options["retry"].get_retries() == 0
    script.registered_client.close()


# --- outside a turn -----------------------------------------------------------------------------------------


@tool(name="progress_unit_tool", registry=ToolRegistry())
def _reporting(n: int, ctx: ToolContext) -> int:
    """Reports, with no turn around it."""
    ctx.progress("working", fraction=0.5)
    return n


def test_outside_a_turn_progress_does_nothing() -> None:
    assert _reporting.invoke({"n": 3}) == 3
    assert ToolContext(call_id="c").progress("x", 0.1) is None
    with_reporter = ToolContext(call_id="c", _progress=_reporter(Sent(), ManualClock(), Timers()))
    assert with_reporter == ToolContext(call_id="c") and "_progress" not in repr(with_reporter)
