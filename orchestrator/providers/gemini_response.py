"""A Gemini `generateContent` response read into a Turn: the reader of whole responses that `gemini` applies
to a response body and `gemini_stream` to the response its chunks add up to.

Quirks this module handles: function calls carry no id on the Gemini API (a synthetic one is made from the
turn's IdSource; Vertex AI may give one, which is kept); `thought: true` text parts are thinking, never text;
`thoughtSignature` is kept in `provider_data` (`parts`: the response's parts verbatim, so that each signature
goes back on the part it came with; `thought_signatures`: by call id) for `gemini_request` to send back;
`usageMetadata.candidatesTokenCount` excludes thinking tokens (`thoughtsTokenCount` is kept as
reasoning_tokens); a blocked prompt has no candidates at all, only `promptFeedback.blockReason`. A stream is
SSE (`alt=sse`) or, without it, one JSON array of response chunks; both add up to the same response
(`build_merged_response`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
from orchestrator.providers.body import (
    build_error,
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
    parse_usage,
)

PROVIDER = "gemini"
# The keys of a text part that streamed fragments of one text (or one thought) may carry.
TEXT_PART_KEYS = frozenset({"text", "thought", "thoughtSignature"})


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one `generateContent` response body, or from the JSON array a stream without `alt=sse`
    answers; a ProviderError for an error or malformed body."""
    if isinstance(body, list):
        return from_chunks(body, ids=ids)
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        return parse_response(req_map(body, "response"), ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Gemini response: {exc}")


def from_chunks(chunks: list[object], *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from the decoded chunks of a stream (SSE events, or the JSON array of a non-SSE stream)."""
    for chunk in chunks:
        if is_error_body(chunk):
            return error_from_wire(None, chunk)
    if not chunks:
        return invalid_response(PROVIDER, "empty Gemini stream: no response chunk", retryable=True)
    try:
        merged = build_merged_response([req_map(c, f"stream chunk {i}") for i, c in enumerate(chunks)])
        if merged is None:
            # Every stream ends with a chunk carrying finishReason (or a prompt block): without it the
            # connection was cut, and asking again is the right answer.
            return invalid_response(PROVIDER, "Gemini stream ended before its final chunk", retryable=True)
        return parse_response(merged, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Gemini stream: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Gemini error body: `{"error": {"code", "message", "status", "details"}}`
    (a `RetryInfo` detail's `retryDelay` is the retry hint), or that envelope alone in a JSON array, as
    Vertex AI answers a streamed call."""
    if isinstance(body, list) and len(body) == 1 and is_error_body(body[0]):
        body = body[0]
    return build_error(PROVIDER, status, body, headers)


def parse_response(response: dict[str, Any], ids: IdSource) -> Turn:
    """The Turn of one whole response (raises `MalformedBody` for a body of the wrong shape)."""
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


def build_merged_response(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One response from stream chunks: parts in order (consecutive text fragments of one kind joined),
    the last finishReason, the last usage; None when no chunk finished the stream (it was cut)."""
    parts: list[Any] = []
    merged: dict[str, Any] = {}
    candidate: dict[str, Any] = {}
    for index, chunk in enumerate(chunks):
        for key in ("usageMetadata", "modelVersion", "responseId", "promptFeedback"):
            if chunk.get(key) is not None:
                merged[key] = chunk[key]
        first = read_first_candidate(chunk, f"chunk {index}")
        if first is None:
            continue
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


def read_first_candidate(chunk: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The first candidate of a response or stream chunk; None when it has none."""
    candidates = opt_list(chunk.get("candidates"), f"{where}.candidates")
    return req_map(candidates[0], f"{where}.candidates[0]") if candidates else None


def _merge_fragments(parts: list[Any]) -> list[Any]:
    """Consecutive streamed text fragments of one kind (text or thought) joined into one part."""
    merged: list[Any] = []
    for index, part in enumerate(parts):
        current = req_map(part, f"parts[{index}]")
        previous = merged[-1] if merged else None
        if isinstance(previous, dict) and continues_text_part(previous, current):
            previous["text"] = previous["text"] + current["text"]
            if current.get("thoughtSignature"):
                previous["thoughtSignature"] = current["thoughtSignature"]
            continue
        merged.append(dict(current))
    return merged


def continues_text_part(previous: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """True when streamed part `current` is joined onto `previous`: both text parts, both thought or
    neither. The stream reader keys its thinking deltas by the same rule, so they add up to the Turn's."""
    return (
        is_text_part(previous)
        and is_text_part(current)
        and bool(previous.get("thought")) == bool(current.get("thought"))
    )


def is_text_part(part: Mapping[str, Any]) -> bool:
    """A part that holds only text (a thought, maybe signed): what streamed fragments of one text are."""
    return isinstance(part.get("text"), str) and part.keys() <= TEXT_PART_KEYS
