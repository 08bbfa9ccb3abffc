"""The OpenAI Responses API (`POST /v1/responses`), both ways: the provider's profile, the one module the
registry knows it by. Responses and errors are read by `openai_responses_response`, event streams by
`openai_responses_stream`; both modules sit below this one, which gathers them.

`to_wire` sends the whole canonical history as input items (function_call + function_call_output pairs),
statelessly: no `previous_response_id`, so a request never depends on server-side state that may have expired
or be disabled (`store: false`). The response id stays in `provider_data["response_id"]` for reference; the
reasoning items of an assistant message are re-sent before its calls, and only when that message came from
this provider. The request's `instructions` go in `instructions`, its settings in their fields (`reasoning.
effort` for `reasoning_effort`), an output schema in `text.format` (`structured`), and `extra` last.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
from orchestrator.providers.common import IdSource
from orchestrator.providers.controls import build_extra
from orchestrator.providers.openai_chat import parse_rate_limits
from orchestrator.providers.openai_responses_response import PROVIDER, error_from_wire, from_wire
from orchestrator.providers.openai_responses_stream import ResponsesStreamReader
from orchestrator.providers.stream_reader import StreamReader, read_stream_text
from orchestrator.providers.structured import build_json_schema_format
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "PROVIDER",
    "RESPONSES_PATH",
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

RESPONSES_PATH = "/responses"


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """The URL of one Responses API call: the same for every model, streamed or not (the body says which)."""
    del model, stream  # the model and streaming travel in the body
    return f"{base_url}{RESPONSES_PATH}"


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one streamed response (`openai_responses_stream.ResponsesStreamReader`)."""
    del request  # the answer reads the same whatever was asked
    return ResponsesStreamReader()


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole Responses API event stream (LF or CRLF), accumulated."""
    return read_stream_text(stream_reader(), text, ids)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Responses API function tool: flat, not nested under `function`."""
    tool: dict[str, Any] = {
        "type": "function",
        "name": spec.name,
        "parameters": dict(spec.parameters),
        # Strict mode demands every property be required and no extra ones: not what pydantic schemas say.
        "strict": False,
    }
    if spec.description:
        tool["description"] = spec.description
    return tool


def build_tool_choice(choice: str | None) -> str | dict[str, Any] | None:
    """`auto`, `required`, `none` as they are; any other value names the one function to call."""
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "name": choice}


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The Responses API request body for `request` (pure, stateless: the whole history as input items);
    with `stream`, one that asks for an event stream."""
    body: dict[str, Any] = {"model": request.model, "input": build_input(request.messages)}
    if request.instructions:
        body["instructions"] = request.instructions
    if stream:
        body["stream"] = True
    if request.tools:
        body["tools"] = [build_tool_param(t) for t in request.tools]
        choice = build_tool_choice(request.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
        if request.settings.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.settings.parallel_tool_calls
    body.update(build_settings(request))
    if request.output_schema is not None:
        body["text"] = {"format": {"type": "json_schema", **build_json_schema_format(request.output_schema)}}
    return build_extra(body, request.settings)


def build_settings(request: ModelRequest) -> dict[str, Any]:
    """The body fields of the request's model settings (see `controls`: `stop` and `seed` are refused at
    submit, the Responses API has neither); `max_output_tokens` of the settings wins over the request's."""
    settings = request.settings
    fields: dict[str, Any] = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_output_tokens": settings.max_output_tokens or request.max_output_tokens,
    }
    if settings.reasoning_effort is not None:
        fields["reasoning"] = {"effort": settings.reasoning_effort}
    return {k: v for k, v in fields.items() if v is not None}


def build_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The input items for a canonical history, in order."""
    items: list[dict[str, Any]] = []
    for message in messages:
        items.extend(_build_items(message))
    return items


def _build_items(message: Message) -> list[dict[str, Any]]:
    match message:
        case SystemMessage(content=content):
            return [{"type": "message", "role": "system", "content": content}]
        case UserMessage(content=content):
            return [{"type": "message", "role": "user", "content": content}]
        case AssistantMessage():
            return _build_assistant(message)
        case ToolMessage(tool_call_id=call_id, content=content):
            return [{"type": "function_call_output", "call_id": call_id, "output": content}]
    raise TypeError(f"not a message: {message!r}")


def _build_assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if message.provider == PROVIDER:
        # Reasoning items must precede the calls they led to; foreign thinking is never sent at all.
        items.extend(_resendable_reasoning(message.provider_data.get("reasoning_items")))
    if message.content:
        items.append({"type": "message", "role": "assistant", "content": message.content})
    for call in message.tool_calls:
        arguments = call.raw_arguments if call.arguments_error and call.raw_arguments is not None else None
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": arguments
                if arguments is not None
                else json.dumps(call.arguments, ensure_ascii=False),
            }
        )
    return items


def _resendable_reasoning(raw: object) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            kept = {
                k: item[k] for k in ("type", "id", "summary", "encrypted_content") if item.get(k) is not None
            }
            kept.setdefault("summary", [])
            items.append(kept)
    return items


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


def sniff_body(body: object) -> bool:
    """True for a Responses API response (`object: response`, or an `output` list)."""
    return isinstance(body, dict) and (
        body.get("object") == "response" or isinstance(body.get("output"), list)
    )


def sniff_event(event_name: str | None, data: object) -> bool:
    """True for a Responses stream event (`response.*`, by its SSE name or its `type`)."""
    kind = data.get("type") if isinstance(data, dict) else None
    return any(isinstance(name, str) and name.startswith("response.") for name in (event_name, kind))


def sniff_error(body: dict[str, Any]) -> bool:
    """Never: a Responses error has OpenAI's envelope, which `openai_chat` reads."""
    del body
    return False
