"""Limits per tenant (TOOLLOOP_TENANT_LIMITS): running turns, tokens a minute, tokens a day (pure).

The setting is a JSON object keyed by tenant; its `"default"` entry is the limit of every tenant without one
of its own (each such tenant has that limit to itself, none is shared). Each limit is enforced where its
resource is taken:

- `max_running_turns` by the claim (`store/lua/claim.lua`): a tenant at its cap is passed over, its turns
  stay queued — never refused — and start as its running turns end (`RunningCaps`);
- `tokens_per_minute` by the fleet's model rate limits: one more budget the tenant's model calls draw from
  (`build_tenant_budget`; a call it holds waits, as `model_throttled` with limit
  `tenant_tokens_per_minute`);
- `tokens_per_day` before each model call: past it, the call is not made and the turn ends as
  `quota_exceeded` (`machine.events.QuotaExceeded`), counted per UTC day (`build_quota_day`).

Design notes: docs/design/orchestrators.md, "Claiming a turn".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.model_limits import Budget
from workers.contract import DEFAULT_TENANT

# A tenant's tokens-a-minute budget is counted over this sliding window, as a model's by default.
TENANT_WINDOW_S = 60.0


class TenantLimit(BaseModel):
    """One entry of TOOLLOOP_TENANT_LIMITS; each limit None when not set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_turns: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_day: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _limits_something(self) -> TenantLimit:
        if self.max_running_turns is None and self.tokens_per_minute is None and self.tokens_per_day is None:
            raise ValueError("a tenant limit needs max_running_turns, tokens_per_minute or tokens_per_day")
        return self


def find_tenant_limit(tenant: str, limits: Mapping[str, TenantLimit]) -> TenantLimit | None:
    """The limit of `tenant`: its own entry, else the `"default"` entry, else None."""
    return limits.get(tenant) or limits.get(DEFAULT_TENANT)


@dataclass(frozen=True)
class RunningCaps:
    """What the claim holds each tenant's running turns to: `by_tenant` for those named, `others` for the
    rest (0: no cap)."""

    by_tenant: Mapping[str, int] = field(default_factory=dict)
    others: int = 0


NO_CAPS = RunningCaps()


def build_running_caps(limits: Mapping[str, TenantLimit]) -> RunningCaps:
    """The claim's caps from TOOLLOOP_TENANT_LIMITS (a named tenant without `max_running_turns` has none)."""
    default = limits.get(DEFAULT_TENANT)
    others = default.max_running_turns if default is not None and default.max_running_turns else 0
    named = {
        tenant: limit.max_running_turns or 0 for tenant, limit in limits.items() if tenant != DEFAULT_TENANT
    }
    return RunningCaps({**named, DEFAULT_TENANT: others}, others)


def build_tenant_budget(tenant: str, limit: TenantLimit | None) -> Budget | None:
    """The budget of a tenant's tokens a minute, which its model calls draw from besides their model's."""
    if limit is None or limit.tokens_per_minute is None:
        return None
    return Budget(f"tenant:{tenant}", TENANT_WINDOW_S, None, limit.tokens_per_minute, tenant=True)


def build_quota_day(now: float) -> str:
    """The UTC day (YYYY-MM-DD) a call at `now` (epoch s) counts in against `tokens_per_day`."""
    return time.strftime("%Y-%m-%d", time.gmtime(now))
