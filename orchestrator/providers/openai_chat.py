"""OpenAI Chat Completions and every OpenAI-compatible server (vLLM, Groq, DeepSeek, Mistral, xAI, Together,
OpenRouter, Ollama `/v1`, llama.cpp, LM Studio), both ways: the provider's profile, the one module the
registry knows it by. Responses and errors are read by `openai_chat_response` (with the compatible servers'
quirks), streams by `openai_chat_stream`; both modules sit below this one, which gathers them.

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
from orchestrator.providers.body import is_error_body
from orchestrator.providers.common import IdSource
from orchestrator.providers.controls import build_extra
from orchestrator.providers.openai_chat_response import PROVIDER, error_from_wire, from_wire
from orchestrator.providers.openai_chat_stream import ChatStreamReader
from orchestrator.providers.rate_limits import (
    RateLimitSignal,
    parse_duration_s,
    parse_retry_after,
    parse_whole,
    read_header,
)
from orchestrator.providers.stream_reader import StreamReader, read_stream_text
from orchestrator.providers.structured import build_json_schema_format
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "CHAT_PATH",
    "PROVIDER",
    "build_call",
    "build_message",
    "build_settings",
    "build_tool_choice",
    "build_tool_param",
    "build_url",
    "error_from_wire",
    "from_stream",
    "from_wire",
    "parse_rate_limits",
    "stream_reader",
    "to_wire",
]

CHAT_PATH = "/chat/completions"


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """The URL of one Chat Completions call: one for every model, streamed or not (the body says which)."""
    del model, stream  # the model and streaming travel in the body
    return f"{base_url}{CHAT_PATH}"


# --- rate limits -----------------------------------------------------------------------------------------


def parse_rate_limits(status: int | None, headers: Mapping[str, str], now: float) -> RateLimitSignal:
    """OpenAI's rate-limit headers, which the compatible servers that limit (Groq, Together, vLLM behind a
    gateway) copy: `x-ratelimit-remaining-requests` / `-tokens` and `x-ratelimit-reset-requests` / `-tokens`
    as a duration (`6m0s`, `1s`, `20ms`), `retry-after` (seconds) or `retry-after-ms`; a 429 is a refusal.
    `now` is unused: OpenAI states resets as durations."""
    del now
    retry_after_s = parse_retry_after(read_header(headers, "retry-after"))
    if retry_after_s is None and (millis := parse_retry_after(read_header(headers, "retry-after-ms"))):
        retry_after_s = millis / 1000.0
    return RateLimitSignal(
        refused=status == 429,
        retry_after_s=retry_after_s,
        requests_remaining=parse_whole(read_header(headers, "x-ratelimit-remaining-requests")),
        requests_reset_s=parse_duration_s(read_header(headers, "x-ratelimit-reset-requests")),
        tokens_remaining=parse_whole(read_header(headers, "x-ratelimit-remaining-tokens")),
        tokens_reset_s=parse_duration_s(read_header(headers, "x-ratelimit-reset-tokens")),
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one `stream: true` response (`openai_chat_stream.ChatStreamReader`)."""
    del request  # the answer reads the same whatever was asked
    return ChatStreamReader()


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole `stream: true` body (LF or CRLF), accumulated; errors in the stream as values."""
    return read_stream_text(stream_reader(), text, ids)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Chat Completions function tool."""
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


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


def sniff_body(body: object) -> bool:
    """True for a Chat Completions response."""
    return isinstance(body, dict) and "choices" in body


def sniff_event(event_name: str | None, data: object) -> bool:
    """True for a Chat Completions stream chunk."""
    del event_name  # chunks are unnamed
    if not isinstance(data, dict) or is_error_body(data):
        return False
    return "choices" in data or data.get("object") == "chat.completion.chunk"


def sniff_error(body: dict[str, Any]) -> bool:
    """True for OpenAI's error envelope (`{"error": {...}}`), the shape most compatible servers copy: the
    fallback for an error object no other format claims (Anthropic's is typed, Google's has a word status)."""
    error = body.get("error")
    return (
        isinstance(error, dict) and body.get("type") != "error" and not isinstance(error.get("status"), str)
    )
