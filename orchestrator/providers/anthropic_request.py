"""The parts of an Anthropic Messages request that model controls shape: settings, the system
prompt, the answer tool of an output schema, and prompt-caching breakpoints. Pure; `anthropic.to_wire` calls
these.

Settings: `max_tokens` is always sent — the setting's `max_output_tokens` (or the request's own), else
`DEFAULT_MAX_TOKENS`. `reasoning_effort` turns extended thinking on, `thinking: {type: enabled,
budget_tokens}` with the budget of `profiles.anthropic.THINKING_BUDGET_TOKENS` (minimal 1024, low 2048,
medium 8192, high 16384), kept at least 1024 tokens below a `max_output_tokens` that is set; without one,
`max_tokens` is the budget plus `DEFAULT_MAX_TOKENS`, so the answer keeps its usual room. `stop` is
`stop_sequences`; `parallel_tool_calls: false` is `tool_choice.disable_parallel_tool_use`.

Prompt caching (on unless the request says `prompt_cache=False`): `cache_control: {type: ephemeral}` on the
system prompt, on the last tool, and on the last block of the conversation's stable prefix — the message
before the newest user or tool-result turn, which the next call of the turn sends again unchanged. Three
breakpoints at most, within Anthropic's four; a prefix shorter than the model's minimum is simply not cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.model import SystemMessage
from orchestrator.providers.profiles.anthropic import build_thinking_budget
from orchestrator.providers.structured import ANSWER_TOOL, build_answer_tool

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

# Anthropic requires max_tokens on every request.
DEFAULT_MAX_TOKENS = 4096
CACHE_CONTROL = {"type": "ephemeral"}
_UNCACHEABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def build_settings(request: ModelRequest) -> dict[str, Any]:
    """`max_tokens`, `thinking`, `temperature`, `top_p` and `stop_sequences` of the request's settings."""
    settings = request.settings
    max_tokens = settings.max_output_tokens or request.max_output_tokens
    fields: dict[str, Any] = {}
    if settings.reasoning_effort is not None:
        budget = build_thinking_budget(settings.reasoning_effort, max_tokens)
        fields["thinking"] = {"type": "enabled", "budget_tokens": budget}
        max_tokens = max_tokens or budget + DEFAULT_MAX_TOKENS
    fields["max_tokens"] = max_tokens or DEFAULT_MAX_TOKENS
    optional = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "stop_sequences": settings.stop or None,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    return fields


def build_system(request: ModelRequest) -> str | None:
    """The `system` text: the request's instructions first, then the history's system messages."""
    parts = [request.instructions] if request.instructions else []
    parts.extend(m.content for m in request.messages if isinstance(m, SystemMessage) and m.content)
    return "\n\n".join(parts) if parts else None


def build_tools(
    request: ModelRequest, tools: list[dict[str, Any]], choice: dict[str, Any] | None
) -> dict[str, Any]:
    """`tools` and `tool_choice`: the offered tools (already in Anthropic's form) and the requested choice,
    with the answer tool of an output schema (`structured`) and `disable_parallel_tool_use`."""
    tools = list(tools)
    if request.output_schema is not None:
        tools.append(build_answer_tool(request.output_schema))
        choice = _answer_choice(request, choice)
    if not tools:
        return {}
    if request.settings.parallel_tool_calls is False and (choice or {}).get("type") != "none":
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    return {"tools": tools, "tool_choice": choice} if choice is not None else {"tools": tools}


def _answer_choice(request: ModelRequest, choice: dict[str, Any] | None) -> dict[str, Any] | None:
    thinking = request.settings.reasoning_effort is not None
    if not request.tools or request.tool_choice == "none":
        # Only the answer may be given: forced, unless thinking is on (it cannot force a tool).
        return {"type": "auto"} if thinking else {"type": "tool", "name": ANSWER_TOOL}
    return choice


def mark_cache_breakpoints(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with cache breakpoints on its system prompt, its last tool and its stable prefix."""
    marked = dict(body)
    system = marked.get("system")
    if isinstance(system, str):
        marked["system"] = [{"type": "text", "text": system, "cache_control": dict(CACHE_CONTROL)}]
    tools = marked.get("tools")
    if tools:
        marked["tools"] = [*tools[:-1], {**tools[-1], "cache_control": dict(CACHE_CONTROL)}]
    messages: Sequence[dict[str, Any]] = marked.get("messages", [])
    if len(messages) >= 2:
        marked["messages"] = [*messages[:-2], _mark_last_block(messages[-2]), messages[-1]]
    return marked


def _mark_last_block(message: dict[str, Any]) -> dict[str, Any]:
    blocks = list(message["content"])
    for index in range(len(blocks) - 1, -1, -1):
        if blocks[index].get("type") not in _UNCACHEABLE_BLOCKS:
            blocks[index] = {**blocks[index], "cache_control": dict(CACHE_CONTROL)}
            return {**message, "content": blocks}
    return message
