"""OpenAI Chat Completions and every OpenAI-compatible server (vLLM, Groq, DeepSeek, Mistral, xAI, Together,
OpenRouter, Ollama `/v1`, llama.cpp, LM Studio), both ways.

Quirks this module handles: `content` null, "" or absent, or a list of parts (Mistral puts `thinking` parts
there); reasoning in `reasoning_content` (DeepSeek, xAI) or `reasoning` (Groq, vLLM, Ollama `/v1`) goes to
thinking, never text; a `refusal` is the answer's text; tool calls with or without `type` and `index`, with
empty ids (Gemini's compat layer), arguments as a string, an object, "null" or ""; the legacy
`function_call`; finish_reason "stop" next to tool calls. Streams accumulate tool-call deltas by `index` and
take usage from the final usage chunk.

`to_wire` sends one assistant message holding all its tool calls (arguments as a JSON string; a broken
call's own text verbatim), then one `tool` message per result with its `tool_call_id`. Thinking is never sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    )


def _provider_data(response: Mapping[str, Any]) -> dict[str, Any]:
    response_id = response.get("id")
    return {"response_id": response_id} if isinstance(response_id, str) and response_id else {}


# --- stream -> Turn --------------------------------------------------------------------------------------


@dataclass
class _CallDelta:
    id: str = ""
    name: str = ""
    arguments: str = ""
    arguments_object: object = None


@dataclass
class _Accumulator:
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _CallDelta] = field(default_factory=dict)
    finish_reason: object = None
    usage: object = None
    model: str | None = None
    response_id: str | None = None

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        self.model = self.model or opt_str(chunk.get("model"), "chunk.model")
        self.response_id = self.response_id or opt_str(chunk.get("id"), "chunk.id")
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for raw in opt_list(chunk.get("choices"), "chunk.choices"):
            choice = req_map(raw, "chunk.choices[]")
            if choice.get("index", 0) != 0:
                continue
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            self.add_delta(opt_map(choice.get("delta"), "chunk.delta"))

    def add_delta(self, delta: dict[str, Any]) -> None:
        text, thinking = _read_content(delta.get("content"))
        self.text += text
        self.thinking += thinking
        for name in _REASONING_FIELDS:
            if isinstance(delta.get(name), str):
                self.thinking.append(delta[name])
        self.refusal.append(opt_str(delta.get("refusal"), "delta.refusal") or "")
        for raw in _raw_calls(delta):
            self.add_call_delta(req_map(raw, "delta.tool_calls[]"))

    def add_call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = self._index_without_index(delta.get("id"))
        call = self.calls.setdefault(index, _CallDelta())
        call_id = delta.get("id")
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = opt_map(delta.get("function"), "delta.function")
        name = opt_str(function.get("name"), "delta.function.name") or ""
        # Some servers repeat the whole name in every delta; OpenAI sends it once.
        if name and name != call.name:
            call.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments += arguments
        elif arguments is not None:
            call.arguments_object = arguments

    def _index_without_index(self, call_id: object) -> int:
        # Servers that omit `index` start a call with its id and continue the last one without.
        if isinstance(call_id, str) and call_id:
            known = [i for i, c in self.calls.items() if c.id == call_id]
            return known[0] if known else len(self.calls)
        return max(self.calls, default=0)

    def build(self, ids: IdSource) -> Turn:
        calls = [
            build_tool_call(
                ids, c.id, c.name, c.arguments_object if c.arguments_object is not None else c.arguments
            )
            for _, c in sorted(self.calls.items())
        ]
        return build_turn(
            PROVIDER,
            text=join_text([*self.text, *self.refusal]),
            thinking=join_thinking(["".join(self.thinking)]),
            tool_calls=calls,
            usage=_read_usage(self.usage),
            model=self.model,
            finish_reason=parse_finish_reason(self.finish_reason),
            provider_data={"response_id": self.response_id} if self.response_id else {},
        )


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole `stream: true` body (LF or CRLF), accumulated; errors in the stream as values."""
    accumulator = _Accumulator()
    seen_chunk = False
    try:
        for event in parse_sse(text):
            data = event.data.strip()
            if not data or data == "[DONE]":
                continue
            chunk = decode_json(data, PROVIDER)
            if isinstance(chunk, ProviderError):
                return chunk
            if is_error_body(chunk) or event.event == "error":
                return error_from_wire(None, chunk)
            accumulator.add_chunk(req_map(chunk, "stream chunk"))
            seen_chunk = True
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Chat Completions stream: {exc}")
    if not seen_chunk:
        return invalid_response(PROVIDER, "empty Chat Completions stream: no chunk", retryable=True)
    return accumulator.build(ids or IdSource())


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


def to_wire(request: ModelRequest) -> dict[str, Any]:
    """The Chat Completions request body for `request` (pure)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [build_message(m) for m in request.messages],
    }
    if request.tools:
        body["tools"] = [build_tool_param(t) for t in request.tools]
        choice = build_tool_choice(request.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    return body


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
