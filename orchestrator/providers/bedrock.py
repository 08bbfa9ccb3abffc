"""AWS Bedrock Converse (`POST /model/{id}/converse`) and ConverseStream (`/converse-stream`), both ways: the
provider's profile, the one module the registry knows it by. Request bodies are built by `bedrock_request`;
signing (SigV4) and the endpoint are `sigv4`'s, the binary event-stream framing `event_stream`'s.

Responses: content blocks `text`, `toolUse` {toolUseId, name, input}, `reasoningContent` {reasoningText {text,
signature} | redactedContent}; the body carries no model id (it is in the request URL). Signatures and
redacted reasoning are kept in `provider_data["reasoning"]`, which `bedrock_request` sends back.

Errors come as `{"message": ...}` with the type in the `x-amzn-ErrorType` header (`ThrottlingException:http://…`)
or in `__type` (possibly `namespace#Name`). With a status, retryable follows it (429 ThrottlingException and
ModelNotReadyException, 408 ModelTimeoutException, 500, 503 ServiceUnavailableException); a
ValidationException saying the input is too long is `context_length_exceeded` (`overflow`). Without a status
(an exception inside a stream), the type says: `_RETRYABLE_EXCEPTIONS`.

ConverseStream: each frame (`event_stream.EventStreamDecoder`) is an `SSEEvent` named by its event type
(`messageStart`, `contentBlockStart`, `contentBlockDelta`, `contentBlockStop`, `messageStop`, `metadata`),
`exception:<type>` (`throttlingException`, `validationException`, `serviceUnavailableException`,
`internalServerException`, `modelStreamErrorException`) or `error:<code>`, its data the payload's JSON.
`BedrockStreamReader` reads them; `messageStop` is the terminal event (`metadata`, with the usage, follows
it). `from_stream` reads the events as the AWS SDKs yield them once decoded: one JSON object per line, or a
JSON array.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from orchestrator.context.windows import CONTEXT_LENGTH_EXCEEDED
from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
from orchestrator.providers.bedrock_request import PROVIDER, build_body
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
    SSEEvent,
    build_tool_call,
    build_turn,
    clean_tool_name,
    join_text,
    join_thinking,
    parse_finish_reason,
    parse_usage,
)
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.event_stream import EventStreamDecoder
from orchestrator.providers.rate_limits import RateLimitSignal, parse_retry_after, read_header
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner
from orchestrator.providers.structured import ANSWER_TOOL

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "CONVERSE_PATH",
    "CONVERSE_STREAM_PATH",
    "PROVIDER",
    "STREAM_CONTENT_TYPE",
    "BedrockStreamReader",
    "build_url",
    "error_from_wire",
    "from_stream",
    "from_wire",
    "parse_rate_limits",
    "stream_decoder",
    "stream_reader",
    "to_wire",
]

CONVERSE_PATH = "converse"
CONVERSE_STREAM_PATH = "converse-stream"
# botocore's percent-encoding of a URI label: all but unreserved characters (`:` of model versions and
# `/` of ARNs included) are escaped.
_URI_SAFE = "-._~"
# ConverseStream's answer: binary frames (`event_stream`), read by `stream_decoder()` instead of as SSE.
STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
EXCEPTION_EVENT_PREFIX = "exception:"
ERROR_EVENT_PREFIX = "error:"


# --- request ---------------------------------------------------------------------------------------------


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """`{base_url}/model/{model id, percent-encoded as botocore does}/converse` (or `/converse-stream`)."""
    path = CONVERSE_STREAM_PATH if stream else CONVERSE_PATH
    return f"{base_url}/model/{quote(model, safe=_URI_SAFE)}/{path}"


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The Converse request body for `request` (pure, see `bedrock_request`); a stream is asked for by the
    URL (`build_url(..., stream=True)`), so the body is the same either way."""
    del stream
    return build_body(request)


# --- responses and errors --------------------------------------------------------------------------------


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one Converse response body; a ProviderError for an error or malformed body."""
    if is_error_body(body) or _is_bedrock_error(body):
        return error_from_wire(None, body)
    try:
        response = req_map(body, "response")
        message = opt_map(opt_map(response.get("output"), "output").get("message"), "output.message")
        blocks = opt_list(message.get("content"), "output.message.content")
        return _build(blocks, response, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Bedrock Converse response: {exc}")


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Bedrock error: `{"message"}` plus `x-amzn-ErrorType`, or `{"__type", ...}`;
    the type is Bedrock's exception name (`ThrottlingException`), whatever form it came in."""
    error = build_error(PROVIDER, status, body, headers)
    if error.type:
        error = error.model_copy(update={"type": build_exception_name(error.type)})
    if status is None and error.code != CONTEXT_LENGTH_EXCEEDED:
        return error.model_copy(update={"retryable": error.type in _RETRYABLE_EXCEPTIONS})
    return error


def build_exception_name(raw: str) -> str:
    """Bedrock's exception name from any of its spellings: `ThrottlingException:http://…` (the header),
    `com.amazon.coral#ThrottlingException` (`__type`), `throttlingException` (a stream's event)."""
    name = raw.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name[:1].upper() + name[1:]


# Bedrock's own names for transient failures (429/500/503/408 when the status is known; a stream's
# modelStreamErrorException says "retry your request").
_RETRYABLE_EXCEPTIONS = frozenset(
    {
        "ThrottlingException",
        "InternalServerException",
        "ServiceUnavailableException",
        "ModelNotReadyException",
        "ModelTimeoutException",
        "ModelStreamErrorException",
    }
)
# A 429 that is not a rate limit: the model is being loaded (on-demand imported models).
_NOT_A_LIMIT = "ModelNotReadyException"


def parse_rate_limits(status: int | None, headers: Mapping[str, str], now: float) -> RateLimitSignal:
    """Bedrock states no remaining quota in its headers: a 429 ThrottlingException is a refusal (a 429
    ModelNotReadyException is not), with `retry-after` in seconds when a gateway in front of it sends one.
    `now` is unused."""
    del now
    # Any case: httpx's headers are case-blind, a plain mapping is not (`X-Amzn-ErrorType` as sent).
    error_type = next((v for k, v in headers.items() if k.lower() == "x-amzn-errortype"), None)
    not_a_limit = error_type is not None and build_exception_name(error_type) == _NOT_A_LIMIT
    return RateLimitSignal(
        refused=status == 429 and not not_a_limit,
        retry_after_s=parse_retry_after(read_header(headers, "retry-after")),
    )


def _is_bedrock_error(body: object) -> bool:
    return isinstance(body, dict) and "__type" in body and "output" not in body


def _build(blocks: list[Any], response: dict[str, Any], ids: IdSource) -> Turn:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    for index, raw in enumerate(blocks):
        where = f"content[{index}]"
        block = req_map(raw, where)
        if block.get("toolUse") is not None:
            tool_use = req_map(block["toolUse"], f"{where}.toolUse")
            calls.append(
                build_tool_call(
                    ids,
                    opt_str(tool_use.get("toolUseId"), f"{where}.toolUse.toolUseId"),
                    opt_str(tool_use.get("name"), f"{where}.toolUse.name"),
                    tool_use.get("input"),
                )
            )
        elif block.get("reasoningContent") is not None:
            content = req_map(block["reasoningContent"], f"{where}.reasoningContent")
            reasoning_text = opt_map(content.get("reasoningText"), f"{where}.reasoningContent.reasoningText")
            thoughts.append(opt_str(reasoning_text.get("text"), f"{where}.reasoningText.text") or "")
            # Signatures and redacted reasoning are not thinking text, but Bedrock wants them back.
            reasoning.append(content)
        else:
            texts.append(opt_str(block.get("text"), f"{where}.text") or "")
    usage_map = opt_map(response.get("usage"), "usage")
    provider_data: dict[str, Any] = {}
    if reasoning:
        provider_data["reasoning"] = reasoning
    return build_turn(
        PROVIDER,
        text=join_text(texts),
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=parse_usage(
            usage_map,
            cache_read_tokens=usage_map.get("cacheReadInputTokens"),
            cache_write_tokens=usage_map.get("cacheWriteInputTokens"),
        ),
        model=None,
        finish_reason=parse_finish_reason(opt_str(response.get("stopReason"), "stopReason")),
        provider_data=provider_data,
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_decoder() -> EventStreamDecoder:
    """The decoder of a ConverseStream body (`STREAM_CONTENT_TYPE`): its frames as `SSEEvent`s, which
    `stream_reader` reads; `event_stream.EventStreamError` (a `ValueError`) for a bad or cut frame."""
    return EventStreamDecoder()


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one ConverseStream answer (`BedrockStreamReader`); for a request with an output schema,
    one that streams the answer tool's input as the answer's text."""
    answer_tool = ANSWER_TOOL if request is not None and request.output_schema is not None else None
    return BedrockStreamReader(answer_tool=answer_tool)


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from decoded ConverseStream events (JSON lines or one JSON array), accumulated."""
    stripped = text.strip()
    events: list[object] = []
    if stripped.startswith("["):
        parsed = decode_json(stripped, PROVIDER)
        if isinstance(parsed, ProviderError):
            return parsed
        events = parsed if isinstance(parsed, list) else [parsed]
    else:
        for line in stripped.splitlines():
            if line.strip():
                event = decode_json(line, PROVIDER)
                if isinstance(event, ProviderError):
                    return event
                events.append(event)
    reader = BedrockStreamReader()
    for position, event in enumerate(events):
        if not isinstance(event, dict):
            return invalid_response(
                PROVIDER, f"malformed Bedrock ConverseStream event {position}: not an object"
            )
        for name, payload in event.items():
            # The SDKs name an exception event by its member (`throttlingException`); frames by a header.
            kind = f"{EXCEPTION_EVENT_PREFIX}{name}" if name.endswith("Exception") else name
            reader.add(SSEEvent(kind, json.dumps(payload)))
        if reader.error is not None:
            break
    return reader.finish(ids)


class BedrockStreamReader(StreamReader):
    """A ConverseStream answer, event by event: deltas as they come, the Turn once `messageStop` came.

    Content blocks accumulate by `contentBlockIndex` into the shape of a Converse response's content, which
    `from_wire`'s reading then turns into the Turn. Deltas: text is text, reasoning text thinking (one part
    per block), and a `toolUse` block is announced when it starts, with its id and its position among the
    calls — except the answer tool of an output schema, whose input JSON streams as text instead.
    """

    provider = PROVIDER
    stream_name = "Bedrock ConverseStream"

    def __init__(self, *, answer_tool: str | None = None) -> None:
        super().__init__()
        self.answer_tool = answer_tool
        self.answer_index: int | None = None
        self.event_name: str | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] = {}
        self.stopped = False
        self.joiner = ThinkingJoiner()
        self.calls = 0

    def add(self, event: SSEEvent) -> list[Delta]:
        """The deltas of one event; an `error:` frame (its data is a message, not JSON) fails the stream."""
        if self.error is not None:
            return []
        name = event.event or ""
        if name.startswith(ERROR_EVENT_PREFIX):
            code = name.removeprefix(ERROR_EVENT_PREFIX) or "error"
            self.error = error_from_wire(None, {"__type": code, "message": event.data or code})
            return []
        self.event_name = name
        return super().add(event)

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        if event_name is not None and event_name.startswith(EXCEPTION_EVENT_PREFIX):
            exception = event_name.removeprefix(EXCEPTION_EVENT_PREFIX)
            details = payload if isinstance(payload, dict) else {}
            return error_from_wire(None, {**details, "__type": exception or "Exception"})
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        name = self.event_name
        if name == "contentBlockStart":
            start = opt_map(payload.get("start"), "contentBlockStart.start")
            if start.get("toolUse") is not None:
                tool_use = req_map(start["toolUse"], "contentBlockStart.start.toolUse")
                return self._tool_started(_index(payload), tool_use)
        elif name == "contentBlockDelta":
            return self._add_delta(_index(payload), opt_map(payload.get("delta"), "contentBlockDelta.delta"))
        elif name == "messageStop":
            self.response["stopReason"] = payload.get("stopReason")
            self.stopped = True
        elif name == "metadata":
            self.response["usage"] = payload.get("usage")
        return []

    def _tool_started(self, index: int, tool_use: dict[str, Any]) -> list[Delta]:
        self.blocks[index] = {"toolUse": {**tool_use, "input": ""}}
        name = opt_str(tool_use.get("name"), "toolUse.name")
        if self.answer_tool is not None and name == self.answer_tool:
            self.answer_index = index
            return []
        if not name:
            return []
        self.calls += 1
        call_id = opt_str(tool_use.get("toolUseId"), "toolUse.toolUseId")
        return [ToolCallDelta(self.calls - 1, clean_tool_name(name), call_id or None)]

    def _add_delta(self, index: int, delta: dict[str, Any]) -> list[Delta]:
        block = self.blocks.setdefault(index, {})
        deltas: list[Delta] = []
        if "text" in delta:
            piece = opt_str(delta["text"], "delta.text") or ""
            block["text"] = str(block.get("text") or "") + piece
            if piece:
                deltas.append(TextDelta(piece))
        if "toolUse" in delta:
            tool_use = block.setdefault("toolUse", {"input": ""})
            piece = (
                opt_str(opt_map(delta["toolUse"], "delta.toolUse").get("input"), "delta.toolUse.input") or ""
            )
            tool_use["input"] = str(tool_use.get("input") or "") + piece
            if piece and index == self.answer_index:
                deltas.append(TextDelta(piece))
        if "reasoningContent" in delta:
            deltas += self._add_reasoning(
                index, block, opt_map(delta["reasoningContent"], "delta.reasoningContent")
            )
        return deltas

    def _add_reasoning(self, index: int, block: dict[str, Any], reasoning: dict[str, Any]) -> list[Delta]:
        held = block.setdefault("reasoning", {"text": "", "signature": None, "redacted": None})
        text = opt_str(reasoning.get("text"), "delta.reasoningContent.text") or ""
        held["text"] += text
        signature = opt_str(reasoning.get("signature"), "delta.reasoningContent.signature")
        if signature:
            held["signature"] = (held["signature"] or "") + signature
        redacted = opt_str(reasoning.get("redactedContent"), "delta.reasoningContent.redactedContent")
        if redacted:
            held["redacted"] = (held["redacted"] or "") + redacted
        return self.joiner.add(index, text)

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.stopped:
            return self.cut("ended before messageStop")
        return _build([_finish_block(self.blocks[i]) for i in sorted(self.blocks)], self.response, ids)


def _index(payload: dict[str, Any]) -> int:
    index = payload.get("contentBlockIndex", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 10_000:
        raise MalformedBody("contentBlockIndex", f"expected a small non-negative integer, got {index!r}")
    return index


def _finish_block(block: dict[str, Any]) -> dict[str, Any]:
    """A streamed block in the shape a Converse response's content has."""
    tool_use = block.get("toolUse")
    if isinstance(tool_use, dict):
        # Streamed tool input is a JSON string in pieces; the whole is parsed like any arguments string.
        raw = tool_use.get("input")
        return {"toolUse": {**tool_use, "input": raw if raw else "{}"}}
    reasoning = block.get("reasoning")
    if isinstance(reasoning, dict):
        if reasoning["redacted"] and not reasoning["text"]:
            return {"reasoningContent": {"redactedContent": reasoning["redacted"]}}
        text_block: dict[str, Any] = {"text": reasoning["text"]}
        if reasoning["signature"]:
            text_block["signature"] = reasoning["signature"]
        return {"reasoningContent": {"reasoningText": text_block}}
    return {"text": block.get("text") or ""}


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


_EVENTS = frozenset(
    {"messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"}
)


def sniff_body(body: object) -> bool:
    """True for a Converse response, or a JSON array of decoded ConverseStream events."""
    if isinstance(body, list):
        return bool(body) and all(isinstance(e, dict) and e.keys() & _EVENTS for e in body)
    return isinstance(body, dict) and (isinstance(body.get("output"), dict) or "stopReason" in body)


def sniff_event(event_name: str | None, data: object) -> bool:
    """Never: ConverseStream is not SSE (decoded events come as JSON lines: `sniff_ndjson`)."""
    del event_name, data
    return False


def sniff_ndjson(first: object) -> bool:
    """True when the first of a body's JSON lines is a ConverseStream event."""
    return isinstance(first, dict) and bool(first.keys() & _EVENTS)


def sniff_error(body: dict[str, Any]) -> bool:
    """True for an AWS error body (`__type` names the exception)."""
    return isinstance(body.get("__type"), str) and "output" not in body


def from_chunks(events: list[object], *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a JSON array of decoded ConverseStream events (what the AWS SDKs yield)."""
    return from_stream(json.dumps(events), ids=ids)
