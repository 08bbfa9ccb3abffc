"""Anthropic Messages (`POST /v1/messages`), both ways: the provider's profile, the one module the registry
knows it by. Responses and errors are read by `anthropic_response`, event streams by `anthropic_stream`; both
modules sit below this one, which gathers them.

`to_wire` puts the request's instructions and then the system messages in `system`, every tool result as a
`tool_result` block in the user message right after the assistant's `tool_use`, merges consecutive same-role
messages, and never emits a tool id outside `^[a-zA-Z0-9_-]+$` (the view remaps ids; an id that still is not
valid is cleaned here, the same way on both sides of the pair). Model controls: `anthropic_request`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.model import (
    AssistantMessage,
    Message,
    ProviderError,
    SystemMessage,
    ToolMessage,
    Turn,
    UserMessage,
)
from orchestrator.providers import anthropic_request
from orchestrator.providers.anthropic_request import (
    build_settings,
    build_system,
    build_tools,
    mark_cache_breakpoints,
)
from orchestrator.providers.anthropic_response import PROVIDER, error_from_wire, from_wire
from orchestrator.providers.anthropic_stream import AnthropicStreamReader
from orchestrator.providers.common import IdSource
from orchestrator.providers.controls import build_extra
from orchestrator.providers.rate_limits import (
    RateLimitSignal,
    parse_reset_at_s,
    parse_retry_after,
    parse_whole,
    read_header,
)
from orchestrator.providers.stream_reader import StreamReader, read_stream_text
from orchestrator.providers.structured import ANSWER_TOOL
from orchestrator.providers.traits import traits_of
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "API_VERSION",
    "CONTINUE_TEXT",
    "DEFAULT_MAX_TOKENS",
    "MESSAGES_PATH",
    "PROVIDER",
    "build_messages",
    "build_tool_choice",
    "build_tool_param",
    "build_url",
    "clean_tool_id",
    "error_from_wire",
    "from_stream",
    "from_wire",
    "parse_rate_limits",
    "stream_reader",
    "to_wire",
]

MESSAGES_PATH = "/v1/messages"


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """The URL of one Messages API call: the same for every model, streamed or not (the body says which)."""
    del model, stream  # the model and streaming travel in the body
    return f"{base_url}{MESSAGES_PATH}"


API_VERSION = "2023-06-01"
# The user turn after a conversation that ends with the assistant's (see `build_messages`).
CONTINUE_TEXT = "Continue from the results above."
# Sent as `max_tokens` when neither the settings nor the request say (Anthropic requires it).
DEFAULT_MAX_TOKENS = anthropic_request.DEFAULT_MAX_TOKENS


# --- rate limits -----------------------------------------------------------------------------------------


# Anthropic limits tokens three ways at once; the tightest of them is the one that stops a call.
_TOKEN_LIMITS = ("tokens", "input-tokens", "output-tokens")


def parse_rate_limits(status: int | None, headers: Mapping[str, str], now: float) -> RateLimitSignal:
    """Anthropic's rate-limit headers: `anthropic-ratelimit-requests-remaining` and `-reset` (an RFC 3339
    time, read against `now`, epoch seconds), the same for `-tokens-`, `-input-tokens-` and
    `-output-tokens-` (the one with the fewest left stands for tokens), and `retry-after` (seconds); a 429
    is a refusal (a 529 is an overload, not a limit)."""
    prefix = "anthropic-ratelimit-"
    tokens: list[tuple[int, float | None]] = []
    for kind in _TOKEN_LIMITS:
        remaining = parse_whole(read_header(headers, f"{prefix}{kind}-remaining"))
        if remaining is not None:
            tokens.append((remaining, parse_reset_at_s(read_header(headers, f"{prefix}{kind}-reset"), now)))
    # The fewest left; of two equally empty, the later reset.
    fewest = min(tokens, key=lambda t: (t[0], -(t[1] or 0.0)), default=(None, None))
    return RateLimitSignal(
        refused=status == 429,
        retry_after_s=parse_retry_after(read_header(headers, "retry-after")),
        requests_remaining=parse_whole(read_header(headers, f"{prefix}requests-remaining")),
        requests_reset_s=parse_reset_at_s(read_header(headers, f"{prefix}requests-reset"), now),
        tokens_remaining=fewest[0],
        tokens_reset_s=fewest[1],
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one streamed message (`anthropic_stream.AnthropicStreamReader`); for a request with an
    output schema, one that streams the answer tool's input as the answer's text."""
    answer_tool = ANSWER_TOOL if request is not None and request.output_schema is not None else None
    return AnthropicStreamReader(answer_tool=answer_tool)


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole Messages API event stream (LF or CRLF), accumulated."""
    return read_stream_text(stream_reader(), text, ids)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as an Anthropic tool: name, description, input_schema."""
    schema = dict(spec.parameters)
    schema.setdefault("type", "object")
    tool: dict[str, Any] = {"name": spec.name, "input_schema": schema}
    if spec.description:
        tool["description"] = spec.description
    return tool


def build_tool_choice(choice: str | None) -> dict[str, Any] | None:
    """auto → auto, required → any, none → none, a tool name → that tool."""
    if choice is None:
        return None
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def clean_tool_id(tool_id: str) -> str:
    """`tool_id` when Anthropic accepts it, else a valid id derived from it (the same for the same input)."""
    if traits_of(PROVIDER).tool_call_id_pattern.match(tool_id):
        return tool_id
    # The digest keeps two ids that clean to the same characters apart ("a.b" and "a:b").
    digest = hashlib.sha256(tool_id.encode()).hexdigest()[:10]
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", tool_id)[:54]
    return f"{cleaned}_{digest}" if cleaned else f"toolu_{digest}"


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The Messages API request body for `request` (pure); with `stream`, one asking for an event stream.
    Settings, the system prompt, an output schema's answer tool and cache breakpoints: `anthropic_request`;
    `extra` is merged last."""
    body: dict[str, Any] = {
        "model": request.model,
        **build_settings(request),
        "messages": build_messages(request.messages),
    }
    if stream:
        body["stream"] = True
    system = build_system(request)
    if system:
        body["system"] = system
    tools = [build_tool_param(t) for t in request.tools]
    body.update(build_tools(request, tools, build_tool_choice(request.tool_choice) if tools else None))
    if request.prompt_cache:
        body = mark_cache_breakpoints(body)
    return build_extra(body, request.settings)


def build_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The `messages` array: user/assistant turns alternating, tool results in the user turn that follows."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue  # Anthropic rejects empty content; system messages go to `system`
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": blocks})
    for entry in merged:
        if entry["role"] == "user":
            # tool_result blocks must come first in a user message.
            entry["content"].sort(key=lambda b: b.get("type") != "tool_result")
    if merged and merged[-1]["role"] == "assistant":
        # Anthropic reads a last assistant turn as the start of its answer (a prefill), which extended
        # thinking refuses. toolloop never prefills: such a turn is history, e.g. tool results another
        # provider's calls got, flattened to assistant text after a fallback. The model is asked
        # to go on from it.
        merged.append({"role": "user", "content": [{"type": "text", "text": CONTINUE_TEXT}]})
    return merged


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    match message:
        case SystemMessage():
            return "system", []
        case UserMessage(content=content):
            return "user", [{"type": "text", "text": content}] if content else []
        case AssistantMessage():
            return "assistant", _assistant_blocks(message)
        case ToolMessage():
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": clean_tool_id(message.tool_call_id),
                "content": message.content,
            }
            if message.is_error:
                result["is_error"] = True
            return "user", [result]
    raise TypeError(f"not a message: {message!r}")


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.provider == PROVIDER:
        # Signed thinking goes back unchanged and first; thinking from another provider is never sent.
        blocks.extend(_resendable_thinking(message.provider_data.get("thinking_blocks")))
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": clean_tool_id(call.id),
                "name": call.name,
                "input": dict(call.arguments),
            }
        )
    return blocks


def _resendable_thinking(raw: object) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for block in raw if isinstance(raw, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "thinking" and isinstance(block.get("signature"), str) and block["signature"]:
            blocks.append(
                {"type": "thinking", "thinking": block.get("thinking", ""), "signature": block["signature"]}
            )
        elif block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
            blocks.append({"type": "redacted_thinking", "data": block["data"]})
    return blocks


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


_EVENTS = frozenset(
    {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta"}
)


def sniff_body(body: object) -> bool:
    """True for a Messages response."""
    if not isinstance(body, dict):
        return False
    return body.get("type") == "message" or (isinstance(body.get("content"), list) and "stop_reason" in body)


def sniff_event(event_name: str | None, data: object) -> bool:
    """True for a Messages stream event, by its SSE name or its `type`."""
    kind = data.get("type") if isinstance(data, dict) else None
    return bool({event_name, kind if isinstance(kind, str) else None} & _EVENTS)


def sniff_error(body: dict[str, Any]) -> bool:
    """True for Anthropic's typed error envelope (`{"type": "error", "error": {...}}`)."""
    return body.get("type") == "error"
