"""A turn's budgets in tokens and in dollars, and the sum of its model calls' usage: pure.

`check_budget` is asked after every model answer and before every model call. A budget is spent once the
turn has used it (`>=`): the next call could only go over. The cost of a call is the runtime's, from the price
table (`orchestrator.pricing`), set on the answer's usage before it is stepped; the turn's cost is the sum
while every answered call has a price, and unknown (None) from the first one that has none — never a guess.
A budget in dollars with an unknown cost cannot be kept: the turn fails (`max_cost`) rather than spend on.

Design notes: docs/design/model-calls.md, "Budgets and cost".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from orchestrator.machine.state import TurnState
from orchestrator.model import StopReason, Usage


class BudgetStop(NamedTuple):
    """Why a budget ends the turn: the stop reason, its status and what to say."""

    reason: StopReason
    status: Literal["stopped", "failed"]
    message: str


def add_usage(state: TurnState, usage: Usage) -> Usage:
    """The turn's usage with one more answered call's `usage` (before the call's record is kept)."""
    total = state.usage + usage
    answered_before = any(record.error is None for record in state.llm_call_records)
    known = state.usage.cost_usd is not None or not answered_before
    cost = state.usage.cost_usd or 0.0
    summed = cost + usage.cost_usd if known and usage.cost_usd is not None else None
    return total.model_copy(update={"cost_usd": summed})


def used_tokens(usage: Usage) -> int:
    """Tokens used: the total, or input plus output where a provider leaves the total out."""
    return max(usage.total_tokens, usage.input_tokens + usage.output_tokens)


def check_budget(state: TurnState) -> BudgetStop | None:
    """The stop a spent (or unkeepable) budget calls for; None while the turn may call the model again."""
    limits, usage = state.limits, state.usage
    tokens = used_tokens(usage)
    if limits.max_total_tokens is not None and tokens >= limits.max_total_tokens:
        message = f"the budget of {limits.max_total_tokens:,} tokens was spent ({tokens:,} used)"
        return BudgetStop("max_total_tokens", "stopped", message)
    if limits.max_cost_usd is None:
        return None
    if usage.cost_usd is None and any(record.error is None for record in state.llm_call_records):
        answered = [r for r in state.llm_call_records if r.error is None]
        unpriced = sorted({r.model or "?" for r in answered if r.usage.cost_usd is None})
        return BudgetStop("max_cost", "failed", unknown_cost_message(limits.max_cost_usd, unpriced))
    if usage.cost_usd is not None and usage.cost_usd >= limits.max_cost_usd:
        # Significant digits, not decimals: a budget of $0.0001 spent at $0.00012 must not read "$0.0001".
        message = f"the budget of ${limits.max_cost_usd:g} was spent (${usage.cost_usd:.6g})"
        return BudgetStop("max_cost", "stopped", message)
    return None


def unknown_cost_message(max_cost_usd: float, models: Sequence[str]) -> str:
    """Why a budget in dollars cannot be kept: the models whose price is unknown."""
    names = ", ".join(models)
    return (
        f"the budget of ${max_cost_usd:g} cannot be kept: no price is known for {names} "
        "(add it to TOOLLOOP_MODEL_PRICES)"
    )
