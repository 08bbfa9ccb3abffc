"""The Gemini stream (`streamGenerateContent?alt=sse`), read chunk by chunk (see `stream_reader`).

Each SSE event is a whole `GenerateContentResponse` holding the parts that arrived since the last one; the
chunks are kept and, once the stream has ended, merged into the one response `gemini_response` reads
(`build_merged_response`), so the Turn is the one a whole body gives. Deltas on the way: a text part is
text, a `thought: true` part thinking (fragments of one thought are one thinking part, by the rule that
merges them), and a function call, which Gemini sends whole, is announced as it comes, with the id Vertex AI
may give it and its position among the calls — except the answer tool of an output schema, whose arguments
stream as the answer's text instead (`structured`). An error envelope in the stream is its error; a stream
whose last chunk has no `finishReason` (nor a prompt block) was cut.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import is_error_body, opt_list, opt_map, opt_str, req_map
from orchestrator.providers.common import IdSource, clean_tool_name, parse_arguments
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.gemini_response import (
    PROVIDER,
    build_merged_response,
    continues_text_part,
    error_from_wire,
    parse_response,
    read_first_candidate,
)
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner


class GeminiStreamReader(StreamReader):
    """A `streamGenerateContent` stream: deltas per chunk, the Turn of the merged chunks at the end."""

    provider = PROVIDER
    stream_name = "Gemini stream"

    def __init__(self, *, answer_tool: str | None = None) -> None:
        super().__init__()
        # With an output schema beside tools, the answer is this function's arguments (`structured`).
        self.answer_tool = answer_tool
        self.answered = False
        self.chunks: list[dict[str, Any]] = []
        self.joiner = ThinkingJoiner()
        self.calls = 0
        # The last part seen, and the number of the thinking part it belongs to (for the joiner).
        self.last_part: dict[str, Any] | None = None
        self.thought_number = 0

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        if is_error_body(payload) or event_name == "error":
            return error_from_wire(None, payload)
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        self.chunks.append(payload)
        candidate = read_first_candidate(payload, "chunk")
        if candidate is None:
            return []
        content = opt_map(candidate.get("content"), "chunk.candidates[0].content")
        deltas: list[Delta] = []
        for index, raw in enumerate(opt_list(content.get("parts"), "chunk.candidates[0].content.parts")):
            deltas += self._read_part(req_map(raw, f"chunk.parts[{index}]"))
        return deltas

    def _read_part(self, part: dict[str, Any]) -> list[Delta]:
        previous, self.last_part = self.last_part, part
        if part.get("functionCall") is not None:
            return self._read_call(req_map(part["functionCall"], "chunk.functionCall"))
        text = opt_str(part.get("text"), "chunk.text")
        if text is None:
            return []
        if not part.get("thought"):
            return [TextDelta(text)] if text else []
        if previous is None or not continues_text_part(previous, part):
            self.thought_number += 1
        return self.joiner.add(self.thought_number, text)

    def _read_call(self, call: dict[str, Any]) -> list[Delta]:
        name = clean_tool_name(opt_str(call.get("name"), "chunk.functionCall.name"))
        if self.answer_tool is not None and name == self.answer_tool:
            if self.answered:
                return []  # the first answer wins (`structured.read_answer_tool`)
            self.answered = True
            parsed = parse_arguments(call.get("args"))
            # The answer's text as `read_answer_tool` makes it from the call, so that the pieces add up.
            text = parsed.raw if parsed.raw is not None and parsed.raw.strip() else None
            return [TextDelta(text or json.dumps(parsed.arguments, ensure_ascii=False))]
        self.calls += 1
        call_id = opt_str(call.get("id"), "chunk.functionCall.id")
        return [ToolCallDelta(self.calls - 1, name, call_id or None)] if name else []

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.chunks:
            return self.cut("was empty: no chunk")
        merged = build_merged_response(self.chunks)
        if merged is None:
            return self.cut("ended before its final chunk")
        return parse_response(merged, ids)
