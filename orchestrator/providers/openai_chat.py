"""OpenAI Chat Completions and every OpenAI-compatible server (vLLM, Groq, DeepSeek, Mistral, xAI, Together,
OpenRouter, Ollama `/v1`, llama.cpp, LM Studio), both ways.

Quirks this module handles: `content` null, "" or absent, or a list of parts (Mistral puts `thinking` parts
there); reasoning in `reasoning_content` (DeepSeek, xAI) or `reasoning` (Groq, vLLM, Ollama `/v1`) goes to
thinking, never text; a `refusal` is the answer's text; tool calls with or without `type` and `index`, with
empty ids (Gemini's compat layer), arguments as a string, an object, "null" or ""; the legacy
`function_call`; finish_reason "stop" next to tool calls. Streams are read by `openai_chat_stream`.

`to_wire` sends the request's `instructions` first, as a `system` message (OpenAI reads it as the developer
message on its reasoning models, and every compatible server knows the role; `developer` is not sent, as
many of them do not), then the model settings, `response_format` for an output schema (`structured`) and
`extra` last. It sends one assistant message holding all its tool calls (arguments as a JSON string; a broken
call's own text verbatim), then one `tool` message per result with its `tool_call_id`. Thinking is never sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    parse_usage,
)
from orchestrator.providers.controls import build_extra
from orchestrator.providers.stream_reader import StreamReader, read_stream_text
from orchestrator.providers.structured import build_json_schema_format
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

PROVIDER = "openai_chat"
CHAT_PATH = "/chat/completions"
_REASONING_FIELDS = ("reasoning_content", "reasoning")
_THINKING_PART_TYPES = frozenset({"thinking", "reasoning"})


# --- response -> Turn ------------------------------------------------------------------------------------


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
        return _read_completion(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Chat Completions response: {exc}")


def _read_completion(response: dict[str, Any], ids: IdSource) -> Turn:
    choices = opt_list(response.get("choices"), "choices")
    if not choices:
        raise MalformedBody("choices", "no choice in the response")
    choice = req_map(choices[0], "choices[0]")
    message = opt_map(choice.get("message"), "choices[0].message")
    text_parts, thinking_parts = _read_content(message.get("content"))
    for name in _REASONING_FIELDS:
        reasoning = message.get(name)
        if isinstance(reasoning, str):
            thinking_parts.append(reasoning)
    refusal = opt_str(message.get("refusal"), "message.refusal")
    calls = [_read_call(req_map(c, f"tool_calls[{i}]"), ids) for i, c in enumerate(_raw_calls(message))]
    return build_turn(
        PROVIDER,
        text=join_text([*text_parts, refusal or ""]),
        thinking=join_thinking(thinking_parts),
        tool_calls=calls,
        usage=_read_usage(response.get("usage")),
        model=opt_str(response.get("model"), "model"),
        finish_reason=parse_finish_reason(choice.get("finish_reason")),
        provider_data=_provider_data(response),
    )


def _read_content(content: object) -> tuple[list[str], list[str]]:
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


def _raw_calls(message: Mapping[str, Any]) -> list[Any]:
    calls = opt_list(message.get("tool_calls"), "message.tool_calls")
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, dict):
        return [{"id": None, "function": legacy}]
    return calls


def _read_call(call: dict[str, Any], ids: IdSource) -> ToolCall:
    function = opt_map(call.get("function"), "tool_call.function")
    return build_tool_call(ids, call.get("id"), function.get("name"), function.get("arguments"))


def _read_usage(raw: object) -> Any:
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


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one `stream: true` response (`openai_chat_stream.ChatStreamReader`)."""
    del request  # the answer reads the same whatever was asked
    # Imported here: the reader module builds on this one's readers of messages and usage.
    from orchestrator.providers.openai_chat_stream import ChatStreamReader

    return ChatStreamReader()


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole `stream: true` body (LF or CRLF), accumulated; errors in the stream as values."""
    return read_stream_text(stream_reader(), text, ids)


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an OpenAI-style error body `{"error": {message, type, param, code}}`."""
    return build_error(PROVIDER, status, body, headers)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Chat Completions function tool (SPEC §3.2)."""
    function: dict[str, Any] = {"name": spec.name, "parameters": dict(spec.parameters)}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def build_tool_choice(choice: str | None) -> str | dict[str, Any] | None:
    """`auto`, `required`, `none` as they are; any other value names the one tool to call."""
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The Chat Completions request body for `request` (pure); with `stream`, one that asks for a stream
    whose last chunk carries the usage."""
    instructions = [{"role": "system", "content": request.instructions}] if request.instructions else []
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [*instructions, *(build_message(m) for m in request.messages)],
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [build_tool_param(t) for t in request.tools]
        choice = build_tool_choice(request.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
        if request.settings.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.settings.parallel_tool_calls
    body.update(build_settings(request))
    if request.output_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": build_json_schema_format(request.output_schema),
        }
    return build_extra(body, request.settings)


def build_settings(request: ModelRequest) -> dict[str, Any]:
    """The body fields of the request's model settings (see `controls`); `max_output_tokens` of the settings
    wins over the request's own."""
    settings = request.settings
    max_tokens = settings.max_output_tokens or request.max_output_tokens
    fields: dict[str, Any] = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_completion_tokens": max_tokens,
        "stop": settings.stop or None,
        "seed": settings.seed,
        "reasoning_effort": settings.reasoning_effort,
    }
    return {k: v for k, v in fields.items() if v is not None}


def build_message(message: Message) -> dict[str, Any]:
    """One canonical message in the Chat Completions format."""
    match message:
        case SystemMessage(content=content):
            return {"role": "system", "content": content}
        case UserMessage(content=content):
            return {"role": "user", "content": content}
        case AssistantMessage():
            return _build_assistant(message)
        case ToolMessage(tool_call_id=call_id, content=content):
            return {"role": "tool", "tool_call_id": call_id, "content": content}
    raise TypeError(f"not a message: {message!r}")


def _build_assistant(message: AssistantMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    if message.tool_calls:
        wire["tool_calls"] = [build_call(c) for c in message.tool_calls]
    elif wire["content"] is None:
        wire["content"] = ""  # an assistant message needs content or tool calls
    return wire


def build_call(call: ToolCall) -> dict[str, Any]:
    """A tool call as sent back: arguments as a JSON string, or the model's own broken text verbatim."""
    arguments = call.raw_arguments if call.arguments_error and call.raw_arguments is not None else None
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": arguments
            if arguments is not None
            else json.dumps(call.arguments, ensure_ascii=False),
        },
    }
