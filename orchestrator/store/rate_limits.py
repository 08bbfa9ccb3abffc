"""The fleet's model rate limits in Redis: admit a model call, settle it after its answer (`rate_limit.lua`).

One script call before each model call (`ModelLimiter.admit`): it checks the model's pause — a rest its
provider asked of the whole fleet — then every budget the call draws from (`model_limits.build_budgets`),
and either counts the call in each or says what holds it and for how long; nothing is counted unless all
have room. One more after the answer when there is something to write (`ModelLimiter.settle`, from
`model_limits.build_settlement`): a refund, a correction of the tokens, a pause. Time is Redis's, one clock
for the fleet.

A Redis that does not answer holds no call: the limiter is a courtesy to the provider, whose own 429s still
stand behind it, and the turn's steps need Redis anyway. The call goes, unmetered, with a warning.
"""

from __future__ import annotations

import logging
import random
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
from orchestrator.store.effects import ScriptCall
from orchestrator.store.runner import AsyncRunner
from workers import keys

log = logging.getLogger("toolloop.orchestrator")

# What held a call, as `rate_limit.lua` answers it.
_HELD_BY: Mapping[int, LimitName] = {1: "provider", 2: "requests_per_minute", 3: "tokens_per_minute"}


def _budget_keys(model: str, budgets: Sequence[Budget]) -> tuple[str, ...]:
    each = [
        (keys.model_budget_calls(b.key), keys.model_budget_tokens(b.key), keys.model_budget_line(b.key))
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

    def __init__(self, client: aioredis.Redis, limits: Mapping[str, ModelLimit]) -> None:
        """`limits`: TOOLLOOP_MODEL_LIMITS, by `provider:model` or `provider`."""
        self._runner = AsyncRunner(client)
        self._limits = dict(limits)
        self._budgets: dict[str, tuple[Budget, ...]] = {}

    async def admit(self, model: str, tokens: int, call: str | None = None) -> Admission:
        """May call `call` (an id the same each time it asks; None: a new one) of `model` (`provider:model`)
        that may use `tokens` go now? Granted (and counted), or Throttled; Granted unmetered when Redis
        does not answer."""
        budgets = self._budgets.get(model)
        if budgets is None:
            budgets = self._budgets[model] = build_budgets(model, self._limits)
        reservation = call or uuid.uuid4().hex
        try:
            return await self._runner.run(admit(model, budgets, reservation, tokens))
        except redis.RedisError as exc:
            log.warning("model %s called without its rate limits: Redis did not answer (%r)", model, exc)
            return Granted(model, reservation)

    async def settle(self, granted: Granted, settlement: Settlement) -> None:
        """Write what a granted call left; a Redis that does not answer loses it (logged)."""
        try:
            await self._runner.run(settle(granted, settlement))
        except redis.RedisError as exc:
            log.warning("model %s: rate limits not updated, Redis did not answer (%r)", granted.model, exc)

    def counts_tokens(self, model: str) -> bool:
        """True when a tokens budget counts the calls of `model` (they need an estimate of their tokens)."""
        return any(b.tokens is not None for b in build_budgets(model, self._limits))
