"""Bodies that are not a provider response: a bare assistant message, a bare list of tool calls, or a
Turn already normalised, e.g. the JSON `toolloop normalize` prints, read back.

A bare message is OpenAI-shaped (`role`, `content` as a string or a list of text parts, `tool_calls`,
reasoning under `reasoning_content` / `reasoning` / `thinking`). A tool call in a bare list may be
written the OpenAI way (`{"id", "function": {"name", "arguments"}}`), flat (`{"id", "name",
"arguments"}`), the Anthropic way (`{"id", "name", "input"}`), the Gemini way (`{"name", "args"}`) or
the Bedrock way (`{"toolUseId", "name", "input"}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
from orchestrator.providers.body import (
    build_error,
    invalid_response,
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

PROVIDER = "bare"

_ID_KEYS = ("id", "call_id", "toolUseId", "tool_call_id")
_ARGUMENT_KEYS = ("arguments", "args", "input", "parameters")
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a bare message map, a bare list of tool calls, or a normalised Turn's JSON."""
    source = ids or IdSource()
    try:
        if isinstance(body, list):
            return from_tool_calls(body, ids=source)
        data = req_map(body, "body")
        if data.get("type") in ("tool_calls", "final_answer"):
            return from_turn_json(data, ids=source)
        return from_message(data, ids=source)
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed message: {exc}")


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """Bare bodies are never streamed: a stream handed here is not one of them."""
    return invalid_response(PROVIDER, "a bare message or tool-call list has no stream form")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an error body of an unknown provider, read by the common envelopes."""
    return build_error(PROVIDER, status, body, headers)


def from_tool_calls(calls: list[Any], *, ids: IdSource | None = None) -> Turn:
    """A tool_calls Turn from a bare list of calls (an empty list is a final answer with no text)."""
    source = ids or IdSource()
    parsed = [read_tool_call(req_map(raw, f"tool_calls[{i}]"), source) for i, raw in enumerate(calls)]
    return build_turn(
        PROVIDER,
        text=None,
        thinking=None,
        tool_calls=parsed,
        usage=parse_usage(None),
        model=None,
        finish_reason=None,
    )


def from_message(message: dict[str, Any], *, ids: IdSource | None = None) -> Turn:
    """A Turn from one assistant message map (OpenAI-shaped, the most common bare form)."""
    source = ids or IdSource()
    role = opt_str(message.get("role"), "role")
    if role not in (None, "assistant", "model"):
        raise MalformedBody("role", f"a {role!r} message is not a model response")
    calls = [
        read_tool_call(req_map(raw, f"tool_calls[{i}]"), source)
        for i, raw in enumerate(opt_list(message.get("tool_calls"), "tool_calls"))
    ]
    thoughts = [opt_str(message.get(key), key) or "" for key in _REASONING_KEYS]
    refusal = opt_str(message.get("refusal"), "refusal")
    return build_turn(
        PROVIDER,
        text=_read_content(message.get("content")) or refusal,
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=parse_usage(message.get("usage")),
        model=opt_str(message.get("model"), "model"),
        finish_reason=parse_finish_reason(opt_str(message.get("finish_reason"), "finish_reason")),
    )


def _read_content(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    parts: list[str] = []
    for index, raw in enumerate(opt_list(content, "content")):
        if isinstance(raw, str):
            parts.append(raw)
            continue
        part = req_map(raw, f"content[{index}]")
        if part.get("type") in (None, "text", "output_text"):
            parts.append(opt_str(part.get("text"), f"content[{index}].text") or "")
    return join_text(parts)


def read_tool_call(call: dict[str, Any], ids: IdSource) -> ToolCall:
    """One tool call in any of the usual shapes (see the module docstring)."""
    function = opt_map(call.get("function"), "function") if isinstance(call.get("function"), dict) else {}
    source = function or call
    name = opt_str(source.get("name"), "name")
    provider_id = next((call[k] for k in _ID_KEYS if isinstance(call.get(k), str) and call[k]), None)
    arguments = next((source[k] for k in _ARGUMENT_KEYS if k in source), None)
    if call.get("arguments_error") and isinstance(call.get("raw_arguments"), str):
        # A normalised call whose arguments were broken: re-read the provider's text to keep the error.
        arguments = call["raw_arguments"]
    return build_tool_call(ids, provider_id, name, arguments)


def from_turn_json(data: dict[str, Any], *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from normalised JSON (ours, or `toolloop normalize`'s output), re-checked by the same rules.

    `type` is recomputed from the calls and every call goes through the same id, name and argument
    rules, so a hand-edited or foreign Turn cannot smuggle in an empty id or a non-object argument.
    """
    source = ids or IdSource()
    calls = [
        read_tool_call(req_map(raw, f"tool_calls[{i}]"), source)
        for i, raw in enumerate(opt_list(data.get("tool_calls"), "tool_calls"))
    ]
    try:
        checked = Turn.model_validate({**data, "tool_calls": []})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "turn"
        return invalid_response(PROVIDER, f"malformed normalised turn: {where}: {first['msg']}")
    return build_turn(
        checked.provider or PROVIDER,
        text=checked.text,
        thinking=checked.thinking,
        tool_calls=calls,
        usage=checked.usage,
        model=checked.model,
        finish_reason=checked.finish_reason,
        provider_data=checked.provider_data,
    )


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


def sniff_body(body: object) -> bool:
    """True for a bare message, list of tool calls or toolloop Turn: the last resort of detection."""
    if isinstance(body, list):
        return True
    if not isinstance(body, dict):
        return False
    return body.get("type") in ("tool_calls", "final_answer") or bool(
        body.keys() & {"role", "tool_calls", "content"}
    )


def sniff_event(event_name: str | None, data: object) -> bool:
    """Never: a bare body is not a stream."""
    del event_name, data
    return False


def sniff_error(body: dict[str, Any]) -> bool:
    """Any error body no format claims."""
    del body
    return True
