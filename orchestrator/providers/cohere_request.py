"""The request half of Cohere's v2 Chat API (`POST /v2/chat`): messages, tools, the tool choice, the model
settings and an output schema, as the body wants them. Pure; `cohere.to_wire` gathers these.

Messages: one `system` message first, holding the request's instructions and then the history's system
messages (Cohere refuses a system turn anywhere but first); user messages as they are; an assistant message
with its `tool_calls` (arguments a JSON string, a broken call's own text verbatim) and, when Cohere wrote it,
its `tool_plan` back in its own field and its thinking as a `thinking` content block (Cohere's own examples
send a reasoning model's message back whole); another provider's thinking is never sent. Each tool result is
its own `tool` message, `tool_call_id` and a text content block.

Tool choice: v2 takes only `REQUIRED` and `NONE`; `auto` is the default, sent as nothing. A named tool is
forced by offering that tool alone with `REQUIRED`.

Settings: `temperature`, `top_p` as `p`, `max_output_tokens` (the settings' first, else the request's) as
`max_tokens`, `stop` as `stop_sequences`, `seed`, and `reasoning_effort` as `thinking: {type: enabled,
token_budget}` (`THINKING_BUDGET_TOKENS`, kept `THINKING_ANSWER_ROOM_TOKENS` short of a `max_tokens` that is
set, as Cohere's reasoning guide advises). Parallel tool calls are what Cohere always does: there is no
switch, so `parallel_tool_calls` is refused. `check_controls` says what else Cohere refuses: a temperature
above 1, a `top_p` outside 0.01–0.99, a negative seed (the API reference's ranges).

Output schema: `response_format: {type: json_object, json_schema}` when the call offers no tools — Cohere
refuses `response_format` beside `tools` — else the answer tool of `structured` beside the other tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from orchestrator.model import (
    AssistantMessage,
    Message,
    ReasoningEffort,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from orchestrator.providers.structured import ANSWER_TOOL, ANSWER_TOOL_DESCRIPTION
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

PROVIDER = "cohere"
CHAT_PATH = "/v2/chat"
# Thinking budget per effort. Cohere takes any positive budget; these follow the other providers' steps.
THINKING_BUDGET_TOKENS: Mapping[ReasoningEffort, int] = MappingProxyType(
    {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
)
# Cohere's reasoning guide: leave at least 1K tokens of `max_tokens` for the answer.
THINKING_ANSWER_ROOM_TOKENS = 1024


# --- settings --------------------------------------------------------------------------------------------


def build_settings(request: ModelRequest) -> dict[str, Any]:
    """`temperature`, `p`, `max_tokens`, `stop_sequences`, `seed` and `thinking` of the request's settings;
    what is not set is not sent (Cohere's defaults stand)."""
    settings = request.settings
    max_tokens = settings.max_output_tokens or request.max_output_tokens
    fields: dict[str, Any] = {
        "temperature": settings.temperature,
        "p": settings.top_p,
        "max_tokens": max_tokens,
        "stop_sequences": settings.stop or None,
        "seed": settings.seed,
    }
    if settings.reasoning_effort is not None:
        fields["thinking"] = {
            "type": "enabled",
            "token_budget": build_thinking_budget(settings.reasoning_effort, max_tokens),
        }
    return {k: v for k, v in fields.items() if v is not None}


def build_thinking_budget(effort: ReasoningEffort, max_tokens: int | None) -> int:
    """The thinking budget for `effort`: `THINKING_BUDGET_TOKENS`, and with `max_tokens` set, at most what
    leaves the answer `THINKING_ANSWER_ROOM_TOKENS` (or half of a smaller `max_tokens`); at least 1."""
    budget = THINKING_BUDGET_TOKENS[effort]
    if max_tokens is not None:
        room = min(THINKING_ANSWER_ROOM_TOKENS, max_tokens // 2)
        budget = min(budget, max_tokens - room)
    return max(budget, 1)


# --- tools -----------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Cohere function tool (`parameters` is required: an object schema at least)."""
    parameters = dict(spec.parameters)
    parameters.setdefault("type", "object")
    function: dict[str, Any] = {"name": spec.name, "parameters": parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def build_answer_tool_param(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The answer tool of an output schema (`structured.ANSWER_TOOL`) as a Cohere function tool."""
    parameters = dict(schema)
    parameters.setdefault("type", "object")
    return {
        "type": "function",
        "function": {"name": ANSWER_TOOL, "description": ANSWER_TOOL_DESCRIPTION, "parameters": parameters},
    }


def build_tools(request: ModelRequest) -> dict[str, Any]:
    """`tools`, `tool_choice` and `response_format` for the request's tools, choice and output schema."""
    tools = [build_tool_param(t) for t in request.tools]
    choice = request.tool_choice
    schema = request.output_schema
    if schema is not None and (not tools or choice == "none"):
        # No tool may be called: the answer is the response format's JSON, and Cohere refuses that format
        # beside `tools`, which are left out (a call with tool_choice none could not use them anyway).
        return {"response_format": {"type": "json_object", "json_schema": dict(schema)}}
    if not tools:
        return {}
    if choice is not None and choice not in ("auto", "required", "none"):
        named = [t for t in tools if t["function"]["name"] == choice]
        # A tool is forced by offering it alone; an unknown name forces any tool rather than none.
        return {"tools": named or tools, "tool_choice": "REQUIRED"}
    if schema is not None:
        tools.append(build_answer_tool_param(schema))
    fields: dict[str, Any] = {"tools": tools}
    if choice == "required":
        fields["tool_choice"] = "REQUIRED"
    elif choice == "none":
        fields["tool_choice"] = "NONE"
    return fields


# --- messages --------------------------------------------------------------------------------------------


def build_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The `messages` array: the system message first (instructions, then the history's system messages),
    then the conversation, one `tool` message per result. Empty user and assistant turns are left out
    (Cohere refuses a turn without a message)."""
    system = build_system(request.instructions, request.messages)
    wire: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in request.messages:
        built = build_message(message)
        if built is not None:
            wire.append(built)
    return wire


def build_system(instructions: str | None, messages: Sequence[Message]) -> str | None:
    """The system message's text: the instructions first, then every system message, blank-line apart."""
    parts = [instructions] if instructions else []
    parts.extend(m.content for m in messages if isinstance(m, SystemMessage) and m.content)
    return "\n\n".join(parts) if parts else None


def build_message(message: Message) -> dict[str, Any] | None:
    """One conversation message in Cohere's form; None for what is not sent here (system messages, which
    `build_system` gathers, and empty turns)."""
    match message:
        case SystemMessage():
            return None
        case UserMessage(content=content):
            return {"role": "user", "content": content} if content else None
        case AssistantMessage():
            return build_assistant(message)
        case ToolMessage(tool_call_id=call_id, content=content):
            return {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": content}]}
    raise TypeError(f"not a message: {message!r}")


def build_assistant(message: AssistantMessage) -> dict[str, Any] | None:
    """An assistant turn: its tool plan and thinking when Cohere wrote them, its text, its tool calls."""
    own = message.provider == PROVIDER
    text = message.content or ""
    plan = message.provider_data.get("tool_plan") if own else None
    wire: dict[str, Any] = {"role": "assistant"}
    if isinstance(plan, str) and plan and text.startswith(plan):
        # `cohere.from_wire` made the plan the start of the text; it goes back in its own field.
        wire["tool_plan"] = plan
        text = text[len(plan) :].removeprefix("\n\n")
    thinking = message.thinking if own and message.thinking and message.thinking.strip() else None
    if thinking is not None:
        blocks = [{"type": "thinking", "thinking": thinking}]
        wire["content"] = [*blocks, {"type": "text", "text": text}] if text else blocks
    elif text:
        wire["content"] = text
    if message.tool_calls:
        wire["tool_calls"] = [build_call(c) for c in message.tool_calls]
    return wire if len(wire) > 1 else None


def build_call(call: ToolCall) -> dict[str, Any]:
    """A tool call as sent back: arguments as a JSON string, or the model's own broken text verbatim."""
    if call.arguments_error and call.raw_arguments is not None:
        arguments = call.raw_arguments
    else:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}
