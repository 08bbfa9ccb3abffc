"""The fleet's model rate limits, pure: each provider's rate-limit headers read into one neutral signal
(every format they come in), the pause a signal asks for, the budgets a call draws from, what a call leaves
behind."""

from __future__ import annotations

import datetime

import pytest
from pydantic import ValidationError

from orchestrator.model_limits import (
    MAX_PAUSE_S,
    REFUSED_PAUSE_S,
    Budget,
    Granted,
    ModelLimit,
    Settlement,
    build_budgets,
    build_pause_s,
    build_reserved_tokens,
    build_settlement,
    spread_pause_wait_s,
)
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.rate_limits import RateLimitSignal, parse_duration_s, parse_reset_at_s
from orchestrator.settings import Settings

pytestmark = pytest.mark.timeout(30)

NOW = 1_750_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1.5s", 1.5),
        ("17.28s", 17.28),
        ("2m59.56s", 179.56),
        ("1h2m3s", 3723.0),
        ("0s", 0.0),
        ("3", 3.0),
        (" 1m ", 60.0),
        ("", None),
        (None, None),
        ("soon", None),
        ("5x", None),
        ("1s2", None),
    ],
)
def test_openai_durations(text: str | None, seconds: float | None) -> None:
    assert (
        parse_duration_s(text) == pytest.approx(seconds)
        if seconds is not None
        else parse_duration_s(text) is None
    )


def test_rfc3339_resets_read_against_now() -> None:
    at = datetime.datetime.fromtimestamp(NOW + 30, datetime.UTC)
    assert parse_reset_at_s(at.strftime("%Y-%m-%dT%H:%M:%SZ"), NOW) == pytest.approx(30.0)
    assert parse_reset_at_s(at.isoformat(), NOW) == pytest.approx(30.0)
    assert parse_reset_at_s("2000-01-01T00:00:00Z", NOW) == 0.0
    assert parse_reset_at_s("tomorrow", NOW) is None
    assert parse_reset_at_s(None, NOW) is None


def test_openai_headers() -> None:
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6ms",
    }
    assert openai_chat.parse_rate_limits(200, headers, NOW) == RateLimitSignal(
        requests_remaining=0, requests_reset_s=360.0, tokens_remaining=149984, tokens_reset_s=0.006
    )
    refused = openai_chat.parse_rate_limits(429, {**headers, "retry-after": "2"}, NOW)
    assert refused.refused and refused.retry_after_s == 2.0
    millis = openai_responses.parse_rate_limits(429, {"retry-after-ms": "1500"}, NOW)
    assert millis.retry_after_s == 1.5 and millis.requests_remaining is None


def test_openai_headers_read_whatever_their_case() -> None:
    import httpx

    headers = httpx.Headers({"X-RateLimit-Remaining-Requests": "3", "Retry-After": "1"})
    signal = openai_chat.parse_rate_limits(200, headers, NOW)
    assert (signal.requests_remaining, signal.retry_after_s) == (3, 1.0)


def test_no_headers_say_nothing() -> None:
    assert openai_chat.parse_rate_limits(200, {}, NOW) == RateLimitSignal()
    assert anthropic.parse_rate_limits(200, {}, NOW) == RateLimitSignal()
    assert anthropic.parse_rate_limits(429, {}, NOW) == RateLimitSignal(refused=True)


def test_anthropic_headers_the_tightest_tokens_limit_stands() -> None:
    def at(seconds: float) -> str:
        return datetime.datetime.fromtimestamp(NOW + seconds, datetime.UTC).isoformat().replace("+00:00", "Z")

    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": at(1),
        "anthropic-ratelimit-tokens-remaining": "30000",
        "anthropic-ratelimit-tokens-reset": at(10),
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": at(20),
        "anthropic-ratelimit-output-tokens-remaining": "800",
        "anthropic-ratelimit-output-tokens-reset": at(5),
        "retry-after": "20",
    }
    signal = anthropic.parse_rate_limits(429, headers, NOW)
    assert signal.refused and signal.retry_after_s == 20.0
    assert (signal.requests_remaining, signal.requests_reset_s) == (49, pytest.approx(1.0))
    assert (signal.tokens_remaining, signal.tokens_reset_s) == (0, pytest.approx(20.0))
    assert not anthropic.parse_rate_limits(529, headers, NOW).refused


@pytest.mark.parametrize(
    ("signal", "pause_s"),
    [
        (RateLimitSignal(requests_remaining=5, requests_reset_s=3.0), 0.0),
        (RateLimitSignal(requests_remaining=0, requests_reset_s=3.0), 3.0),
        (
            RateLimitSignal(tokens_remaining=0, tokens_reset_s=7.0, requests_remaining=0, requests_reset_s=3),
            7.0,
        ),
        (RateLimitSignal(refused=True, retry_after_s=2.0, requests_remaining=0, requests_reset_s=0.5), 2.0),
        (RateLimitSignal(refused=True, requests_remaining=0, requests_reset_s=4.0), 4.0),
        (RateLimitSignal(refused=True, requests_remaining=3, requests_reset_s=4.0, tokens_reset_s=1.0), 1.0),
        (RateLimitSignal(refused=True), REFUSED_PAUSE_S),
        (RateLimitSignal(refused=True, retry_after_s=86400.0), MAX_PAUSE_S),
        (RateLimitSignal(retry_after_s=9.0), 0.0),
    ],
)
def test_the_pause_a_signal_asks_for(signal: RateLimitSignal, pause_s: float) -> None:
    assert build_pause_s(signal) == pause_s


def test_budgets_a_call_draws_from_its_model_and_its_provider() -> None:
    limits = {
        "openai:gpt-4.1": ModelLimit(requests_per_minute=500, tokens_per_minute=30000),
        "openai": ModelLimit(requests_per_minute=240, window_s=5),
        "anthropic:claude": ModelLimit(requests_per_minute=0.5, window_s=1),
    }
    assert build_budgets("openai:gpt-4.1", limits) == (
        Budget("openai:gpt-4.1", 60.0, 500, 30000),
        Budget("openai", 5.0, 20, None),
    )
    assert build_budgets("openai:o3", limits) == (Budget("openai", 5.0, 20, None),)
    assert build_budgets("anthropic:claude", limits) == (Budget("anthropic:claude", 1.0, 1, None),)
    assert build_budgets("scripted:plan", limits) == ()


def test_the_setting_is_json_and_refuses_what_limits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLLOOP_MODEL_LIMITS", '{"openai:gpt-4.1": {"requests_per_minute": 60}}')
    assert Settings().model_limits == {"openai:gpt-4.1": ModelLimit(requests_per_minute=60)}
    monkeypatch.setenv("TOOLLOOP_MODEL_LIMITS", '{"openai": {}}')
    with pytest.raises(ValidationError, match="requests_per_minute, tokens_per_minute or both"):
        Settings()
    monkeypatch.setenv("TOOLLOOP_MODEL_LIMITS", '{"openai": {"requests_per_min": 60}}')
    with pytest.raises(ValidationError):
        Settings()


def test_a_call_reserves_its_estimate_and_its_answer() -> None:
    assert build_reserved_tokens(100, 50) == 150
    assert build_reserved_tokens(100, None) == 1124


GRANTED = Granted("openai:m", "t:0", (Budget("openai:m", 60.0, 10, 1000),), tokens=300)


def test_what_a_call_leaves_behind() -> None:
    refused = RateLimitSignal(refused=True, retry_after_s=2.0)
    assert build_settlement(GRANTED, None, None, [refused]) == Settlement(refund=True, pause_s=2.0)
    assert build_settlement(GRANTED, 0.5, 120, []) == Settlement(answered_ago_s=0.5, used_tokens=120)
    assert build_settlement(GRANTED, 0.5, 300, []) == Settlement(answered_ago_s=0.5)
    no_tokens = Granted("openai:m", "t:0", (Budget("openai:m", 60.0, 10, None),))
    assert build_settlement(no_tokens, 0.1, 120, []) == Settlement(answered_ago_s=0.1)
    unmetered = Granted("openai:m", "t:0")
    assert build_settlement(unmetered, 0.1, 120, []) is None
    empty = RateLimitSignal(requests_remaining=0, requests_reset_s=3.0)
    assert build_settlement(unmetered, 0.1, 120, [empty]) == Settlement(pause_s=3.0)


def test_calls_a_pause_held_go_back_spread() -> None:
    assert spread_pause_wait_s(10.0, 0.0) == 10.0
    assert spread_pause_wait_s(10.0, 0.5) == 10.5
    assert spread_pause_wait_s(0.2, 0.5) == pytest.approx(0.3)
