"""The OpenAI Responses API (`POST /v1/responses`), both ways.

A response is a list of output items: `message` (output_text and refusal parts → text), `reasoning`
(`summary[].text` → thinking; the item itself, with its id and any `encrypted_content`, is kept opaque in
`provider_data["reasoning_items"]`), `function_call` (its `call_id` is the tool-call id, not the `fc_` item
id). `status` and `incomplete_details.reason` give the finish reason; a `failed` response is a ProviderError.
Streams are read by `openai_responses_stream`.

`to_wire` sends the whole canonical history as input items (function_call + function_call_output pairs),
statelessly: no `previous_response_id`, so a request never depends on server-side state that may have expired
or be disabled (`store: false`). The response id stays in `provider_data["response_id"]` for reference; the
reasoning items of an assistant message are re-sent before its calls, and only when that message came from
this provider. The request's `instructions` go in `instructions`, its settings in their fields (`reasoning.
effort` for `reasoning_effort`), an output schema in `text.format` (`structured`), and `extra` last.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import MalformedBody
from orchestrator.model import (
    AssistantMessage,
    Message,
    ProviderError,
    SystemMessage,
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

PROVIDER = "openai_responses"
RESPONSES_PATH = "/responses"


# --- response -> Turn ------------------------------------------------------------------------------------


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one Responses API response body; a ProviderError for an error, failed or malformed body."""
    if isinstance(body, str | bytes):
        decoded = decode_json(body.decode("utf-8", "replace") if isinstance(body, bytes) else body, PROVIDER)
        if isinstance(decoded, ProviderError):
            return decoded
        body = decoded
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        return _read_response(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Responses API response: {exc}")


def _read_response(response: dict[str, Any], ids: IdSource) -> Turn | ProviderError:
    status = opt_str(response.get("status"), "status")
    if status == "failed" or (status is None and isinstance(response.get("error"), dict)):
        return error_from_wire(None, {"error": opt_map(response.get("error"), "error")})
    text: list[str] = []
    thinking: list[str] = []
    reasoning_items: list[dict[str, Any]] = []
    calls = []
    for i, raw in enumerate(opt_list(response.get("output"), "output")):
        item = req_map(raw, f"output[{i}]")
        kind = item.get("type")
        if kind == "message":
            text.extend(_message_text(item, f"output[{i}]"))
        elif kind == "reasoning":
            thinking.extend(_summary_text(item, f"output[{i}]"))
            reasoning_items.append(item)
        elif kind == "function_call":
            calls.append(build_tool_call(ids, item.get("call_id"), item.get("name"), item.get("arguments")))
    provider_data: dict[str, Any] = {}
    if isinstance(response.get("id"), str):
        provider_data["response_id"] = response["id"]
    if reasoning_items:
        provider_data["reasoning_items"] = reasoning_items
    return build_turn(
        PROVIDER,
        text=join_text(text),
        thinking=join_thinking(thinking),
        tool_calls=calls,
        usage=_read_usage(response.get("usage")),
        model=opt_str(response.get("model"), "model"),
        finish_reason=_finish_reason(status, response.get("incomplete_details")),
        provider_data=provider_data,
    )


def _message_text(item: Mapping[str, Any], where: str) -> list[str]:
    parts: list[str] = []
    for j, raw in enumerate(opt_list(item.get("content"), f"{where}.content")):
        part = req_map(raw, f"{where}.content[{j}]")
        if part.get("type") in ("output_text", "text"):
            parts.append(opt_str(part.get("text"), f"{where}.content[{j}].text") or "")
        elif part.get("type") == "refusal":
            parts.append(opt_str(part.get("refusal"), f"{where}.content[{j}].refusal") or "")
    return parts


def _summary_text(item: Mapping[str, Any], where: str) -> list[str]:
    parts: list[str] = []
    for j, raw in enumerate(opt_list(item.get("summary"), f"{where}.summary")):
        parts.append(
            opt_str(req_map(raw, f"{where}.summary[{j}]").get("text"), f"{where}.summary[{j}]") or ""
        )
    return parts


def _finish_reason(status: str | None, incomplete: object) -> Any:
    if status == "incomplete" and isinstance(incomplete, dict) and incomplete.get("reason"):
        return parse_finish_reason(incomplete["reason"])
    return parse_finish_reason(status)


def _read_usage(raw: object) -> Any:
    usage = raw if isinstance(raw, dict) else {}
    output = usage.get("output_tokens_details")
    cached = usage.get("input_tokens_details")
    return parse_usage(
        usage,
        reasoning_tokens=output.get("reasoning_tokens") if isinstance(output, dict) else None,
        cache_read_tokens=cached.get("cached_tokens") if isinstance(cached, dict) else None,
        cache_write_tokens=cached.get("cache_write_tokens") if isinstance(cached, dict) else None,
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one streamed response (`openai_responses_stream.ResponsesStreamReader`)."""
    del request  # the answer reads the same whatever was asked
    # Imported here: the reader module builds on this one's reader of whole responses.
    from orchestrator.providers.openai_responses_stream import ResponsesStreamReader

    return ResponsesStreamReader()


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole Responses API event stream (LF or CRLF), accumulated."""
    return read_stream_text(stream_reader(), text, ids)


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an OpenAI error body, or a failed response's `error` object."""
    return build_error(PROVIDER, status, body, headers)


# --- request ---------------------------------------------------------------------------------------------


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Responses API function tool (SPEC §3.2): flat, not nested under `function`."""
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
