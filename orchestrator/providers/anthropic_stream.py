"""The Anthropic Messages event stream (`stream: true`), read event by event (see `stream_reader`).

Content blocks accumulate by index from `content_block_start` and `content_block_delta` (`text_delta`,
`thinking_delta`, `signature_delta`, `input_json_delta`); usage comes from `message_start` and the cumulative
counts of `message_delta`; `message_stop` ends the stream, which is then read as a plain message. Deltas:
text blocks are text, thinking blocks thinking (one part per block; signatures are never thinking), and a
`tool_use` block is announced when it starts, with its id and its position among the calls — except the
answer tool of an output schema, whose input JSON streams as text instead (`structured`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.anthropic_response import PROVIDER, error_from_wire, parse_message
from orchestrator.providers.body import opt_map, opt_str, req_map
from orchestrator.providers.common import IdSource, clean_tool_name
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner

_ACCUMULATED = (("text_delta", "text"), ("thinking_delta", "thinking"), ("signature_delta", "signature"))


class AnthropicStreamReader(StreamReader):
    """A Messages API stream: deltas per event, the Turn once `message_stop` came."""

    provider = PROVIDER
    stream_name = "Anthropic stream"

    def __init__(self, *, answer_tool: str | None = None) -> None:
        super().__init__()
        # With an output schema, the answer is this tool's input (`structured`): its JSON streams as the
        # answer's text, and the tool is never announced as a call.
        self.answer_tool = answer_tool
        self.answer_index: int | None = None
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}
        self.usage: dict[str, Any] = {}
        self.stopped = False
        self.joiner = ThinkingJoiner()
        self.calls = 0

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        event = req_map(payload, "stream event")
        if event.get("type") == "error" or event_name == "error":
            return error_from_wire(None, event)
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        kind = payload.get("type")
        if kind == "message_start":
            self.message = dict(req_map(payload.get("message"), "message_start.message"))
            self.usage.update(opt_map(self.message.get("usage"), "message_start.usage"))
        elif kind == "content_block_start":
            index = _index(payload)
            block = self.blocks[index] = dict(req_map(payload.get("content_block"), "content_block"))
            return self._block_started(index, block)
        elif kind == "content_block_delta":
            return self._add_delta(
                _index(payload), req_map(payload.get("delta"), "content_block_delta.delta")
            )
        elif kind == "message_delta":
            stop = opt_map(payload.get("delta"), "message_delta.delta").get("stop_reason")
            if stop is not None:
                self.message["stop_reason"] = stop
            # message_delta carries cumulative counts: they replace those of message_start.
            self.usage.update(
                {k: v for k, v in opt_map(payload.get("usage"), "usage").items() if v is not None}
            )
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _block_started(self, index: int, block: dict[str, Any]) -> list[Delta]:
        kind = block.get("type")
        if kind == "text":
            text = opt_str(block.get("text"), "content_block.text")
            return [TextDelta(text)] if text else []
        if kind == "thinking":
            return self.joiner.add(index, opt_str(block.get("thinking"), "content_block.thinking") or "")
        if kind == "tool_use" and self.answer_tool is not None and block.get("name") == self.answer_tool:
            self.answer_index = index
            return []
        if kind == "tool_use" and isinstance(block.get("name"), str) and block["name"]:
            self.calls += 1
            call_id = block.get("id")
            tool = clean_tool_name(block["name"])
            return [ToolCallDelta(self.calls - 1, tool, call_id if isinstance(call_id, str) else None)]
        return []

    def _add_delta(self, index: int, delta: dict[str, Any]) -> list[Delta]:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "input_json_delta":
            piece = opt_str(delta.get("partial_json"), "input_json_delta.partial_json") or ""
            self.partial_json[index] = self.partial_json.get(index, "") + piece
            return [TextDelta(piece)] if piece and index == self.answer_index else []
        for delta_type, key in _ACCUMULATED:
            if kind == delta_type:
                piece = opt_str(delta.get(key), f"{kind}.{key}") or ""
                block[key] = str(block.get(key) or "") + piece
                if key == "text":
                    return [TextDelta(piece)] if piece else []
                if key == "thinking":
                    return self.joiner.add(index, piece)
        return []

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.stopped:
            return self.cut("ended before message_stop")
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if block.get("type") == "tool_use" and self.partial_json.get(index, "").strip():
                # A JSON string parses like an object downstream; a broken one is kept per call.
                block["input"] = self.partial_json[index]
            content.append(block)
        return parse_message({**self.message, "content": content, "usage": self.usage}, ids)


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise MalformedBody(f"{event.get('type')}.index", "expected an integer")
    return index
