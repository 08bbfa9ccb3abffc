"""Google Gemini `generateContent` and its streams, normalised into a Turn.

Quirks this module handles: function calls carry no id (a synthetic one is made from the turn's
IdSource); `thought: true` text parts are thinking, never text; `thoughtSignature` is kept in
`provider_data` so the part can be re-sent with its signature; `usageMetadata.candidatesTokenCount`
excludes thinking tokens (`thoughtsTokenCount` is kept as reasoning_tokens); a blocked prompt has no
candidates at all, only `promptFeedback.blockReason`. Streams arrive as SSE (`alt=sse`) or as one JSON
array of response chunks; both accumulate into the same Turn.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
from orchestrator.providers.body import (
    build_error,
    decode_json,
    invalid_response,
    is_error_body,
    opt_bool,
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

PROVIDER = "gemini"


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one `generateContent` response body; a ProviderError for an error or malformed body."""
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        return _read_response(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Gemini response: {exc}")


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole `streamGenerateContent?alt=sse` body (LF or CRLF), accumulated."""
    chunks: list[object] = []
    for event in parse_sse(text):
        data = event.data.strip()
        if not data or data == "[DONE]":
            continue
        chunk = decode_json(data, PROVIDER)
        if isinstance(chunk, ProviderError):
            return chunk
        chunks.append(chunk)
    return from_chunks(chunks, ids=ids)


def from_chunks(chunks: list[object], *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from the decoded chunks of a stream (SSE events, or the JSON array of a non-SSE stream)."""
    for chunk in chunks:
        if is_error_body(chunk):
            return error_from_wire(None, chunk)
    if not chunks:
        return invalid_response(PROVIDER, "empty Gemini stream: no response chunk", retryable=True)
    try:
        merged = _merge_chunks([req_map(c, f"stream chunk {i}") for i, c in enumerate(chunks)])
        if merged is None:
            # Every stream ends with a chunk carrying finishReason (or a prompt block): without it the
            # connection was cut, and asking again is the right answer.
            return invalid_response(PROVIDER, "Gemini stream ended before its final chunk", retryable=True)
        return _read_response(merged, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Gemini stream: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Gemini error body: `{"error": {"code", "message", "status", "details"}}`."""
    return build_error(PROVIDER, status, body, headers)


def _read_response(response: dict[str, Any], ids: IdSource) -> Turn:
    usage_map = opt_map(response.get("usageMetadata"), "usageMetadata")
    usage = parse_usage(
        usage_map,
        reasoning_tokens=usage_map.get("thoughtsTokenCount"),
        cache_read_tokens=usage_map.get("cachedContentTokenCount"),
    )
    model = opt_str(response.get("modelVersion"), "modelVersion")
    provider_data: dict[str, Any] = {}
    response_id = opt_str(response.get("responseId"), "responseId")
    if response_id:
        provider_data["response_id"] = response_id
    candidates = opt_list(response.get("candidates"), "candidates")
    if not candidates:
        feedback = opt_map(response.get("promptFeedback"), "promptFeedback")
        block_reason = opt_str(feedback.get("blockReason"), "promptFeedback.blockReason")
        if block_reason:
            provider_data["block_reason"] = block_reason
        return build_turn(
            PROVIDER,
            text=None,
            thinking=None,
            tool_calls=[],
            usage=usage,
            model=model,
            finish_reason="content_filter" if block_reason else None,
            provider_data=provider_data,
        )
    candidate = req_map(candidates[0], "candidates[0]")
    content = opt_map(candidate.get("content"), "candidates[0].content")
    parts = opt_list(content.get("parts"), "candidates[0].content.parts")
    texts, thoughts, calls, signatures = _read_parts(parts, ids)
    if parts:
        # Re-sent verbatim to Gemini: each signature must come back on the part it was given with.
        provider_data["parts"] = copy.deepcopy(parts)
    if signatures:
        provider_data["thought_signatures"] = signatures
    finish_message = opt_str(candidate.get("finishMessage"), "candidates[0].finishMessage")
    if finish_message:
        provider_data["finish_message"] = finish_message
    return build_turn(
        PROVIDER,
        text=join_text(texts),
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=usage,
        model=model,
        finish_reason=parse_finish_reason(
            opt_str(candidate.get("finishReason"), "candidates[0].finishReason")
        ),
        provider_data=provider_data,
    )


def _read_parts(
    parts: list[Any], ids: IdSource
) -> tuple[list[str], list[str], list[ToolCall], dict[str, str]]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    signatures: dict[str, str] = {}
    for index, raw in enumerate(parts):
        where = f"parts[{index}]"
        part = req_map(raw, where)
        signature = opt_str(part.get("thoughtSignature"), f"{where}.thoughtSignature")
        if part.get("functionCall") is not None:
            function_call = req_map(part["functionCall"], f"{where}.functionCall")
            call = build_tool_call(
                ids,
                opt_str(function_call.get("id"), f"{where}.functionCall.id"),
                opt_str(function_call.get("name"), f"{where}.functionCall.name"),
                function_call.get("args"),
            )
            calls.append(call)
            if signature:
                signatures[call.id] = signature
            continue
        text = opt_str(part.get("text"), f"{where}.text")
        if text is None:
            continue  # inline data, code execution parts: not text, kept in provider_data["parts"]
        if opt_bool(part.get("thought"), f"{where}.thought"):
            thoughts.append(text)
        else:
            texts.append(text)
    return texts, thoughts, calls, signatures


def _merge_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One response from stream chunks: parts in order, last finishReason, last usage; None if unfinished."""
    parts: list[Any] = []
    merged: dict[str, Any] = {}
    candidate: dict[str, Any] = {}
    for index, chunk in enumerate(chunks):
        for key in ("usageMetadata", "modelVersion", "responseId", "promptFeedback"):
            if chunk.get(key) is not None:
                merged[key] = chunk[key]
        candidates = opt_list(chunk.get("candidates"), f"chunk {index}.candidates")
        if not candidates:
            continue
        first = req_map(candidates[0], f"chunk {index}.candidates[0]")
        content = opt_map(first.get("content"), f"chunk {index}.candidates[0].content")
        parts.extend(opt_list(content.get("parts"), f"chunk {index}.candidates[0].content.parts"))
        for key in ("finishReason", "finishMessage"):
            if first.get(key) is not None:
                candidate[key] = first[key]
    blocked = opt_map(merged.get("promptFeedback"), "promptFeedback").get("blockReason")
    if "finishReason" not in candidate and not blocked:
        return None
    if parts or candidate:
        candidate["content"] = {"role": "model", "parts": _merge_fragments(parts)}
        merged["candidates"] = [candidate]
    return merged


_TEXT_PART_KEYS = frozenset({"text", "thought", "thoughtSignature"})


def _merge_fragments(parts: list[Any]) -> list[Any]:
    """Consecutive streamed text fragments of one kind (text or thought) joined into one part."""
    merged: list[Any] = []
    for index, part in enumerate(parts):
        current = req_map(part, f"parts[{index}]")
        previous = merged[-1] if merged else None
        if (
            isinstance(previous, dict)
            and _is_text_part(previous)
            and _is_text_part(current)
            and bool(previous.get("thought")) == bool(current.get("thought"))
        ):
            previous["text"] = previous["text"] + current["text"]
            if current.get("thoughtSignature"):
                previous["thoughtSignature"] = current["thoughtSignature"]
            continue
        merged.append(dict(current))
    return merged


def _is_text_part(part: dict[str, Any]) -> bool:
    return isinstance(part.get("text"), str) and part.keys() <= _TEXT_PART_KEYS


# Keywords of the OpenAPI 3.0 schema subset Gemini function declarations accept; others are rejected.
_ALLOWED_SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "description",
        "nullable",
        "enum",
        "items",
        "properties",
        "required",
        "anyOf",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "minProperties",
        "maxProperties",
        "default",
        "propertyOrdering",
    }
)
_SUPPORTED_FORMATS = frozenset({"enum", "date-time", "int32", "int64", "float", "double"})


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A Gemini function declaration for a tool, its schema cleaned of what Gemini rejects."""
    parameters = spec.parameters
    defs = {**opt_dict(parameters.get("definitions")), **opt_dict(parameters.get("$defs"))}
    declaration: dict[str, Any] = {"name": spec.name, "description": spec.description}
    schema = build_gemini_schema(parameters, defs, frozenset())
    # A function without parameters is declared without a schema: Gemini rejects an empty OBJECT.
    if schema.get("properties"):
        declaration["parameters"] = schema
    return declaration


def opt_dict(value: object) -> dict[str, Any]:
    """`value` when it is a dict, else {} (schema fragments written by people can be anything)."""
    return value if isinstance(value, dict) else {}


def build_gemini_schema(
    schema: Mapping[str, Any], defs: Mapping[str, Any], seen: frozenset[str]
) -> dict[str, Any]:
    """A JSON Schema rewritten into Gemini's subset: `$ref`s inlined, unions made `nullable`/`anyOf`,
    `const` made a one-value enum, unsupported formats moved into the description, other keywords dropped.
    """
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in defs:
            # A recursive or dangling reference cannot be inlined: an untyped object is the honest rest.
            return {"type": "object", "description": str(schema.get("description", ""))}
        target = {**opt_dict(defs[name]), **{k: v for k, v in schema.items() if k != "$ref"}}
        return build_gemini_schema(target, defs, seen | {name})
    out: dict[str, Any] = {}
    for union_key in ("anyOf", "oneOf"):
        if isinstance(schema.get(union_key), list):
            out.update(_build_union(schema[union_key], defs, seen))
    for one in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        if isinstance(one, dict):
            out.update(build_gemini_schema(one, defs, seen))
    _copy_type(schema, out)
    if "const" in schema:
        out["enum"] = [schema["const"]]
    for key, value in schema.items():
        if key in _ALLOWED_SCHEMA_KEYS and key not in ("type", "anyOf", "properties", "items"):
            out[key] = value
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {
            name: build_gemini_schema(opt_dict(sub), defs, seen) for name, sub in schema["properties"].items()
        }
    if isinstance(schema.get("items"), dict):
        out["items"] = build_gemini_schema(schema["items"], defs, seen)
    _fix_enum_and_format(out)
    return out


def _build_union(members: list[Any], defs: Mapping[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    kept = [m for m in members if isinstance(m, dict) and m.get("type") != "null"]
    nullable = len(kept) < len(members)
    options = [build_gemini_schema(m, defs, seen) for m in kept]
    out: dict[str, Any] = options[0] if len(options) == 1 else ({"anyOf": options} if options else {})
    if nullable:
        out["nullable"] = True
    return out


def _copy_type(schema: Mapping[str, Any], out: dict[str, Any]) -> None:
    type_ = schema.get("type")
    if isinstance(type_, list):
        names = [t for t in type_ if isinstance(t, str) and t != "null"]
        if len(names) < len(type_):
            out["nullable"] = True
        if names:
            out["type"] = names[0]
    elif isinstance(type_, str):
        out["type"] = type_


def _fix_enum_and_format(out: dict[str, Any]) -> None:
    enum = out.get("enum")
    if isinstance(enum, list) and not all(isinstance(v, str) for v in enum):
        # Gemini enums are strings only; a number enum keeps its type and says its values in words.
        del out["enum"]
        allowed = ", ".join(str(v) for v in enum)
        description = out.get("description")
        out["description"] = f"{description} (one of: {allowed})" if description else f"One of: {allowed}"
    elif isinstance(enum, list):
        out.setdefault("type", "string")
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt not in _SUPPORTED_FORMATS:
        del out["format"]
        description = out.get("description")
        out["description"] = f"{description} (format: {fmt})" if description else f"Format: {fmt}"
