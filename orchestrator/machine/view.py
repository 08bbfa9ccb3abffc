"""The request-time view of a turn's history (docs/design/model-calls.md).

The stored history is append-only and never changed. Just before each model call, `build_view` projects it
for the target provider and reports every change it made as a `ViewDiagnostic`, stored with the step:

- tool calls produced by another provider are flattened: the assistant's calls become text describing them,
  each tool message becomes assistant text "[Tool result: name] …";
- tool-call ids the target would reject are remapped, consistently for a call and its result;
- thinking and provider continuation data from another provider are never sent (dropped, reported).

`fit_view` then fits the projection into the turn's context budget (`orchestrator.context`):
a compaction summary stands for the history it summarised, old tool results are elided and old exchanges
dropped as far as needed; each removal is a diagnostic too.

Providers of one wire family count as one; the families and the ids each accepts are the providers' traits
(`orchestrator.providers.traits`). Pure: no I/O, deterministic.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.context.budget import ContextBudget, ContextSummary
from orchestrator.context.tokens import (
    REQUEST_OVERHEAD_TOKENS,
    build_token_counter,
    count_controls_tokens,
    count_tools_tokens,
)
from orchestrator.context.trim import ItemKind, ViewItem, fit_to_budget
from orchestrator.context.windows import build_context_window, build_output_reserve
from orchestrator.machine.state import ViewDiagnostic, ViewDiagnosticKind
from orchestrator.model import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from orchestrator.providers.traits import ProviderTraits, traits_of, wire_family
from workers.contract import ToolSpec

__all__ = ["View", "build_budget_tokens", "build_safe_id", "build_view", "fit_view", "wire_family"]

SUMMARY_HEAD = "Summary of the earlier conversation (its messages are left out to fit the context window):"


@dataclass(frozen=True)
class View:
    """The messages to send for one model call, and what the projection did to get them.

    Once fitted: the request's estimated tokens before and after trimming, and the budget it was fitted to.
    """

    messages: list[Message]
    diagnostics: list[ViewDiagnostic] = field(default_factory=list)
    tokens_before: int = 0
    tokens: int = 0
    budget_tokens: int = 0
    # The history index up to which exchanges were dropped (0: none), what a compaction would summarise.
    dropped_through: int = 0


def build_budget_tokens(model: str, budget: ContextBudget) -> int:
    """The tokens a whole request to `model` may hold: the window less the answer's reserve, capped."""
    window = budget.window_tokens or build_context_window(model)
    reserve = budget.output_reserve_tokens
    limit = window - (reserve if reserve is not None else build_output_reserve(window))
    return max(1, limit if budget.cap_tokens is None else min(limit, budget.cap_tokens))


def fit_view(
    view: View,
    history: Sequence[Message],
    *,
    model: str,
    tools: Sequence[ToolSpec],
    budget_tokens: int,
    summary: ContextSummary | None = None,
    instructions: str | None = None,
    output_schema: Mapping[str, Any] | None = None,
) -> View:
    """`view` (the projection of `history`) with the summary in place and trimmed to `budget_tokens`; the
    request's tools, instructions and output schema count, as sent whole."""
    count = build_token_counter(model)
    fixed = (
        REQUEST_OVERHEAD_TOKENS
        + count_tools_tokens(tools, count)
        + count_controls_tokens(instructions, output_schema, count)
    )
    items = _items(view.messages, history, summary)
    fitted = fit_to_budget(items, budget_tokens - fixed, count)
    diagnostics = list(view.diagnostics)
    if summary is not None and summary.through <= len(history):
        detail = (
            f"messages 0–{summary.through - 1} shown as the summary of model call {summary.llm_call_index}"
        )
        diagnostics.append(ViewDiagnostic(kind="compacted", message_index=0, detail=detail))
    dropped_through = 0
    for removal in fitted.removals:
        diagnostics.append(
            ViewDiagnostic(kind=removal.kind, message_index=removal.index, detail=removal.detail)
        )
        if removal.kind == "dropped_exchange":
            dropped_through = removal.end + 1
    tokens = fixed + fitted.tokens_after
    if tokens > budget_tokens:
        detail = f"about {tokens:,} tokens after trimming, over the budget of {budget_tokens:,}"
        diagnostics.append(ViewDiagnostic(kind="over_budget", message_index=len(history) - 1, detail=detail))
    return View(
        fitted.messages,
        diagnostics,
        tokens_before=fixed + fitted.tokens_before,
        tokens=tokens,
        budget_tokens=budget_tokens,
        dropped_through=dropped_through,
    )


def _items(
    messages: Sequence[Message], history: Sequence[Message], summary: ContextSummary | None
) -> list[ViewItem]:
    through = summary.through if summary is not None and summary.through <= len(history) else 0
    items: list[ViewItem] = []
    for index, (stored, sent) in enumerate(zip(history, messages, strict=True)):
        if index == through and summary is not None and through:
            items.append(ViewItem(index, SystemMessage(content=f"{SUMMARY_HEAD}\n{summary.text}"), "pinned"))
        kind = _kind_of(stored)
        if index >= through or kind == "pinned":
            chars = len(stored.content) if isinstance(stored, ToolMessage) else 0
            items.append(ViewItem(index, sent, kind, chars))
    return items


def _kind_of(message: Message) -> ItemKind:
    if isinstance(message, SystemMessage):
        return "pinned"
    if isinstance(message, UserMessage):
        return "user"
    if isinstance(message, ToolMessage):
        return "tool_result"
    return "tool_calls" if message.tool_calls else "other"


def build_view(history: Sequence[Message], target_provider: str) -> View:
    """The projection of `history` to send to `target_provider` (a provider name or `provider:model`)."""
    builder = _ViewBuilder(traits_of(target_provider))
    for index, message in enumerate(history):
        builder.add(index, message)
    return View(builder.messages, builder.diagnostics)


class _ViewBuilder:
    def __init__(self, target: ProviderTraits) -> None:
        self.target = target.wire_family
        self.traits = target
        self.messages: list[Message] = []
        self.diagnostics: list[ViewDiagnostic] = []
        self.id_map: dict[str, str] = {}
        # Ids of calls that were flattened: their tool messages are flattened too.
        self.flattened_ids: set[str] = set()

    def note(self, kind: ViewDiagnosticKind, index: int, detail: str) -> None:
        self.diagnostics.append(ViewDiagnostic(kind=kind, message_index=index, detail=detail))

    def add(self, index: int, message: Message) -> None:
        if isinstance(message, AssistantMessage):
            self.add_assistant(index, message)
        elif isinstance(message, ToolMessage):
            self.add_tool(index, message)
        else:
            self.messages.append(message)

    def is_foreign(self, message: AssistantMessage) -> bool:
        family = wire_family(message.provider)
        return family is not None and family != self.target

    def add_assistant(self, index: int, message: AssistantMessage) -> None:
        foreign = self.is_foreign(message)
        update: dict[str, object] = {}
        if foreign and message.thinking:
            update["thinking"] = None
            self.note("dropped_thinking", index, f"thinking from provider '{message.provider}' not sent")
        if foreign and message.provider_data:
            update["provider_data"] = {}
            keys = ", ".join(sorted(message.provider_data))
            self.note(
                "dropped_provider_data", index, f"provider data of '{message.provider}' not sent: {keys}"
            )
        if foreign and message.tool_calls:
            self.flattened_ids.update(call.id for call in message.tool_calls)
            # Text now, and no longer tied to the provider that wrote it.
            update.update(
                content=_describe_calls(message.content, message.tool_calls),
                tool_calls=[],
                provider=None,
                model=None,
            )
            names = ", ".join(call.name for call in message.tool_calls)
            self.note(
                "flattened_tool_calls",
                index,
                f"{len(message.tool_calls)} call(s) of '{message.provider}' as text: {names}",
            )
        elif message.tool_calls:
            calls = [self.remap_call(index, call) for call in message.tool_calls]
            if calls != message.tool_calls:
                update["tool_calls"] = calls
        self.messages.append(message.model_copy(update=update) if update else message)

    def add_tool(self, index: int, message: ToolMessage) -> None:
        if message.tool_call_id in self.flattened_ids:
            self.messages.append(AssistantMessage(content=f"[Tool result: {message.name}] {message.content}"))
            self.note(
                "flattened_tool_result", index, f"result of '{message.name}' ({message.tool_call_id}) as text"
            )
            return
        new_id = self.id_map.get(message.tool_call_id)
        if new_id is None:
            new_id = self.remap_id(index, message.tool_call_id)
        if new_id != message.tool_call_id:
            message = message.model_copy(update={"tool_call_id": new_id})
        self.messages.append(message)

    def remap_call(self, index: int, call: ToolCall) -> ToolCall:
        new_id = self.remap_id(index, call.id)
        return call if new_id == call.id else call.model_copy(update={"id": new_id})

    def remap_id(self, index: int, call_id: str) -> str:
        if call_id in self.id_map:
            return self.id_map[call_id]
        new_id = call_id
        if not self.traits.accepts_tool_call_id(call_id):
            new_id = build_safe_id(call_id)
            self.note("remapped_tool_call_id", index, f"id {call_id!r} → {new_id!r} for '{self.target}'")
        self.id_map[call_id] = new_id
        return new_id


def build_safe_id(call_id: str) -> str:
    """A deterministic id every provider accepts (29 characters of [a-z0-9_]), derived from `call_id`."""
    return "call_" + hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:24]


def _describe_calls(text: str | None, calls: Sequence[ToolCall]) -> str:
    lines = [text] if text else []
    for call in calls:
        arguments = call.raw_arguments if call.arguments_error else json.dumps(call.arguments, sort_keys=True)
        lines.append(f"[Tool call: {call.name}] {arguments}")
    return "\n".join(lines)
