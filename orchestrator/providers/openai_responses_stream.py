"""The Responses API event stream (`stream: true`), read event by event (see `stream_reader`).

Output items are kept by `output_index`, built from `response.output_item.added`, the text, refusal,
reasoning-summary and `function_call_arguments` deltas, and replaced by `.done`; the terminal
`response.completed` / `.incomplete` / `.failed` event normally repeats the whole response, which is then
read as a plain body. Deltas: `output_text` and `refusal` pieces are text, reasoning-summary pieces thinking
(one part per summary), and a `function_call` item is announced when it is added, with its `call_id`. When
the terminal event's output differs from what the deltas said, the Turn follows the terminal event and the
deltas were only a preview.
"""

from __future__ import annotations

import copy
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import opt_str, req_map
from orchestrator.providers.common import IdSource, clean_tool_name
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.openai_responses_response import PROVIDER, error_from_wire, parse_response
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
# An index past this many parts is a corrupt stream, not a reason to allocate a huge list.
_MAX_PARTS = 1000


class ResponsesStreamReader(StreamReader):
    """A Responses API stream: deltas per event, the Turn from the terminal event."""

    provider = PROVIDER
    stream_name = "Responses API stream"

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] = {}
        self.finished = False
        self.joiner = ThinkingJoiner()
        self.announced: set[int] = set()

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        event = req_map(payload, "stream event")
        if event.get("type") == "error" or event_name == "error":
            return error_from_wire(None, {"error": event.get("error", event)})
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        kind = opt_str(payload.get("type"), "event.type")
        if isinstance(payload.get("response"), dict):
            self.response = payload["response"]
            self.finished = self.finished or kind in _TERMINAL_EVENTS
        index = payload.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool):
            return []
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = self.items[index] = copy.deepcopy(req_map(payload.get("item"), f"{kind}.item"))
            return self._announce(index, item)
        item = self.items.setdefault(index, {})
        delta = opt_str(payload.get("delta"), f"{kind}.delta") or ""
        if kind == "response.function_call_arguments.delta":
            item["arguments"] = str(item.get("arguments") or "") + delta
        elif kind == "response.function_call_arguments.done" and isinstance(payload.get("arguments"), str):
            item["arguments"] = payload["arguments"]
        elif kind in _TEXT_DELTAS:
            _append_part(item, payload.get("content_index"), kind, delta)
            return [TextDelta(delta)] if delta else []
        elif kind == "response.reasoning_summary_text.delta":
            summary_index = payload.get("summary_index")
            _append_summary(item, summary_index, delta)
            return self.joiner.add((index, summary_index), delta)
        return []

    def _announce(self, index: int, item: dict[str, Any]) -> list[Delta]:
        name = item.get("name")
        if (
            item.get("type") != "function_call"
            or index in self.announced
            or not isinstance(name, str)
            or not name
        ):
            return []
        self.announced.add(index)
        call_id = item.get("call_id")
        position = len(self.announced) - 1
        tool = clean_tool_name(name)
        return [ToolCallDelta(position, tool, call_id if isinstance(call_id, str) else None)]

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.finished:
            return self.cut("ended before its terminal event")
        response = dict(self.response)
        # The terminal event normally repeats the whole output; the accumulated items stand in when not.
        if not response.get("output"):
            response["output"] = [self.items[i] for i in sorted(self.items)]
        return parse_response(response, ids)


def _append_part(item: dict[str, Any], content_index: object, kind: object, delta: str) -> None:
    item.setdefault("type", "message")
    parts = _slot_list(item, "content")
    field = "refusal" if kind == "response.refusal.delta" else "text"
    part = _slot(parts, content_index, {"type": "refusal" if field == "refusal" else "output_text"})
    part[field] = str(part.get(field) or "") + delta


def _append_summary(item: dict[str, Any], summary_index: object, delta: str) -> None:
    item.setdefault("type", "reasoning")
    part = _slot(_slot_list(item, "summary"), summary_index, {"type": "summary_text", "text": ""})
    part["text"] = str(part.get("text") or "") + delta


def _slot_list(item: dict[str, Any], key: str) -> list[Any]:
    value = item.setdefault(key, [])
    if not isinstance(value, list):
        raise MalformedBody(key, "expected an array")
    return value


def _slot(parts: list[Any], index: object, empty: dict[str, Any]) -> dict[str, Any]:
    position = index if isinstance(index, int) and not isinstance(index, bool) else len(parts)
    if not 0 <= position < _MAX_PARTS:
        raise MalformedBody("stream event index", f"{position} is out of range")
    while len(parts) <= position:
        parts.append(dict(empty))
    part = parts[position]
    if not isinstance(part, dict):
        raise MalformedBody("stream part", "expected an object")
    return part
