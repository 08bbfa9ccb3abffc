"""Rules every provider module shares: arguments, finish reasons, usage, ids, names, SSE.

Provider modules call these from their pure `from_wire` / `to_wire` functions; nothing here does I/O.

Design notes: docs/design/providers.md.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.model import FinishReason, ProviderError, ToolCall, Turn, Usage

RETRYABLE_STATUSES = frozenset({408, 409, 429, 529})

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "end_turn": "stop",
    "completed": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "complete": "stop",
    "tool_use": "tool_calls",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_call": "tool_calls",
    "max_tokens": "length",
    "length": "length",
    "max_output_tokens": "length",
    "model_length": "length",
    "content_filter": "content_filter",
    "safety": "content_filter",
    "refusal": "content_filter",
    "recitation": "content_filter",
    "blocklist": "content_filter",
    "prohibited_content": "content_filter",
    "spii": "content_filter",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
    "image_safety": "content_filter",
    "language": "content_filter",
    "model_context_window_exceeded": "length",
}


def parse_finish_reason(raw: object) -> FinishReason | None:
    """Map a provider's finish/stop reason onto the five canonical ones; absent → None."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        return "unknown"
    return _FINISH_REASONS.get(raw.strip().lower(), "unknown")


def _as_count(value: object) -> int:
    # bool is an int subclass; a count of True is nonsense from a malformed body.
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    return 0


def _first_present(data: dict[str, Any], names: tuple[str, ...]) -> object:
    for name in names:
        if name in data and data[name] is not None:
            return data[name]
    return None


INPUT_TOKEN_FIELDS = ("input_tokens", "prompt_tokens", "promptTokenCount", "inputTokens", "prompt_eval_count")
OUTPUT_TOKEN_FIELDS = (
    "output_tokens",
    "completion_tokens",
    "candidatesTokenCount",
    "outputTokens",
    "eval_count",
)
TOTAL_TOKEN_FIELDS = ("total_tokens", "totalTokenCount", "totalTokens")


def parse_usage(
    data: object,
    *,
    reasoning_tokens: object = None,
    cache_read_tokens: object = None,
    cache_write_tokens: object = None,
) -> Usage:
    """Usage from any provider's usage map: missing counts are 0, total derived when absent."""
    if not isinstance(data, dict):
        return Usage()
    input_tokens = _as_count(_first_present(data, INPUT_TOKEN_FIELDS))
    output_tokens = _as_count(_first_present(data, OUTPUT_TOKEN_FIELDS))
    total_raw = _first_present(data, TOTAL_TOKEN_FIELDS)
    total = _as_count(total_raw) if total_raw is not None else input_tokens + output_tokens

    def optional(value: object) -> int | None:
        return None if value is None else _as_count(value)

    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total,
        reasoning_tokens=optional(reasoning_tokens),
        cache_read_tokens=optional(cache_read_tokens),
        cache_write_tokens=optional(cache_write_tokens),
    )


@dataclass(frozen=True)
class ParsedArguments:
    arguments: dict[str, Any]
    raw: str | None
    error: str | None


def parse_arguments(raw: object) -> ParsedArguments:
    """Arguments as a dict whatever the provider sent.

    A JSON string and an object normalise identically; "null", "" and None mean {}. Invalid JSON or JSON
    that is not an object keeps the raw text and an error, so that one call gets a `validation` result
    instead of failing the whole response.
    """
    if raw is None:
        return ParsedArguments({}, None, None)
    if isinstance(raw, dict):
        return ParsedArguments(dict(raw), None, None)
    if isinstance(raw, str):
        text = raw.strip()
        if text in ("", "null"):
            return ParsedArguments({}, raw, None)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return ParsedArguments({}, raw, f"arguments are not valid JSON ({exc.msg} at position {exc.pos})")
        if value is None:
            return ParsedArguments({}, raw, None)
        if not isinstance(value, dict):
            return ParsedArguments({}, raw, f"arguments must be a JSON object, not {_json_type(value)}")
        return ParsedArguments(value, raw, None)
    raw_text = json.dumps(raw) if isinstance(raw, list | int | float | bool) else str(raw)
    return ParsedArguments({}, raw_text, f"arguments must be a JSON object, not {_json_type(raw)}")


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


# A tool name is letters, digits, '_', '-', '.', ':' ; a leaked special token such as
# "search<|channel|>commentary" is cut back to the valid prefix.
_VALID_NAME_PREFIX = re.compile(r"^[A-Za-z0-9_.:\-]+")


def clean_tool_name(raw: object) -> str:
    if not isinstance(raw, str):
        return ""
    name = raw.strip()
    match = _VALID_NAME_PREFIX.match(name)
    return match.group(0) if match else name


class IdSource:
    """Synthesises tool-call ids that are unique across a whole turn, not per response.

    Pass one instance through every normalisation of a turn; the default makes ids unique per process by
    a random run prefix plus a counter, which is unique across turns too.
    """

    def __init__(self, prefix: str | None = None) -> None:
        self._prefix = prefix or f"call_{uuid.uuid4().hex[:12]}"
        self._counter = itertools.count(1)
        self._seen: set[str] = set()

    def next_id(self) -> str:
        """A fresh synthetic id, never handed out before by this source."""
        new_id = f"{self._prefix}_{next(self._counter)}"
        self._seen.add(new_id)
        return new_id

    def ensure(self, provider_id: object) -> str:
        """The provider's id when it gave a non-empty string not seen before in this turn, else a fresh one.

        A repeated id would make two calls share one answer, so the second gets a new id.
        """
        if isinstance(provider_id, str) and provider_id.strip() and provider_id not in self._seen:
            self._seen.add(provider_id)
            return provider_id
        return self.next_id()


def build_tool_call(ids: IdSource, provider_id: object, name: object, raw_arguments: object) -> ToolCall:
    """A canonical ToolCall from a provider's id, name and arguments in whatever form they came."""
    parsed = parse_arguments(raw_arguments)
    return ToolCall(
        id=ids.ensure(provider_id),
        name=clean_tool_name(name),
        arguments=parsed.arguments,
        raw_arguments=parsed.raw,
        arguments_error=parsed.error,
    )


def build_turn(
    provider: str,
    *,
    text: str | None,
    thinking: str | None,
    tool_calls: list[ToolCall],
    usage: Usage,
    model: str | None,
    finish_reason: FinishReason | None,
    provider_data: dict[str, Any] | None = None,
) -> Turn:
    """A Turn whose `type` comes from the presence of tool calls, never from finish_reason."""
    return Turn(
        type="tool_calls" if tool_calls else "final_answer",
        text=text or None,
        thinking=thinking or None,
        tool_calls=tool_calls,
        usage=usage,
        model=model or None,
        finish_reason=finish_reason,
        provider=provider,
        provider_data=provider_data or {},
    )


def join_text(parts: list[str], separator: str = "") -> str | None:
    """Visible text parts joined in order; None when there is none."""
    kept = [p for p in parts if p]
    return separator.join(kept) if kept else None


def join_thinking(parts: list[str]) -> str | None:
    """Thinking parts joined by a blank line."""
    kept = [p.strip("\n") for p in parts if p and p.strip()]
    return "\n\n".join(kept) if kept else None


def is_retryable_status(status: int | None) -> bool:
    """429, 408, 409, 5xx and 529 are retryable; transport errors (status None) too."""
    if status is None:
        return True
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms style) header value; None when absent or a date."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return max(seconds, 0.0)


def transport_error(provider: str, message: str) -> ProviderError:
    """A ProviderError for a failure with no HTTP response (connect error, timeout): always retryable."""
    return ProviderError(
        provider=provider, status=None, type="transport_error", message=message, retryable=True
    )


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str


class SSEDecoder:
    """Server-sent events from text fed as it arrives (LF, CR or CRLF lines), in order.

    Text may be split anywhere, even between the CR and LF of one line end: a trailing CR is held back until
    the next piece says whether an LF follows. Comment lines and `id:`/`retry:` fields are ignored;
    multi-line data is joined with newlines. Work is per line, never per character.
    """

    def __init__(self) -> None:
        # The unfinished last line, in pieces: a long line arriving in many chunks is joined once.
        self._tail: list[str] = []
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, text: str) -> list[SSEEvent]:
        """The events completed by `text` (possibly none)."""
        if "\n" not in text and "\r" not in text:
            self._tail.append(text)
            return []
        text = "".join([*self._tail, text])
        held = ""
        if text.endswith("\r"):
            text, held = text[:-1], "\r"
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self._tail = [lines.pop() + held]
        return self._read_lines(lines)

    def close(self) -> list[SSEEvent]:
        """The events left at the end of the body: a last line and an event without a closing blank line."""
        tail = "".join(self._tail)
        events = self._read_lines(tail.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
        self._tail = []
        if self._data:
            events.append(SSEEvent(self._event, "\n".join(self._data)))
        self._event, self._data = None, []
        return events

    def _read_lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if line == "":
                if self._data:
                    events.append(SSEEvent(self._event, "\n".join(self._data)))
                self._event, self._data = None, []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    self._data.append(value.removeprefix(" "))
                elif field == "event":
                    self._event = value.removeprefix(" ")
        return events


def parse_sse(body: str) -> Iterator[SSEEvent]:
    """Server-sent events from a whole text/event-stream body (LF or CRLF), in order (see `SSEDecoder`)."""
    decoder = SSEDecoder()
    yield from decoder.feed(body)
    yield from decoder.close()
