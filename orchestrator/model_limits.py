"""Model rate limits shared by the fleet: what a call draws from, and when the provider pauses a model (pure).

TOOLLOOP_MODEL_LIMITS gives each `provider:model`, or a `provider` for all its models together, a
`ModelLimit`: requests and tokens per minute, counted over a sliding window of `window_s` seconds (60 by
default; a shorter one spreads the budget evenly, as providers that enforce a per-minute limit over shorter
periods ask). A model call draws from every entry that names it — its model's and its provider's — and waits
until all have room (`build_budgets`). The budgets live in Redis, one sliding window per entry shared by
every orchestrator (`orchestrator.store.rate_limits`); a call reserves its estimated tokens
(`build_reserved_tokens`) and is corrected to what it used, or refunded when it failed
(`build_settlement`). A call is counted from when the provider's answer began, not from when it was let
go: the provider counted it somewhere between the two, and a window that let the next call go one window
after the earlier moment would, under load (requests queued in a busy event loop, on the network), send it
before the provider's own window had let the first one go.

A provider's own signals tighten it, with or without the setting: a 429, or an answer saying that nothing is
left until a reset (`providers.rate_limits.RateLimitSignal`, read by each provider's profile), pauses that
model for the whole fleet until the reset (`build_pause_s`). A call held by either waits as a timer of its
turn (`machine.model_calls.on_model_throttled`): `Throttled.limit` names what held it.

Design notes: docs/design/model-calls.md, "Rate limits shared by the fleet".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.providers.rate_limits import RateLimitSignal

LimitName = Literal["requests_per_minute", "tokens_per_minute", "provider", "tenant_tokens_per_minute"]
"""What held a call: its requests budget, its tokens budget, a pause its provider asked for, or its tenant's
tokens budget (`orchestrator.tenant_limits`)."""

# A 429 that names no wait at all pauses the model this long.
REFUSED_PAUSE_S = 1.0
# No pause lasts longer, whatever a header says: a bad header must not stop a model for hours.
MAX_PAUSE_S = 300.0
# The calls a pause held go back spread over this long after it (or over the pause, when shorter): all at
# once, they would meet the provider's limit again together.
PAUSE_SPREAD_S = 1.0
# A call that asks no longer answer is reserved this many output tokens (corrected after the answer).
DEFAULT_OUTPUT_TOKENS = 1024


class ModelLimit(BaseModel):
    """One entry of TOOLLOOP_MODEL_LIMITS: at most `requests_per_minute` calls and `tokens_per_minute` tokens
    (input and output) a minute, counted over a sliding window of `window_s` seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    window_s: float = Field(default=60.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _limits_something(self) -> ModelLimit:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("a model limit needs requests_per_minute, tokens_per_minute or both")
        return self


@dataclass(frozen=True)
class Budget:
    """One window a call draws from: the entry's name (`provider:model` or `provider`; `tenant:<name>` for a
    tenant's, `tenant` True), its length, and what it holds (None: not limited that way)."""

    key: str
    window_s: float
    requests: int | None
    tokens: int | None
    tenant: bool = False


@dataclass(frozen=True)
class Granted:
    """The call may go: `reservation` names what it took from `budgets` (`tokens` of them)."""

    model: str
    reservation: str
    budgets: tuple[Budget, ...] = ()
    tokens: int = 0


@dataclass(frozen=True)
class Throttled:
    """The call must wait `wait_s` seconds before asking again, held by `limit`."""

    limit: LimitName
    wait_s: float


Admission = Granted | Throttled


@dataclass(frozen=True)
class Settlement:
    """What a granted call leaves in Redis after its answer: its reservation refunded whole (`refund`), or
    counted from when the answer began, `answered_ago_s` before now, with its tokens corrected to
    `used_tokens` (None: as reserved); and a pause of the model for the fleet (`pause_s`, 0: none)."""

    refund: bool = False
    answered_ago_s: float | None = None
    used_tokens: int | None = None
    pause_s: float = 0.0


def build_budgets(model: str, limits: Mapping[str, ModelLimit]) -> tuple[Budget, ...]:
    """The budgets a call of `model` (`provider:model`) draws from: its own entry and its provider's."""
    provider = model.partition(":")[0]
    budgets = []
    for key in dict.fromkeys((model, provider)):
        limit = limits.get(key)
        if limit is None:
            continue
        scale = limit.window_s / 60.0
        requests, tokens = (
            None if per_minute is None else _at_least_one(per_minute * scale)
            for per_minute in (limit.requests_per_minute, limit.tokens_per_minute)
        )
        budgets.append(Budget(key, limit.window_s, requests, tokens))
    return tuple(budgets)


def _at_least_one(amount: float) -> int:
    # A window too short to hold one whole call would hold none: it holds one.
    return max(1, math.floor(amount + 1e-9))


def build_reserved_tokens(estimated_tokens: int, max_output_tokens: int | None) -> int:
    """What a call reserves of a tokens budget: its request's estimate and the answer it may get, as
    providers count a call against the limit before it runs."""
    output = max_output_tokens if max_output_tokens is not None else DEFAULT_OUTPUT_TOKENS
    return max(estimated_tokens, 0) + output


def build_pause_s(signal: RateLimitSignal) -> float:
    """How long the provider's answer says its model must rest, for every orchestrator (0: not at all).

    Until the reset of whatever it says is used up (remaining 0), 429 or not; a 429 also at least as long as
    its Retry-After, and when it names neither, as long as the nearest reset it gives (else
    `REFUSED_PAUSE_S`). Never longer than `MAX_PAUSE_S`.
    """
    waits = [
        reset
        for remaining, reset in (
            (signal.requests_remaining, signal.requests_reset_s),
            (signal.tokens_remaining, signal.tokens_reset_s),
        )
        if remaining == 0 and reset is not None
    ]
    if signal.refused:
        if signal.retry_after_s is not None:
            waits.append(signal.retry_after_s)
        elif not waits:
            resets = [r for r in (signal.requests_reset_s, signal.tokens_reset_s) if r is not None and r > 0]
            waits.append(min(resets, default=REFUSED_PAUSE_S))
    return min(max(waits, default=0.0), MAX_PAUSE_S)


def spread_pause_wait_s(wait_s: float, draw: float) -> float:
    """The wait of a call a pause holds, `wait_s` left of it: spread by `draw` (uniform in [0, 1)) over
    `PAUSE_SPREAD_S`, or over the pause when it is shorter."""
    return wait_s + draw * min(wait_s, PAUSE_SPREAD_S)


def build_settlement(
    granted: Granted,
    answered_ago_s: float | None,
    used_tokens: int | None,
    signals: Sequence[RateLimitSignal],
) -> Settlement | None:
    """What to write after a granted call (None: nothing). `answered_ago_s`: how long ago the model's answer
    began (None: the call failed). A call that failed — an error, a 429, no answer at all — gives back what
    it reserved, as the provider counts what it serves (a 429 pauses instead); an answered one is counted
    from when its answer began (see the module), its tokens corrected to its usage when a tokens budget
    counted them; the signals of its HTTP answers pause the model for as long as the longest of them asks.
    """
    pause_s = max((build_pause_s(signal) for signal in signals), default=0.0)
    if not granted.budgets:
        return Settlement(pause_s=pause_s) if pause_s > 0 else None
    if answered_ago_s is None:
        return Settlement(refund=True, pause_s=pause_s)
    counts_tokens = any(budget.tokens is not None for budget in granted.budgets)
    correct = counts_tokens and used_tokens is not None and used_tokens != granted.tokens
    return Settlement(
        answered_ago_s=max(answered_ago_s, 0.0), used_tokens=used_tokens if correct else None, pause_s=pause_s
    )
