"""Anthropic Messages (`POST /v1/messages`), both ways.

A response is a list of content blocks: `text` → text; `thinking` → thinking (its `signature` is not
thinking text); `redacted_thinking` is opaque; `tool_use` → a tool call whose `input` is already an object.
Thinking and redacted-thinking blocks are kept whole, signature included, in
`provider_data["thinking_blocks"]`: Anthropic requires them back, unchanged, ahead of the `tool_use` blocks
of the same assistant turn when thinking is on. Usage counts cache reads and writes apart from input tokens.
Streams accumulate `content_block_start` / `content_block_delta` (`text_delta`, `thinking_delta`,
`signature_delta`, `input_json_delta`) by block index, with usage from `message_start` and `message_delta`.
Errors (`{"type": "error", "error": {...}, "request_id"}`; 529 overloaded) become ProviderErrors.

`to_wire` puts system messages in `system`, every tool result as a `tool_result` block in the user message
right after the assistant's `tool_use`, merges consecutive same-role messages, and never emits a tool id
outside `^[a-zA-Z0-9_-]+$` (the view remaps ids; an id that still is not valid is cleaned here, the same way
on both sides of the pair).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import MalformedBody
from orchestrator.model import (
    AssistantMessage,
    Message,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    Usage,
    UserMessage,
)
from orchestrator.providers.body import (
    build_error,
    decode_json,
    invalid_response,
    is_error_body,
    opt_list,
    opt_map,
    opt_str,
    req_map,
)
from orchestrator.providers.common import (
    IdSource,
    build_tool_call,
    build_turn,
    join_text,
    join_thinking,
    parse_finish_reason,
    parse_sse,
    parse_usage,
)
from orchestrator.providers.traits import traits_of
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

PROVIDER = "anthropic"
MESSAGES_PATH = "/v1/messages"
API_VERSION = "2023-06-01"
# Anthropic requires max_tokens on every request.
DEFAULT_MAX_TOKENS = 4096


# --- response -> Turn ------------------------------------------------------------------------------------


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one Messages API response body; a ProviderError for an error or malformed body."""
    if isinstance(body, str | bytes):
        decoded = decode_json(body.decode("utf-8", "replace") if isinstance(body, bytes) else body, PROVIDER)
        if isinstance(decoded, ProviderError):
            return decoded
        body = decoded
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        return _read_message(req_map(body, "message"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Anthropic response: {exc}")


def _read_message(message: dict[str, Any], ids: IdSource) -> Turn:
    text: list[str] = []
    thinking: list[str] = []
    kept: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for i, raw in enumerate(opt_list(message.get("content"), "content")):
        block = req_map(raw, f"content[{i}]")
        kind = block.get("type")
        if kind == "text":
            text.append(opt_str(block.get("text"), f"content[{i}].text") or "")
        elif kind == "thinking":
            thinking.append(opt_str(block.get("thinking"), f"content[{i}].thinking") or "")
            kept.append(block)
        elif kind == "redacted_thinking":
            kept.append(block)
        elif kind == "tool_use":
            calls.append(build_tool_call(ids, block.get("id"), block.get("name"), block.get("input")))
    provider_data: dict[str, Any] = {}
    if isinstance(message.get("id"), str):
        provider_data["message_id"] = message["id"]
    if kept:
        provider_data["thinking_blocks"] = kept
    return build_turn(
        PROVIDER,
        text=join_text(text),
        thinking=join_thinking(thinking),
        tool_calls=calls,
        usage=_read_usage(message.get("usage")),
        model=opt_str(message.get("model"), "model"),
        finish_reason=parse_finish_reason(message.get("stop_reason")),
        provider_data=provider_data,
    )


def _read_usage(raw: object) -> Usage:
    usage = raw if isinstance(raw, dict) else {}
    return parse_usage(
        usage,
        cache_read_tokens=usage.get("cache_read_input_tokens"),
        cache_write_tokens=usage.get("cache_creation_input_tokens"),
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


@dataclass
class _Accumulator:
    message: dict[str, Any] = field(default_factory=dict)
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial_json: dict[int, str] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = dict(req_map(event.get("message"), "message_start.message"))
            self.usage.update(opt_map(self.message.get("usage"), "message_start.usage"))
        elif kind == "content_block_start":
            self.blocks[self._index(event)] = dict(req_map(event.get("content_block"), "content_block"))
        elif kind == "content_block_delta":
            self._add_delta(self._index(event), req_map(event.get("delta"), "content_block_delta.delta"))
        elif kind == "message_delta":
            delta = opt_map(event.get("delta"), "message_delta.delta")
            if delta.get("stop_reason") is not None:
                self.message["stop_reason"] = delta["stop_reason"]
            # message_delta carries cumulative counts: they replace those of message_start.
            self.usage.update(
                {k: v for k, v in opt_map(event.get("usage"), "usage").items() if v is not None}
            )
        elif kind == "message_stop":
            self.stopped = True

    @staticmethod
    def _index(event: Mapping[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise MalformedBody(f"{event.get('type')}.index", "expected an integer")
        return index

    def _add_delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        for delta_type, key in (
            ("text_delta", "text"),
            ("thinking_delta", "thinking"),
            ("signature_delta", "signature"),
        ):
            if kind == delta_type:
                block[key] = str(block.get(key) or "") + (opt_str(delta.get(key), f"{kind}.{key}") or "")
        if kind == "input_json_delta":
            piece = opt_str(delta.get("partial_json"), "input_json_delta.partial_json") or ""
            self.partial_json[index] = self.partial_json.get(index, "") + piece

    def body(self) -> dict[str, Any]:
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if block.get("type") == "tool_use" and self.partial_json.get(index, "").strip():
                # A JSON string parses like an object downstream; a broken one is kept per call.
                block["input"] = self.partial_json[index]
            content.append(block)
        return {**self.message, "content": content, "usage": self.usage}


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole Messages API event stream (LF or CRLF), accumulated."""
    accumulator = _Accumulator()
    try:
        for event in parse_sse(text):
            data = event.data.strip()
            if not data:
                continue
            decoded = decode_json(data, PROVIDER)
            if isinstance(decoded, ProviderError):
                return decoded
            payload = req_map(decoded, "stream event")
            if payload.get("type") == "error" or event.event == "error":
                return error_from_wire(None, payload)
            accumulator.add(payload)
        if not accumulator.stopped:
            return invalid_response(PROVIDER, "Anthropic stream ended before message_stop", retryable=True)
        return _read_message(accumulator.body(), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Anthropic stream: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from `{"type": "error", "error": {type, message}, "request_id"}` (or `request-id`)."""
    return build_error(PROVIDER, status, body, headers)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as an Anthropic tool (SPEC §3.2): name, description, input_schema."""
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


def to_wire(request: ModelRequest) -> dict[str, Any]:
    """The Messages API request body for `request` (pure)."""
    system = [m.content for m in request.messages if isinstance(m, SystemMessage) and m.content]
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_output_tokens or DEFAULT_MAX_TOKENS,
        "messages": build_messages(request.messages),
    }
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [build_tool_param(t) for t in request.tools]
        choice = build_tool_choice(request.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
    return body


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
