"""Cohere's v2 Chat API (`POST {base}/v2/chat`), both ways: the wire module the `cohere` profile names. The
request is built by `cohere_request`; this module reads responses, errors, rate-limit headers and the SSE
stream a `stream: true` body asks for (the same URL).

`message.tool_plan` is the visible sentence a model writes before its tool calls ("I will use the
currentTime tool…"): it is the answer's text, as `expected.json` judges it, and is also kept in
`provider_data["tool_plan"]` because Cohere wants it back in its own field. `content[]` holds `text`
and, for reasoning models, `thinking` blocks. Arguments are a JSON string, sometimes `"null"`. Usage
is `usage.tokens` (what the model read and wrote), not `billed_units`.

The stream (`CohereStreamReader`): `message-start` (the id), `tool-plan-delta`, `content-start` /
`content-delta` / `content-end` by block index (a block is `text` or `thinking`), `tool-call-start` /
`-delta` / `-end` by call index (the start names the call; arguments arrive as string pieces),
`citation-start` / `-end` (not kept, as the whole body's citations are not), and `message-end` with the
finish reason and usage — or, for a generation that failed, an `error` (a retryable ProviderError). A stream
that stops before `message-end` was cut. Deltas: the plan and the text blocks are text, joined as the whole
body's text is (a blank line between parts), thinking blocks are thinking, and a call is announced when it
starts — except the answer tool of an output schema, whose arguments stream as the answer's text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.context.windows import CONTEXT_LENGTH_EXCEEDED
from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, ToolCall, Turn
from orchestrator.providers.body import (
    build_error,
    invalid_response,
    is_error_body,
    opt_list,
    opt_map,
    opt_str,
    req_map,
)
from orchestrator.providers.cohere_request import (
    CHAT_PATH,
    PROVIDER,
    build_messages,
    build_settings,
    build_tools,
)
from orchestrator.providers.common import (
    IdSource,
    build_tool_call,
    build_turn,
    clean_tool_name,
    join_text,
    join_thinking,
    parse_finish_reason,
    parse_usage,
)
from orchestrator.providers.controls import build_extra
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.rate_limits import (
    RateLimitSignal,
    parse_retry_after,
    parse_whole,
    read_header,
)
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner, read_stream_text
from orchestrator.providers.structured import ANSWER_TOOL

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "CHAT_PATH",
    "PROVIDER",
    "CohereStreamReader",
    "build_url",
    "error_from_wire",
    "from_stream",
    "from_wire",
    "parse_rate_limits",
    "stream_reader",
    "to_wire",
]

# The part of the text a tool plan is, beside the content blocks' indices (see `CohereStreamReader`).
_PLAN = "plan"
# Cohere's "too many tokens" messages that say the prompt does not fit without stating both sizes, which
# `overflow.mark_context_overflow` does not know: "size limit exceeded by 11326 tokens", "minimal context
# could not be added to prompt (size limit exceeded by 280 tokens)" (Cohere's errors reference).
_OVERFLOW = re.compile(r"too many tokens:.*size limit exceeded by", re.I)
# Cohere's 499: the request was cancelled; its errors reference says to try it again.
_CANCELLED_STATUS = 499
# Trial keys' headers: calls left of a per-minute limit (the rate-limits page), with no reset stated; the
# minute is the longest the limit can take to come back.
_TRIAL_REMAINING = "x-trial-endpoint-call-remaining"
_TRIAL_WINDOW_S = 60.0


# --- request ---------------------------------------------------------------------------------------------


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """`{base_url}/v2/chat`, streamed or not (the body's `stream: true` asks for the SSE stream); the model
    is named in the body."""
    del model, stream  # one URL for every call
    return f"{base_url}{CHAT_PATH}"


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The v2 Chat request body for `request` (pure); with `stream`, one asking for the SSE stream. Messages,
    tools, settings and an output schema: `cohere_request`; `extra` is merged last."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": build_messages(request),
        **build_settings(request),
        **build_tools(request),
    }
    if stream:
        body["stream"] = True
    return build_extra(body, request.settings)


# --- errors and rate limits ------------------------------------------------------------------------------


def error_from_wire(
    status: int | None, body: object, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A ProviderError from a Cohere error body, `{"id": ..., "message": ...}`: 429 (with Retry-After),
    5xx and 499 (cancelled) are retryable, other 4xx not; a prompt too long for the model is
    `context_length_exceeded`. The body's `id` is the request id when no header names one."""
    error = build_error(PROVIDER, status, body, headers)
    update: dict[str, Any] = {}
    if status == _CANCELLED_STATUS:
        update["retryable"] = True
    if error.code != CONTEXT_LENGTH_EXCEEDED and _OVERFLOW.search(error.message):
        update.update(code=CONTEXT_LENGTH_EXCEEDED, retryable=False)
    if error.request_id is None and isinstance(body, dict) and isinstance(body.get("id"), str) and body["id"]:
        update["request_id"] = body["id"]
    return error.model_copy(update=update) if update else error


def parse_rate_limits(status: int | None, headers: Mapping[str, str], now: float) -> RateLimitSignal:
    """What Cohere's headers say of its limits: `retry-after` (seconds) and, for trial keys,
    `x-trial-endpoint-call-remaining` (calls left this minute; at most a minute until they are whole
    again); a 429 is a refusal. Production keys get no such headers. `now` is unused."""
    del now
    remaining = parse_whole(read_header(headers, _TRIAL_REMAINING))
    return RateLimitSignal(
        refused=status == 429,
        retry_after_s=parse_retry_after(read_header(headers, "retry-after")),
        requests_remaining=remaining,
        requests_reset_s=_TRIAL_WINDOW_S if remaining is not None else None,
    )


# --- response -> Turn ------------------------------------------------------------------------------------


def from_wire(body: object, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from one v2 chat response; a ProviderError for an error or malformed body."""
    if is_error_body(body):
        return error_from_wire(None, body)
    try:
        response = req_map(body, "response")
        return _build(opt_map(response.get("message"), "message"), response, ids or IdSource())
    except MalformedBody as exc:
        return invalid_response(PROVIDER, f"malformed Cohere response: {exc}")


def _build(message: dict[str, Any], response: dict[str, Any], ids: IdSource) -> Turn:
    texts: list[str] = []
    thoughts: list[str] = []
    tool_plan = opt_str(message.get("tool_plan"), "message.tool_plan")
    if tool_plan:
        texts.append(tool_plan)
    for index, raw in enumerate(opt_list(message.get("content"), "message.content")):
        block = req_map(raw, f"message.content[{index}]")
        if block.get("type") == "thinking":
            thoughts.append(opt_str(block.get("thinking"), f"message.content[{index}].thinking") or "")
        else:
            texts.append(opt_str(block.get("text"), f"message.content[{index}].text") or "")
    calls = [
        _read_tool_call(req_map(raw, f"message.tool_calls[{i}]"), ids)
        for i, raw in enumerate(opt_list(message.get("tool_calls"), "message.tool_calls"))
    ]
    usage = opt_map(response.get("usage"), "usage")
    counts = usage.get("tokens") if usage.get("tokens") is not None else usage.get("billed_units")
    provider_data: dict[str, Any] = {}
    if tool_plan:
        provider_data["tool_plan"] = tool_plan
    response_id = opt_str(response.get("id"), "id")
    if response_id:
        provider_data["response_id"] = response_id
    return build_turn(
        PROVIDER,
        # The plan and the text blocks are separate sentences; a blank line keeps them apart.
        text=join_text(texts, "\n\n"),
        thinking=join_thinking(thoughts),
        tool_calls=calls,
        usage=parse_usage(opt_map(counts, "usage.tokens"), cache_read_tokens=usage.get("cached_tokens")),
        model=opt_str(response.get("model"), "model"),
        finish_reason=parse_finish_reason(opt_str(response.get("finish_reason"), "finish_reason")),
        provider_data=provider_data,
    )


def _read_tool_call(tool_call: dict[str, Any], ids: IdSource) -> ToolCall:
    function = opt_map(tool_call.get("function"), "tool_call.function")
    return build_tool_call(
        ids,
        opt_str(tool_call.get("id"), "tool_call.id"),
        opt_str(function.get("name"), "tool_call.function.name"),
        function.get("arguments"),
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one streamed answer (`CohereStreamReader`); for a request with an output schema, one
    that streams the answer tool's arguments as the answer's text."""
    answer_tool = ANSWER_TOOL if request is not None and request.output_schema is not None else None
    return CohereStreamReader(answer_tool=answer_tool)


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole v2 chat SSE stream (`message-start` … `message-end`), accumulated."""
    return read_stream_text(stream_reader(), text, ids)


class CohereStreamReader(StreamReader):
    """A v2 chat stream: deltas per event, the Turn `from_wire` gives for the same answer once `message-end`
    came (see the module)."""

    provider = PROVIDER
    stream_name = "Cohere stream"

    def __init__(self, *, answer_tool: str | None = None) -> None:
        super().__init__()
        # With an output schema offered as the answer tool (`structured`), that tool's arguments are the
        # answer: they stream as text, and the tool is never announced as a call.
        self.answer_tool = answer_tool
        self.answer_index: int | None = None
        self.response: dict[str, Any] = {}
        self.plan: list[str] = []
        self.blocks: dict[int, dict[str, Any]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.announced: set[int] = set()
        self.ended = False
        self.joiner = ThinkingJoiner()
        # The text part (the plan, or a block's index) the last text piece belonged to, and whether any
        # text came: a new part's first piece carries the blank line `_build` puts between parts.
        self.text_part: object = None
        self.any_text = False

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        if is_error_body(payload) or event_name == "error":
            return error_from_wire(None, payload)
        event = req_map(payload, "stream event")
        if "type" not in event and isinstance(event.get("message"), str):
            return error_from_wire(None, event)  # Cohere's error body, `{"id", "message"}`, as an event
        if event.get("type") == "message-end":
            delta = opt_map(event.get("delta"), "message-end.delta")
            failure = opt_str(delta.get("error"), "message-end.delta.error")
            if failure:
                return _generation_error(failure, delta.get("finish_reason"))
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        kind = payload.get("type")
        delta = opt_map(payload.get("delta"), f"{kind}.delta")
        message = opt_map(delta.get("message"), f"{kind}.delta.message")
        if kind == "message-start":
            self.response["id"] = opt_str(payload.get("id"), "message-start.id")
        elif kind == "tool-plan-delta":
            piece = opt_str(message.get("tool_plan"), "tool-plan-delta.tool_plan") or ""
            self.plan.append(piece)
            return self._add_text(_PLAN, piece)
        elif kind in ("content-start", "content-delta"):
            return self._add_content(_index(payload), opt_map(message.get("content"), f"{kind}.content"))
        elif kind in ("tool-call-start", "tool-call-delta"):
            return self._add_call(_index(payload), opt_map(message.get("tool_calls"), f"{kind}.tool_calls"))
        elif kind == "message-end":
            self.ended = True
            self.response["finish_reason"] = delta.get("finish_reason")
            self.response["usage"] = delta.get("usage")
        return []

    def _add_text(self, part: object, piece: str) -> list[Delta]:
        if not piece:
            return []
        prefix = ""
        if part != self.text_part:
            prefix = "\n\n" if self.any_text else ""
            self.text_part = part
        self.any_text = True
        return [TextDelta(prefix + piece)]

    def _add_content(self, index: int, piece: dict[str, Any]) -> list[Delta]:
        block = self.blocks.setdefault(index, {})
        kind = opt_str(piece.get("type"), "content.type")
        text = opt_str(piece.get("text"), "content.text")
        thinking = opt_str(piece.get("thinking"), "content.thinking")
        if kind:
            block["type"] = kind
        elif "type" not in block and (text is not None or thinking is not None):
            # A block whose start named no type is what its first piece carries.
            block["type"] = "thinking" if text is None else "text"
        if block.get("type") == "thinking":
            block["thinking"] = block.get("thinking", "") + (thinking or "")
            return self.joiner.add(index, thinking or "")
        block["text"] = block.get("text", "") + (text or "")
        return self._add_text(index, text or "")

    def _add_call(self, index: int, piece: dict[str, Any]) -> list[Delta]:
        call = self.calls.setdefault(index, {})
        for key in ("id", "type"):
            if piece.get(key) is not None:
                call[key] = piece[key]
        function = opt_map(piece.get("function"), "tool_calls.function")
        held = call.setdefault("function", {})
        name = opt_str(function.get("name"), "tool_calls.function.name")
        if name:
            held["name"] = name
        fragment = opt_str(function.get("arguments"), "tool_calls.function.arguments") or ""
        held["arguments"] = held.get("arguments", "") + fragment
        deltas: list[Delta] = []
        if name and index not in self.announced and index != self.answer_index:
            if name == self.answer_tool:
                self.answer_index = index
            else:
                self.announced.add(index)
                call_id = call.get("id")
                deltas.append(
                    ToolCallDelta(
                        len(self.announced) - 1,
                        clean_tool_name(name),
                        call_id if isinstance(call_id, str) and call_id else None,
                    )
                )
        if index == self.answer_index and fragment:
            deltas.append(TextDelta(fragment))
        return deltas

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.ended:
            return self.cut("ended before message-end")
        message = {
            "tool_plan": "".join(self.plan),
            "content": [self.blocks[i] for i in sorted(self.blocks)],
            "tool_calls": [self.calls[i] for i in sorted(self.calls)],
        }
        return _build(message, self.response, ids)


def _index(event: Mapping[str, Any]) -> int:
    value = event.get("index")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 10_000:
        raise MalformedBody(
            f"{event.get('type')}.index", f"expected a small non-negative integer, got {value!r}"
        )
    return value


def _generation_error(message: str, finish_reason: object) -> ProviderError:
    # A generation that failed on Cohere's side ("ERROR": an internal error, "TIMEOUT": it ran out of time)
    # is worth asking again, unless what failed is a prompt too long for the model.
    kind = finish_reason.lower() if isinstance(finish_reason, str) and finish_reason else "error"
    error = error_from_wire(None, {"type": kind, "message": message})
    return error if error.code == CONTEXT_LENGTH_EXCEEDED else error.model_copy(update={"retryable": True})


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


_EVENTS = frozenset(
    {"message-start", "content-start", "content-delta", "tool-plan-delta", "tool-call-start", "message-end"}
)
# The keys only Ollama's /api/chat answers carry beside their `message`.
_OLLAMA_KEYS = frozenset({"done", "done_reason", "created_at", "eval_count", "prompt_eval_count"})


def sniff_body(body: object) -> bool:
    """True for a v2 chat response: a `message` with a tool plan or content blocks, or a `finish_reason`."""
    if not isinstance(body, dict) or not isinstance(body.get("message"), dict) or body.keys() & _OLLAMA_KEYS:
        return False
    message: dict[str, Any] = body["message"]
    return "tool_plan" in message or isinstance(message.get("content"), list) or "finish_reason" in body


def sniff_event(event_name: str | None, data: object) -> bool:
    """True for a v2 chat stream event, by its SSE name or its `type`."""
    kind = data.get("type") if isinstance(data, dict) else None
    return bool({event_name, kind if isinstance(kind, str) else None} & _EVENTS)


def sniff_error(body: dict[str, Any]) -> bool:
    """Never: Cohere's error (`{"message": ...}`) has no shape of its own to tell it by."""
    del body
    return False
