"""AWS Bedrock Converse (`/model/{id}/converse`) normalised into a Turn.

Content blocks: `text`, `toolUse` {toolUseId, name, input}, `reasoningContent` {reasoningText {text,
signature} | redactedContent}; the body carries no model id (it is in the request URL). Signatures and
redacted reasoning are kept in `provider_data["reasoning"]` so they can be re-sent. Errors come as
`{"message": ...}` with the type in the `x-amzn-ErrorType` header (or `__type` in the body).

ConverseStream uses AWS's binary event-stream framing; `from_stream` reads its events once decoded
(what the AWS SDKs yield): one JSON object per line, or a JSON array, of `messageStart`,
`contentBlockStart`, `contentBlockDelta`, `contentBlockStop`, `messageStop`, `metadata`.
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
    parse_usage,
)

PROVIDER = "bedrock"


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one Converse response body; a ProviderError for an error or malformed body."""
    if is_error_body(body) or _is_bedrock_error(body):
        return error_from_wire(None, body)
    try:
        response = req_map(body, "response")
        message = opt_map(opt_map(response.get("output"), "output").get("message"), "output.message")
        blocks = opt_list(message.get("content"), "output.message.content")
        return _build(blocks, response, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Bedrock Converse response: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Bedrock error: `{"message"}` plus `x-amzn-ErrorType`, or `{"__type", ...}`."""
    error = build_error(PROVIDER, status, body, headers)
    if status is None and error.type in _RETRYABLE_EXCEPTIONS:
        return error.model_copy(update={"retryable": True})
    return error


# Bedrock's own names for transient failures (429/500/503/408 when the status is known).
_RETRYABLE_EXCEPTIONS = frozenset(
    {
        "ThrottlingException",
        "InternalServerException",
        "ServiceUnavailableException",
        "ModelNotReadyException",
        "ModelTimeoutException",
    }
)


def _is_bedrock_error(body: object) -> bool:
    return isinstance(body, dict) and "__type" in body and "output" not in body


def _build(blocks: list[Any], response: dict[str, Any], ids: IdSource) -> Turn:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    for index, raw in enumerate(blocks):
        where = f"content[{index}]"
        block = req_map(raw, where)
        if block.get("toolUse") is not None:
            tool_use = req_map(block["toolUse"], f"{where}.toolUse")
            calls.append(
                build_tool_call(
                    ids,
                    opt_str(tool_use.get("toolUseId"), f"{where}.toolUse.toolUseId"),
                    opt_str(tool_use.get("name"), f"{where}.toolUse.name"),
                    tool_use.get("input"),
                )
            )
        elif block.get("reasoningContent") is not None:
            content = req_map(block["reasoningContent"], f"{where}.reasoningContent")
            reasoning_text = opt_map(content.get("reasoningText"), f"{where}.reasoningContent.reasoningText")
            thoughts.append(opt_str(reasoning_text.get("text"), f"{where}.reasoningText.text") or "")
            # Signatures and redacted reasoning are not thinking text, but Bedrock wants them back.
            reasoning.append(content)
        else:
            texts.append(opt_str(block.get("text"), f"{where}.text") or "")
    usage_map = opt_map(response.get("usage"), "usage")
    provider_data: dict[str, Any] = {}
    if reasoning:
        provider_data["reasoning"] = reasoning
    return build_turn(
        PROVIDER,
        text=join_text(texts),
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=parse_usage(
            usage_map,
            cache_read_tokens=usage_map.get("cacheReadInputTokens"),
            cache_write_tokens=usage_map.get("cacheWriteInputTokens"),
        ),
        model=None,
        finish_reason=parse_finish_reason(opt_str(response.get("stopReason"), "stopReason")),
        provider_data=provider_data,
    )


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from decoded ConverseStream events (JSON lines or one JSON array), accumulated."""
    stripped = text.strip()
    events: list[object] = []
    if stripped.startswith("["):
        parsed = decode_json(stripped, PROVIDER)
        if isinstance(parsed, ProviderError):
            return parsed
        events = parsed if isinstance(parsed, list) else [parsed]
    else:
        for line in stripped.splitlines():
            if line.strip():
                event = decode_json(line, PROVIDER)
                if isinstance(event, ProviderError):
                    return event
                events.append(event)
    try:
        return _from_events(events, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Bedrock ConverseStream events: {exc}")


def _from_events(events: list[object], ids: IdSource) -> Turn | ProviderError:
    blocks: dict[int, dict[str, Any]] = {}
    response: dict[str, Any] = {}
    for position, raw in enumerate(events):
        event = req_map(raw, f"event {position}")
        for name, payload in event.items():
            if name.endswith("Exception"):
                return error_from_wire(None, {"__type": name, **opt_map(payload, name)})
            if name == "contentBlockStart":
                start = req_map(payload, name)
                tool_use = opt_map(opt_map(start.get("start"), "start").get("toolUse"), "start.toolUse")
                blocks[_index(start)] = {"toolUse": {**tool_use, "input": ""}}
            elif name == "contentBlockDelta":
                _apply_delta(blocks, req_map(payload, name))
            elif name == "messageStop":
                response["stopReason"] = opt_map(payload, name).get("stopReason")
            elif name == "metadata":
                response["usage"] = opt_map(payload, name).get("usage")
    if "stopReason" not in response:
        return invalid_response(PROVIDER, "Bedrock stream ended before messageStop", retryable=True)
    ordered = [_finish_block(blocks[i]) for i in sorted(blocks)]
    return _build(ordered, response, ids)


def _index(payload: dict[str, Any]) -> int:
    index = payload.get("contentBlockIndex", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 10_000:
        raise MalformedBody("contentBlockIndex", f"expected a small non-negative integer, got {index!r}")
    return index


def _apply_delta(blocks: dict[int, dict[str, Any]], payload: dict[str, Any]) -> None:
    block = blocks.setdefault(_index(payload), {})
    delta = opt_map(payload.get("delta"), "delta")
    if "text" in delta:
        block["text"] = (block.get("text") or "") + (opt_str(delta["text"], "delta.text") or "")
    if "toolUse" in delta:
        tool_use = block.setdefault("toolUse", {"input": ""})
        piece = opt_str(opt_map(delta["toolUse"], "delta.toolUse").get("input"), "delta.toolUse.input")
        tool_use["input"] = (tool_use.get("input") or "") + (piece or "")
    if "reasoningContent" in delta:
        reasoning = opt_map(delta["reasoningContent"], "delta.reasoningContent")
        held = block.setdefault("reasoningContent", {"reasoningText": {"text": ""}})
        text = opt_str(reasoning.get("text"), "delta.reasoningContent.text")
        held["reasoningText"]["text"] += text or ""
        signature = opt_str(reasoning.get("signature"), "delta.reasoningContent.signature")
        if signature:
            held["reasoningText"]["signature"] = signature
        if reasoning.get("redactedContent") is not None:
            held["redactedContent"] = reasoning["redactedContent"]


def _finish_block(block: dict[str, Any]) -> dict[str, Any]:
    tool_use = block.get("toolUse")
    if isinstance(tool_use, dict):
        # Streamed tool input is a JSON string in pieces; the whole is parsed like any arguments string.
        raw = tool_use.get("input")
        return {"toolUse": {**tool_use, "input": raw if raw else "{}"}}
    return block
