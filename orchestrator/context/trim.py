"""Fitting a request-time view into a token budget; the stored history is never touched.

When the view is over the budget, in this order, each step only as far as needed:

1. the tool results of earlier turns are elided, oldest first: each becomes a marker that says what was
   removed and how large it was;
2. the oldest exchanges are dropped whole — a user message and everything up to the next one — so that a
   tool call never leaves without its result, nor a result without its call;
3. the current turn's own tool results are elided, oldest first, except those of its last round.

Pinned messages (instructions, a compaction summary) and the current turn (from its last user message on)
are never dropped. What is left over the budget is sent as it is: the provider's answer then tells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.context.tokens import TokenCounter, count_message_tokens, estimate_text_tokens
from orchestrator.model import AssistantMessage, Message, ToolMessage

ItemKind = Literal["pinned", "user", "tool_calls", "tool_result", "other"]
RemovalKind = Literal["elided_tool_result", "dropped_exchange"]


def build_elision_marker(characters: int) -> str:
    """What an elided tool result says in place of its content."""
    return f"[tool result elided to fit the context window: {characters:,} characters]"


@dataclass(frozen=True)
class ViewItem:
    """One message of a view, with the index of the history message it shows and what it is."""

    index: int
    message: Message
    kind: ItemKind
    # For a tool result: the characters of the stored result (the view's text may be flattened).
    result_chars: int = 0


@dataclass(frozen=True)
class Removal:
    """One thing trimming removed: an elided tool result, or a dropped exchange (`index` to `end`)."""

    kind: RemovalKind
    index: int
    detail: str
    end: int = -1


@dataclass(frozen=True)
class Fitted:
    """A view after trimming, what was removed, and its estimated tokens before and after."""

    messages: list[Message]
    removals: list[Removal]
    tokens_before: int
    tokens_after: int


def fit_to_budget(
    items: Sequence[ViewItem], budget_tokens: int, count: TokenCounter = estimate_text_tokens
) -> Fitted:
    """The messages of `items` trimmed to `budget_tokens` (their estimated tokens), as the module says."""
    trimmer = _Trimmer(items, budget_tokens, count)
    before = trimmer.total
    if trimmer.over:
        current = _current_turn_start(items)
        earlier = [p for p in range(current) if items[p].kind != "pinned"]
        trimmer.elide([p for p in earlier if items[p].kind == "tool_result"])
        for exchange in _exchanges(items, earlier):
            if not trimmer.over:
                break
            trimmer.drop(exchange)
        trimmer.elide(_older_results_of_turn(items, current))
    messages = [m for m in trimmer.slots if m is not None]
    return Fitted(messages, trimmer.removals, before, trimmer.total)


class _Trimmer:
    def __init__(self, items: Sequence[ViewItem], budget_tokens: int, count: TokenCounter) -> None:
        self.items = items
        self.budget = budget_tokens
        self.count = count
        self.slots: list[Message | None] = [item.message for item in items]
        self.sizes = [count_message_tokens(item.message, count) for item in items]
        self.total = sum(self.sizes)
        self.removals: list[Removal] = []

    @property
    def over(self) -> bool:
        return self.total > self.budget

    def elide(self, positions: Sequence[int]) -> None:
        for position in positions:
            if not self.over:
                return
            item = self.items[position]
            marker = build_elision_marker(item.result_chars)
            elided = _with_marker(item.message, marker)
            size = count_message_tokens(elided, self.count)
            if size >= self.sizes[position]:
                continue  # already smaller than its marker
            self.total -= self.sizes[position] - size
            self.sizes[position] = size
            self.slots[position] = elided
            self.removals.append(Removal("elided_tool_result", item.index, marker, item.index))

    def drop(self, positions: Sequence[int]) -> None:
        tokens = sum(self.sizes[p] for p in positions)
        for position in positions:
            self.slots[position] = None
        self.total -= tokens
        first, last = self.items[positions[0]].index, self.items[positions[-1]].index
        detail = f"messages {first}–{last} ({len(positions)} messages, about {tokens:,} tokens)"
        self.removals.append(Removal("dropped_exchange", first, detail, last))


def _with_marker(message: Message, marker: str) -> Message:
    if isinstance(message, ToolMessage):
        return message.model_copy(update={"content": marker})
    if isinstance(message, AssistantMessage):
        # A result flattened to text for another provider keeps its "[Tool result: name]" head.
        head = (message.content or "").split("] ", 1)[0]
        return message.model_copy(update={"content": f"{head}] {marker}" if head.startswith("[") else marker})
    return message


def _current_turn_start(items: Sequence[ViewItem]) -> int:
    """The position of the last user message; 0 when there is none (all of it is the current turn)."""
    for position in range(len(items) - 1, -1, -1):
        if items[position].kind == "user":
            return position
    return 0


def _exchanges(items: Sequence[ViewItem], positions: Sequence[int]) -> list[list[int]]:
    """`positions` cut before each user message: the leading run without one is an exchange of its own."""
    exchanges: list[list[int]] = []
    for position in positions:
        if not exchanges or items[position].kind == "user":
            exchanges.append([])
        exchanges[-1].append(position)
    return exchanges


def _older_results_of_turn(items: Sequence[ViewItem], current: int) -> list[int]:
    """The current turn's tool results before its last round of calls."""
    calls = [p for p in range(current, len(items)) if items[p].kind == "tool_calls"]
    if not calls:
        return []
    return [p for p in range(current, calls[-1]) if items[p].kind == "tool_result"]
