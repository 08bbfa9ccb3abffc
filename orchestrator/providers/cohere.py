"""Cohere v2 `/v2/chat`, whole or as its SSE stream, normalised into a Turn.

`message.tool_plan` is the visible sentence a model writes before its tool calls ("I will use the
currentTime tool…"): it is the answer's text, as `expected.json` judges it, and is also kept in
`provider_data["tool_plan"]` because Cohere wants it back in its own field. `content[]` holds `text`
and, for reasoning models, `thinking` blocks. Arguments are a JSON string, sometimes `"null"`. Usage
is `usage.tokens` (what the model read and wrote), not `billed_units`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
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

PROVIDER = "cohere"


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one v2 chat response; a ProviderError for an error or malformed body."""
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        response = req_map(body, "response")
        return _build(opt_map(response.get("message"), "message"), response, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Cohere response: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Cohere error body: `{"id": ..., "message": ...}`."""
    return build_error(PROVIDER, status, body, headers)


def _build(message: dict[str, Any], response: dict[str, Any], ids: IdSource) -> Turn:
    texts: list[str] = []
    thoughts: list[str] = []
    tool_plan = opt_str(message.get("tool_plan"), "message.tool_plan")
    if tool_plan:
        texts.append(tool_plan)
    for index, raw in enumerate(opt_list(message.get("content"), "message.content")):
        block = req_map(raw, f"message.content[{index}]")
        if block.get("type") == "thinking":
            thoughts.append(opt_str(block.get("thinking"), f"message.content[{index}].thinking") or "")
        else:
            texts.append(opt_str(block.get("text"), f"message.content[{index}].text") or "")
    calls = [
        _read_tool_call(req_map(raw, f"message.tool_calls[{i}]"), ids)
        for i, raw in enumerate(opt_list(message.get("tool_calls"), "message.tool_calls"))
    ]
    usage = opt_map(response.get("usage"), "usage")
    counts = usage.get("tokens") if usage.get("tokens") is not None else usage.get("billed_units")
    provider_data: dict[str, Any] = {}
    if tool_plan:
        provider_data["tool_plan"] = tool_plan
    response_id = opt_str(response.get("id"), "id")
    if response_id:
        provider_data["response_id"] = response_id
    return build_turn(
        PROVIDER,
        # The plan and the text blocks are separate sentences; a blank line keeps them apart.
        text=join_text(texts, "\n\n"),
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=parse_usage(opt_map(counts, "usage.tokens"), cache_read_tokens=usage.get("cached_tokens")),
        model=opt_str(response.get("model"), "model"),
        finish_reason=parse_finish_reason(opt_str(response.get("finish_reason"), "finish_reason")),
        provider_data=provider_data,
    )


def _read_tool_call(tool_call: dict[str, Any], ids: IdSource) -> ToolCall:
    function = opt_map(tool_call.get("function"), "tool_call.function")
    return build_tool_call(
        ids,
        opt_str(tool_call.get("id"), "tool_call.id"),
        opt_str(function.get("name"), "tool_call.function.name"),
        function.get("arguments"),
    )


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole v2 chat SSE stream (`message-start` … `message-end`), accumulated."""
    events: list[dict[str, Any]] = []
    for event in parse_sse(text):
        data = event.data.strip()
        if not data or data == "[DONE]":
            continue
        parsed = decode_json(data, PROVIDER)
        if isinstance(parsed, ProviderError):
            return parsed
        if is_error_body(parsed):
            return error_from_wire(None, parsed)
        if not isinstance(parsed, dict):
            return invalid_response(PROVIDER, "malformed Cohere stream: an event is not an object")
        events.append(parsed)
    try:
        return _from_events(events, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Cohere stream: {exc}")


def _from_events(events: list[dict[str, Any]], ids: IdSource) -> Turn | ProviderError:
    response: dict[str, Any] = {}
    tool_plan: list[str] = []
    content: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        kind = event.get("type")
        message = opt_map(opt_map(event.get("delta"), "delta").get("message"), "delta.message")
        index = _index(event.get("index"))
        if kind == "message-start":
            response["id"] = event.get("id")
        elif kind == "tool-plan-delta":
            tool_plan.append(opt_str(message.get("tool_plan"), "delta.message.tool_plan") or "")
        elif kind in ("content-start", "content-delta"):
            _add_content(content.setdefault(index, {}), opt_map(message.get("content"), "content"))
        elif kind in ("tool-call-start", "tool-call-delta"):
            _add_tool_call(calls.setdefault(index, {}), opt_map(message.get("tool_calls"), "tool_calls"))
        elif kind == "message-end":
            delta = opt_map(event.get("delta"), "delta")
            response["finish_reason"] = delta.get("finish_reason")
            response["usage"] = delta.get("usage")
    if "finish_reason" not in response:
        return invalid_response(PROVIDER, "Cohere stream ended before message-end", retryable=True)
    message = {
        "tool_plan": "".join(tool_plan),
        "content": [content[i] for i in sorted(content)],
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
    return _build(message, response, ids)


def _index(value: object) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 10_000:
        raise MalformedBody("index", f"expected a small non-negative integer, got {value!r}")
    return value


def _add_content(block: dict[str, Any], piece: dict[str, Any]) -> None:
    if piece.get("type"):
        block["type"] = piece["type"]
    for key in ("text", "thinking"):
        fragment = opt_str(piece.get(key), f"content.{key}")
        if fragment is not None:
            block[key] = (block.get(key) or "") + fragment


def _add_tool_call(call: dict[str, Any], piece: dict[str, Any]) -> None:
    for key in ("id", "type"):
        if piece.get(key) is not None:
            call[key] = piece[key]
    function = opt_map(piece.get("function"), "tool_calls.function")
    held = call.setdefault("function", {})
    if function.get("name") is not None:
        held["name"] = function["name"]
    fragment = opt_str(function.get("arguments"), "tool_calls.function.arguments")
    if fragment is not None:
        held["arguments"] = (held.get("arguments") or "") + fragment
