"""The request of a compaction call: older history, as a transcript, for the model to summarise.

A compaction stands for the exchanges a view would otherwise drop. Its request is plain text
(no tools, no tool-call structure), so that any model reads it, and it is cut to the budget, keeping the
most recent part: a transcript too long to summarise would fail like the view it replaces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from orchestrator.context.tokens import BYTES_PER_TOKEN
from orchestrator.model import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage

COMPACTION_INSTRUCTIONS = (
    "You write the memory of a conversation between a user and an assistant that uses tools. Summarise the "
    "transcript below so that the assistant can carry on without it: the user's goals and requests, the "
    "facts, names, numbers and decisions established, what the tools returned that still matters, and "
    "what is left open. Plain text, at most 400 words. Do not address the user."
)
# A tool result in the transcript is cut to this many characters: the summary needs its gist.
RESULT_LIMIT_CHARS = 2_000


def build_compaction_messages(
    history: Sequence[Message], previous_summary: str | None, budget_tokens: int
) -> list[Message]:
    """The messages of a call summarising `history` (with the earlier summary it extends, if any)."""
    lines = [_render(message) for message in history if not isinstance(message, SystemMessage)]
    transcript = "\n".join(line for line in lines if line)
    limit_bytes = max(1, budget_tokens - _overhead_tokens(previous_summary)) * BYTES_PER_TOKEN
    encoded = transcript.encode("utf-8")
    if len(encoded) > limit_bytes:
        transcript = "[…]" + encoded[-limit_bytes:].decode("utf-8", errors="ignore")
    parts = [f"Summary so far:\n{previous_summary}"] if previous_summary else []
    parts.append(f"Transcript:\n{transcript}")
    return [SystemMessage(content=COMPACTION_INSTRUCTIONS), UserMessage(content="\n\n".join(parts))]


def _overhead_tokens(previous_summary: str | None) -> int:
    text = COMPACTION_INSTRUCTIONS + (previous_summary or "")
    return 64 + len(text.encode("utf-8")) // BYTES_PER_TOKEN + 1


def _render(message: Message) -> str:
    if isinstance(message, UserMessage):
        return f"user: {message.content}"
    if isinstance(message, ToolMessage):
        content = message.content
        if len(content) > RESULT_LIMIT_CHARS:
            content = f"{content[:RESULT_LIMIT_CHARS]}… [{len(content):,} characters in all]"
        return f"tool result ({message.name}): {content}"
    if isinstance(message, AssistantMessage):
        calls = [f"[calls {c.name} {json.dumps(c.arguments, sort_keys=True)}]" for c in message.tool_calls]
        return " ".join(filter(None, [f"assistant: {message.content or ''}".rstrip(), *calls]))
    return ""
