"""The fleet's model rate limits in Redis: admit a model call, settle it after its answer (`rate_limit.lua`).

One script call before each model call (`ModelLimiter.admit`): it checks the model's pause — a rest its
provider asked of the whole fleet — then every budget the call draws from (`model_limits.build_budgets`),
and either counts the call in each or says what holds it and for how long; nothing is counted unless all
have room. One more after the answer when there is something to write (`ModelLimiter.settle`, from
`model_limits.build_settlement`): a refund, a correction of the tokens, a pause. Time is Redis's, one clock
for the fleet.

A call that draws from no budget only has its model's pause to check: an orchestrator that found the model
not paused trusts that for `PAUSE_SEEN_S` before it reads it again, so a busy fleet does not pay a round trip
per model call to learn that nothing is paused. A pause one orchestrator writes holds the others' calls
within that moment (the one that met the provider's signal holds its own at once); the calls sent meanwhile
meet the provider's own answer, as they would have on their way already.

A Redis that does not answer holds no call: the limiter is a courtesy to the provider, whose own 429s still
stand behind it, and the turn's steps need Redis anyway. The call goes, unmetered, with a warning.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from orchestrator.model_limits import (
    Admission,
    Budget,
    Granted,
    LimitName,
    ModelLimit,
    Settlement,
    Throttled,
    build_budgets,
    spread_pause_wait_s,
)
from orchestrator.store import scripts
from orchestrator.store.effects import RedisCommand, ScriptCall, Transaction, parse_reply
from orchestrator.store.runner import AsyncRunner
from orchestrator.tenant_limits import TenantLimit, build_quota_day, build_tenant_budget, find_tenant_limit
from workers import keys
from workers.contract import DEFAULT_TENANT

log = logging.getLogger("toolloop.orchestrator")

# How long a model found not paused is trusted not to be, for calls that draw from no budget.
PAUSE_SEEN_S = 0.25

# What held a call, as `rate_limit.lua` answers it.
_HELD_BY: Mapping[int, LimitName] = {1: "provider", 2: "requests_per_minute", 3: "tokens_per_minute"}


def _budget_keys(model: str, budgets: Sequence[Budget]) -> tuple[str, ...]:
    # A tenant's budget (`tenant_limits.build_tenant_budget`) has keys of its own: no model entry meets it.
    each = [
        (keys.model_budget_calls(b.key), keys.model_budget_tokens(b.key), keys.model_budget_line(b.key))
        if not b.tenant
        else (
            keys.tenant_budget_calls(b.key),
            keys.tenant_budget_tokens(b.key),
            keys.tenant_budget_line(b.key),
        )
        for b in budgets
    ]
    return (keys.model_pause(model), *(key for three in each for key in three))


def admit(model: str, budgets: Sequence[Budget], reservation: str, tokens: int) -> ScriptCall[Admission]:
    """Admit a call of `model` reserving `tokens` under `reservation` (the call's id: the same each time the
    call asks, so that a call told to wait keeps its place in line), or say what holds it."""
    args = ["admit", reservation, str(tokens)]
    for budget in budgets:
        args += [str(round(budget.window_s * 1000)), str(budget.requests or 0), str(budget.tokens or 0)]

    def parse(reply: Any) -> Admission:
        held, wait_ms = int(reply[0]), int(reply[1])
        if held == 0:
            return Granted(model, reservation, tuple(budgets), tokens)
        limit = _HELD_BY[held]
        which = int(reply[2]) if len(reply) > 2 else 0
        if limit == "tokens_per_minute" and 0 < which <= len(budgets) and budgets[which - 1].tenant:
            limit = "tenant_tokens_per_minute"
        # A budget gives each waiter its own slot; a pause gives them all its end: spread them.
        wait_s = wait_ms / 1000.0
        if limit == "provider":
            wait_s = spread_pause_wait_s(wait_s, random.random())
        return Throttled(limit, wait_s)

    return ScriptCall(scripts.RATE_LIMIT, _budget_keys(model, budgets), tuple(args), parse)


def settle(granted: Granted, settlement: Settlement) -> ScriptCall[int]:
    """Write what a granted call left (`model_limits.build_settlement`)."""
    mode = "refund" if settlement.refund else "count"
    used = "" if settlement.used_tokens is None else str(settlement.used_tokens)
    ago_ms = str(round((settlement.answered_ago_s or 0.0) * 1000))
    pause_ms = str(max(round(settlement.pause_s * 1000), 0))
    args = ("settle", granted.reservation, mode, ago_ms, used, pause_ms)
    return ScriptCall(scripts.RATE_LIMIT, _budget_keys(granted.model, granted.budgets), args, int)


class ModelLimiter:
    """The rate limits of one orchestrator's model calls, shared with the fleet through Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        limits: Mapping[str, ModelLimit],
        tenant_limits: Mapping[str, TenantLimit] | None = None,
    ) -> None:
        """`limits`: TOOLLOOP_MODEL_LIMITS, by `provider:model` or `provider`; `tenant_limits`:
        TOOLLOOP_TENANT_LIMITS, by tenant (`"default"` for the others)."""
        self._runner = AsyncRunner(client)
        self._limits = dict(limits)
        self._tenant_limits = dict(tenant_limits or {})
        self._budgets: dict[tuple[str, str], tuple[Budget, ...]] = {}
        # By model: until when (monotonic s) it is known not to be paused.
        self._unpaused_until: dict[str, float] = {}

    def _budgets_of(self, model: str, tenant: str) -> tuple[Budget, ...]:
        budgets = self._budgets.get((model, tenant))
        if budgets is None:
            own = build_tenant_budget(tenant, find_tenant_limit(tenant, self._tenant_limits))
            budgets = build_budgets(model, self._limits) + (() if own is None else (own,))
            self._budgets[(model, tenant)] = budgets
        return budgets

    async def admit(
        self, model: str, tokens: int, call: str | None = None, tenant: str = DEFAULT_TENANT
    ) -> Admission:
        """May call `call` (an id the same each time it asks; None: a new one) of `model` (`provider:model`)
        that may use `tokens` go now, for `tenant`? Granted (and counted), or Throttled; Granted unmetered
        when Redis does not answer."""
        budgets = self._budgets_of(model, tenant)
        reservation = call or uuid.uuid4().hex
        unbudgeted = not budgets
        if unbudgeted and time.monotonic() < self._unpaused_until.get(model, 0.0):
            return Granted(model, reservation, (), tokens)
        try:
            admission = await self._runner.run(admit(model, budgets, reservation, tokens))
        except redis.RedisError as exc:
            log.warning("model %s called without its rate limits: Redis did not answer (%r)", model, exc)
            return Granted(model, reservation)
        if unbudgeted and isinstance(admission, Granted):
            self._unpaused_until[model] = time.monotonic() + PAUSE_SEEN_S
        return admission

    async def settle(self, granted: Granted, settlement: Settlement) -> None:
        """Write what a granted call left; a Redis that does not answer loses it (logged)."""
        if settlement.pause_s > 0:
            # This orchestrator's next calls of the model read the pause it writes.
            self._unpaused_until.pop(granted.model, None)
        try:
            await self._runner.run(settle(granted, settlement))
        except redis.RedisError as exc:
            log.warning("model %s: rate limits not updated, Redis did not answer (%r)", granted.model, exc)

    def counts_tokens(self, model: str, tenant: str = DEFAULT_TENANT) -> bool:
        """True when a tokens budget counts the calls of `model` for `tenant` (they need an estimate of their
        tokens)."""
        return any(b.tokens is not None for b in self._budgets_of(model, tenant))

    def day_quota(self, tenant: str) -> int | None:
        """The tokens `tenant` may use a day (its `tokens_per_day`); None: no quota."""
        limit = find_tenant_limit(tenant, self._tenant_limits)
        return None if limit is None else limit.tokens_per_day

    async def used_today(self, tenant: str, now: float) -> int:
        """The tokens `tenant`'s model calls used on the UTC day of `now`; 0 when Redis does not answer
        (the call goes: a quota is a courtesy, as the rate limits are)."""
        try:
            used = await self._runner.run(read_day_tokens(tenant, now))
        except redis.RedisError as exc:
            log.warning("tenant %s: quota not checked, Redis did not answer (%r)", tenant, exc)
            return 0
        return used

    async def count_day_tokens(self, tenant: str, tokens: int, now: float) -> None:
        """Add what a call of `tenant` used to its day; a Redis that does not answer loses it (logged)."""
        if tokens <= 0 or self.day_quota(tenant) is None:
            return
        try:
            await self._runner.run(add_day_tokens(tenant, tokens, now))
        except redis.RedisError as exc:
            log.warning("tenant %s: %d tokens not counted, Redis did not answer (%r)", tenant, tokens, exc)


# A day's count outlives its day by one, so that a call counted near midnight is not lost to the reader.
DAY_TOKENS_TTL_S = 2 * 86_400


def read_day_tokens(tenant: str, now: float) -> RedisCommand[int]:
    """The tokens `tenant` used on the UTC day of `now`."""
    key = keys.tenant_tokens_day(tenant, build_quota_day(now))
    return RedisCommand(("GET", key), lambda reply: int(reply or 0))


def add_day_tokens(tenant: str, tokens: int, now: float) -> Transaction[Any]:
    """Count `tokens` in `tenant`'s UTC day of `now`."""
    key = keys.tenant_tokens_day(tenant, build_quota_day(now))
    return Transaction((("INCRBY", key, tokens), ("EXPIRE", key, DAY_TOKENS_TTL_S)), parse_reply)
