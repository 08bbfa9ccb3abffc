"""An OpenAI Responses API response read into a Turn: the reader of whole responses that `openai_responses`
applies to a response body and `openai_responses_stream` to the response its terminal event carries.

A response is a list of output items: `message` (output_text and refusal parts → text), `reasoning`
(`summary[].text` → thinking; the item itself, with its id and any `encrypted_content`, is kept opaque in
`provider_data["reasoning_items"]`), `function_call` (its `call_id` is the tool-call id, not the `fc_` item
id). `status` and `incomplete_details.reason` give the finish reason; a `failed` response is a ProviderError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, Turn, Usage
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

PROVIDER = "openai_responses"


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
        return parse_response(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Responses API response: {exc}")


def parse_response(response: dict[str, Any], ids: IdSource) -> Turn | ProviderError:
    """A Turn from one Responses API response object (a failed one: its ProviderError); `MalformedBody` for
    a field of the wrong shape."""
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


def _read_usage(raw: object) -> Usage:
    usage = raw if isinstance(raw, dict) else {}
    output = usage.get("output_tokens_details")
    cached = usage.get("input_tokens_details")
    return parse_usage(
        usage,
        reasoning_tokens=output.get("reasoning_tokens") if isinstance(output, dict) else None,
        cache_read_tokens=cached.get("cached_tokens") if isinstance(cached, dict) else None,
        cache_write_tokens=cached.get("cache_write_tokens") if isinstance(cached, dict) else None,
    )


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an OpenAI error body, or a failed response's `error` object."""
    return build_error(PROVIDER, status, body, headers)
