"""A Chat Completions response read into a Turn: the readers of whole completions, message content, tool
calls and usage that `openai_chat` applies to a response body and `openai_chat_stream` to each chunk.

Quirks read here: `content` null, "" or absent, or a list of parts (Mistral puts `thinking` parts there);
reasoning in `reasoning_content` (DeepSeek, xAI) or `reasoning` (Groq, vLLM, Ollama `/v1`) goes to
thinking, never text; a `refusal` is the answer's text; tool calls with or without `type` and `index`, with
empty ids (Gemini's compat layer), arguments as a string, an object, "null" or ""; the legacy
`function_call`; finish_reason "stop" next to tool calls.
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

PROVIDER = "openai_chat"
# Where compatible servers put reasoning, in a message or a stream's delta.
REASONING_FIELDS = ("reasoning_content", "reasoning")
_THINKING_PART_TYPES = frozenset({"thinking", "reasoning"})


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one Chat Completions response body; a ProviderError for an error or malformed body."""
    if isinstance(body, str | bytes):
        decoded = decode_json(body.decode("utf-8", "replace") if isinstance(body, bytes) else body, PROVIDER)
        if isinstance(decoded, ProviderError):
            return decoded
        body = decoded
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        return parse_completion(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Chat Completions response: {exc}")


def parse_completion(response: dict[str, Any], ids: IdSource) -> Turn:
    """A Turn from one Chat Completions response object; `MalformedBody` for a field of the wrong shape."""
    choices = opt_list(response.get("choices"), "choices")
    if not choices:
        raise MalformedBody("choices", "no choice in the response")
    choice = req_map(choices[0], "choices[0]")
    message = opt_map(choice.get("message"), "choices[0].message")
    text_parts, thinking_parts = parse_content(message.get("content"))
    for name in REASONING_FIELDS:
        reasoning = message.get(name)
        if isinstance(reasoning, str):
            thinking_parts.append(reasoning)
    refusal = opt_str(message.get("refusal"), "message.refusal")
    calls = [_read_call(req_map(c, f"tool_calls[{i}]"), ids) for i, c in enumerate(parse_raw_calls(message))]
    return build_turn(
        PROVIDER,
        text=join_text([*text_parts, refusal or ""]),
        thinking=join_thinking(thinking_parts),
        tool_calls=calls,
        usage=parse_chat_usage(response.get("usage")),
        model=opt_str(response.get("model"), "model"),
        finish_reason=parse_finish_reason(choice.get("finish_reason")),
        provider_data=_provider_data(response),
    )


def parse_content(content: object) -> tuple[list[str], list[str]]:
    """Visible text parts and thinking parts of a message's `content` (a string, a list of parts, or null)."""
    if content is None or isinstance(content, str):
        return ([content] if content else []), []
    text: list[str] = []
    thinking: list[str] = []
    for i, raw in enumerate(opt_list(content, "message.content")):
        part = req_map(raw, f"message.content[{i}]")
        kind = opt_str(part.get("type"), f"message.content[{i}].type")
        if kind in _THINKING_PART_TYPES:
            thinking.extend(_nested_text(part.get(str(kind))))
        elif kind in ("text", "output_text", None):
            text.append(opt_str(part.get("text"), f"message.content[{i}].text") or "")
        elif kind == "refusal":
            text.append(opt_str(part.get("refusal"), f"message.content[{i}].refusal") or "")
    return text, thinking


def _nested_text(value: object) -> list[str]:
    # Mistral: {"type": "thinking", "thinking": [{"type": "text", "text": "..."}]}; others: a plain string.
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def parse_raw_calls(message: Mapping[str, Any]) -> list[Any]:
    """The tool calls of a message (or a stream's delta) as sent: `tool_calls`, else the legacy
    `function_call` as the one call."""
    calls = opt_list(message.get("tool_calls"), "message.tool_calls")
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, dict):
        return [{"id": None, "function": legacy}]
    return calls


def _read_call(call: dict[str, Any], ids: IdSource) -> ToolCall:
    function = opt_map(call.get("function"), "tool_call.function")
    return build_tool_call(ids, call.get("id"), function.get("name"), function.get("arguments"))


def parse_chat_usage(raw: object) -> Usage:
    """The Usage of a `usage` object (absent or malformed: zeros), with reasoning and cached tokens."""
    usage = raw if isinstance(raw, dict) else {}
    completion = usage.get("completion_tokens_details")
    prompt = usage.get("prompt_tokens_details")
    return parse_usage(
        usage,
        reasoning_tokens=completion.get("reasoning_tokens") if isinstance(completion, dict) else None,
        cache_read_tokens=prompt.get("cached_tokens") if isinstance(prompt, dict) else None,
        cache_write_tokens=prompt.get("cache_write_tokens") if isinstance(prompt, dict) else None,
    )


def _provider_data(response: Mapping[str, Any]) -> dict[str, Any]:
    response_id = response.get("id")
    return {"response_id": response_id} if isinstance(response_id, str) and response_id else {}


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an OpenAI-style error body `{"error": {message, type, param, code}}`."""
    return build_error(PROVIDER, status, body, headers)
