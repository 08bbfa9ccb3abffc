"""What a streaming model call reports while the model writes, before its Turn is whole.

A provider module's stream reader turns each wire event into zero or more deltas; `HttpModelClient` hands
them to the caller's `DeltaSink` as they arrive. They are a preview: the Turn the call ends with is the
record, and the runtime reconciles what it showed with that Turn (`runtime.streaming`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer's visible text, in order."""

    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """A piece of the model's reasoning (thinking / reasoning summary), in order."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed tool call whose name is now known: `index` is its position in the answer's calls;
    `call_id` the provider's id when it sent one (None: the normaliser will synthesise it)."""

    index: int
    tool: str
    call_id: str | None = None


Delta = TextDelta | ThinkingDelta | ToolCallDelta
DeltaSink = Callable[[Delta], Awaitable[None]]
"""Where a streaming call sends its deltas: awaited in order (a slow sink slows the read, never reorders)."""
