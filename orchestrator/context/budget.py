"""What a turn keeps about its context budget: the `context_budget` field of `TurnState`.

`ContextBudget.replace` takes `BudgetChanges` keywords, so that mypy checks each field the machine sets, as
`TurnChanges` does for the state (a unit test keeps the two in step).
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field


class ContextSummary(BaseModel):
    """A compaction: the history before `through` summarised by model call `llm_call_index`.

    Later views of the turn show the summary instead of those messages; the stored history keeps them all.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    through: int
    text: str
    llm_call_index: int


class ContextBudget(BaseModel):
    """What a turn's views must fit, set when the turn starts and learned from the provider, and how the
    turn has fared with it (`orchestrator.machine.model_calls`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # None: the known table's window (`orchestrator.context.windows`), a share of it for the answer.
    window_tokens: int | None = None
    output_reserve_tokens: int | None = None
    # Summarise older history by a model call before dropping exchanges (TOOLLOOP_COMPACTION).
    compaction: bool = False
    # A cap on a request's estimated tokens, set by an over-long-context error that stated no window.
    cap_tokens: int | None = None
    # Over-long-context errors answered at the current model call (reset by an answer).
    retries: int = 0
    # The estimated tokens of the last request sent.
    view_tokens: int = 0
    summary: ContextSummary | None = None
    # While a compaction call is in flight: the history index it summarises up to.
    compacting: int | None = None
    # The window of each model of a fallback order, as the runtime knew it at the start (configured, learned
    # or known): the next model's replaces `window_tokens` when it takes over (None there: the known table's).
    model_windows: dict[str, int] = Field(default_factory=dict)

    def replace(self, **changes: Unpack[BudgetChanges]) -> ContextBudget:
        """A copy with `changes`, not validated (mypy checks them)."""
        return self.model_copy(update=changes)


class BudgetChanges(TypedDict, total=False):
    """Fields of a `ContextBudget` to change (`ContextBudget.replace`)."""

    window_tokens: int | None
    output_reserve_tokens: int | None
    compaction: bool
    cap_tokens: int | None
    retries: int
    view_tokens: int
    summary: ContextSummary | None
    compacting: int | None
    model_windows: dict[str, int]
