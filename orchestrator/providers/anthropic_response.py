"""An Anthropic Messages response (`POST /v1/messages`) read into a Turn: the reader of whole messages that
`anthropic` applies to a response body and `anthropic_stream` to the message its events built.

A response is a list of content blocks: `text` → text; `thinking` → thinking (its `signature` is not
thinking text); `redacted_thinking` is opaque; `tool_use` → a tool call whose `input` is already an object.
Thinking and redacted-thinking blocks are kept whole, signature included, in
`provider_data["thinking_blocks"]`: Anthropic requires them back, unchanged, ahead of the `tool_use` blocks
of the same assistant turn when thinking is on. Usage counts cache reads and writes apart from input tokens.
Errors (`{"type": "error", "error": {...}, "request_id"}`; 529 overloaded) become ProviderErrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn, Usage
from orchestrator.providers.body import (
    build_error,
    decode_json,
    invalid_response,
    is_error_body,
    opt_list,
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
    parse_usage,
)

PROVIDER = "anthropic"


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
        return parse_message(req_map(body, "message"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Anthropic response: {exc}")


def parse_message(message: dict[str, Any], ids: IdSource) -> Turn:
    """A Turn from one Messages API message object; `MalformedBody` for a field of the wrong shape."""
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
    parsed = parse_usage(
        usage,
        cache_read_tokens=usage.get("cache_read_input_tokens"),
        cache_write_tokens=usage.get("cache_creation_input_tokens"),
    )
    # Anthropic's input_tokens leave out the cache reads and writes it reports beside them; the total counts
    # every token the call processed, as OpenAI's does (a token budget must see a cached prefix too).
    cached = (parsed.cache_read_tokens or 0) + (parsed.cache_write_tokens or 0)
    return parsed.model_copy(update={"total_tokens": parsed.total_tokens + cached}) if cached else parsed


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from `{"type": "error", "error": {type, message}, "request_id"}` (or `request-id`)."""
    return build_error(PROVIDER, status, body, headers)
