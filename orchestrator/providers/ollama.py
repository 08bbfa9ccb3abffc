"""Ollama's native `/api/chat`, whole or as its NDJSON stream, normalised into a Turn.

Quirks: arguments arrive as an object, tool calls usually have no id (a synthetic one is made), thinking
comes in `message.thinking` when `think` is on, `done_reason` says "stop" next to tool calls, and usage
is `prompt_eval_count` / `eval_count`. A stream is one JSON object per line; the last has `done: true`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
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
    parse_finish_reason,
    parse_usage,
)

PROVIDER = "ollama"


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one non-streamed `/api/chat` response; a ProviderError for an error or malformed body."""
    return _from_chunks([body], ids or IdSource(), streamed=False)


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole NDJSON `/api/chat` stream, accumulated (blank lines and CRLF tolerated)."""
    chunks: list[object] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        chunk = decode_json(line, PROVIDER)
        if isinstance(chunk, ProviderError):
            return chunk
        chunks.append(chunk)
    if not chunks:
        return invalid_response(PROVIDER, "empty Ollama stream: no chunk", retryable=True)
    return _from_chunks(chunks, ids or IdSource(), streamed=True)


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from an Ollama error body: `{"error": "model 'x' not found"}`."""
    return build_error(PROVIDER, status, body, headers)


def _from_chunks(chunks: list[object], ids: IdSource, *, streamed: bool) -> Turn | ProviderError:
    for chunk in chunks:
        if is_error_body(chunk):
            return error_from_wire(None, chunk)
    try:
        return _read(chunks, ids, streamed=streamed)
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Ollama response: {exc}")


def _read(chunks: list[object], ids: IdSource, *, streamed: bool) -> Turn | ProviderError:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    last: dict[str, Any] = {}
    for index, raw in enumerate(chunks):
        chunk = req_map(raw, f"chunk {index}" if streamed else "response")
        message = opt_map(chunk.get("message"), "message")
        texts.append(opt_str(message.get("content"), "message.content") or "")
        thoughts.append(opt_str(message.get("thinking"), "message.thinking") or "")
        for position, tool_call in enumerate(opt_list(message.get("tool_calls"), "message.tool_calls")):
            calls.append(_read_tool_call(req_map(tool_call, f"message.tool_calls[{position}]"), ids))
        last = chunk
    if streamed and last.get("done") is not True:
        # The final line carries done_reason and the counts; without it the connection was cut.
        return invalid_response(PROVIDER, "Ollama stream ended before its final chunk", retryable=True)
    model = opt_str(last.get("model"), "model")
    created_at = opt_str(last.get("created_at"), "created_at")
    return build_turn(
        PROVIDER,
        # Streamed fragments join without a separator: they are pieces of one text.
        text="".join(texts),
        thinking="".join(thoughts).strip("\n"),
        tool_calls=calls,
        usage=parse_usage(last),
        model=model,
        finish_reason=parse_finish_reason(opt_str(last.get("done_reason"), "done_reason")),
        provider_data={"created_at": created_at} if created_at else {},
    )


def _read_tool_call(tool_call: dict[str, Any], ids: IdSource) -> ToolCall:
    function = opt_map(tool_call.get("function"), "tool_call.function")
    return build_tool_call(
        ids,
        opt_str(tool_call.get("id"), "tool_call.id"),
        opt_str(function.get("name"), "tool_call.function.name"),
        function.get("arguments"),
    )


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


def sniff_body(body: object) -> bool:
    """True for an /api/chat answer: a `message` object the Cohere shape does not claim."""
    if not isinstance(body, dict) or not isinstance(body.get("message"), dict):
        return False
    from orchestrator.providers import cohere  # a sibling's shape: the one other `message` body

    return not cohere.sniff_body(body)


def sniff_event(event_name: str | None, data: object) -> bool:
    """Never: Ollama streams JSON lines, not SSE (`sniff_ndjson`)."""
    del event_name, data
    return False


def sniff_ndjson(first: object) -> bool:
    """True for any JSON lines another format did not claim: NDJSON is Ollama's stream."""
    del first
    return True


def sniff_error(body: dict[str, Any]) -> bool:
    """True for Ollama's error, a plain string (`{"error": "model not found"}`)."""
    return isinstance(body.get("error"), str)
