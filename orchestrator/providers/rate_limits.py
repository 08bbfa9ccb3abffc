"""What a provider's answer says of its rate limits, as one neutral value (pure).

Each provider profile reads its own headers (`openai_chat.parse_rate_limits`,
`anthropic.parse_rate_limits`) into a `RateLimitSignal`; nothing outside `providers/` knows a header's name.
The runtime turns a signal into a pause of the model for the whole fleet (`orchestrator.model_limits`).
The readers of the formats the profiles share live here: a duration as OpenAI writes a reset ("6m0s",
"1s", "20ms", "1.5s"), a reset as a time (RFC 3339, Anthropic's), Retry-After in seconds.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.providers.common import parse_retry_after

__all__ = [
    "RateLimitSignal",
    "RateLimitSink",
    "parse_duration_s",
    "parse_reset_at_s",
    "parse_retry_after",
    "parse_whole",
    "read_header",
]


@dataclass(frozen=True)
class RateLimitSignal:
    """The rate-limit state one answer stated: what is left of the requests and the tokens of the current
    period and in how many seconds each is whole again, a wait the provider asked for, and whether the
    answer was a refusal for the limit (HTTP 429). None: the answer did not say."""

    refused: bool = False
    retry_after_s: float | None = None
    requests_remaining: int | None = None
    requests_reset_s: float | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float | None = None


RateLimitSink = Callable[[RateLimitSignal], None]
"""Where a model client sends the signal of each HTTP answer a call got."""

# "6m0s", "1s", "20ms", "1h2m3.5s", "0.5s": numbers each followed by a unit, largest first.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration_s(value: str | None) -> float | None:
    """Seconds of a duration as OpenAI writes a reset (`6m0s`, `1s`, `20ms`, `1h2m3.5s`), or a bare number
    of seconds; None when absent or not one of these."""
    if value is None or not (text := value.strip().lower()):
        return None
    bare = parse_retry_after(text)
    if bare is not None:
        return bare
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def parse_reset_at_s(value: str | None, now: float) -> float | None:
    """Seconds from `now` (epoch) until an RFC 3339 time (`2025-01-01T00:00:30Z`), at least 0; None when
    absent or not such a time."""
    if value is None or not value.strip():
        return None
    try:
        at = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return max(at.timestamp() - now, 0.0)


def parse_whole(value: str | None) -> int | None:
    """A count header (`remaining`): a whole number, at least 0; None when absent or not a number."""
    if value is None:
        return None
    try:
        return max(int(float(value.strip())), 0)
    except ValueError:
        return None


def read_header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by its lower-case name, from httpx's headers (case-blind) or a plain dict."""
    value = headers.get(name)
    return value if value is not None else headers.get(name.title())
