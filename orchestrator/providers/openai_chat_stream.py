"""The Chat Completions stream (`stream: true`), read chunk by chunk (see `stream_reader`).

Text (content strings, text parts, refusals) is one piece list in arrival order, so the text deltas add up
to the Turn's text exactly; reasoning (`reasoning_content`, `reasoning`, thinking parts) is one thinking
part. Tool-call deltas accumulate by `index` (servers that omit it start a call with its id and continue the
last one without); a call is announced once its name is known, its `index` being the wire's. Usage comes
from the final usage chunk (`stream_options.include_usage`). A stream is whole once it has sent a
`finish_reason` or `[DONE]`; one that ends before either was cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import is_error_body, opt_list, opt_map, opt_str, req_map
from orchestrator.providers.common import (
    IdSource,
    build_tool_call,
    build_turn,
    clean_tool_name,
    join_text,
    join_thinking,
    parse_finish_reason,
)
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.openai_chat_response import (
    PROVIDER,
    REASONING_FIELDS,
    error_from_wire,
    parse_chat_usage,
    parse_content,
    parse_raw_calls,
)
from orchestrator.providers.stream_reader import StreamReader, ThinkingJoiner


@dataclass
class _CallDelta:
    id: str = ""
    name: str = ""
    arguments: str = ""
    arguments_object: object = None
    announced: bool = False


class ChatStreamReader(StreamReader):
    """A Chat Completions stream: deltas per chunk, the Turn at the end."""

    provider = PROVIDER
    stream_name = "Chat Completions stream"

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.joiner = ThinkingJoiner()
        self.calls: dict[int, _CallDelta] = {}
        self.finish_reason: object = None
        self.usage: object = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.seen_chunk = False
        self.done = False

    def read_done(self) -> None:
        self.done = True

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        if is_error_body(payload) or event_name == "error":
            return error_from_wire(None, payload)
        return None

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        self.seen_chunk = True
        self.model = self.model or opt_str(payload.get("model"), "chunk.model")
        self.response_id = self.response_id or opt_str(payload.get("id"), "chunk.id")
        if payload.get("usage") is not None:
            self.usage = payload["usage"]
        deltas: list[Delta] = []
        for raw in opt_list(payload.get("choices"), "chunk.choices"):
            choice = req_map(raw, "chunk.choices[]")
            if choice.get("index", 0) != 0:
                continue
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            deltas += self._read_delta(opt_map(choice.get("delta"), "chunk.delta"))
        return deltas

    def _read_delta(self, delta: dict[str, Any]) -> list[Delta]:
        text, thinking = parse_content(delta.get("content"))
        thinking += [delta[name] for name in REASONING_FIELDS if isinstance(delta.get(name), str)]
        text.append(opt_str(delta.get("refusal"), "delta.refusal") or "")
        deltas: list[Delta] = []
        for piece in thinking:
            self.thinking.append(piece)
            deltas += self.joiner.add(0, piece)
        for piece in text:
            if piece:
                self.text.append(piece)
                deltas.append(TextDelta(piece))
        for raw in parse_raw_calls(delta):
            deltas += self._read_call_delta(req_map(raw, "delta.tool_calls[]"))
        return deltas

    def _read_call_delta(self, delta: dict[str, Any]) -> list[Delta]:
        index = delta.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = self._index_without_index(delta.get("id"))
        call = self.calls.setdefault(index, _CallDelta())
        call_id = delta.get("id")
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = opt_map(delta.get("function"), "delta.function")
        name = opt_str(function.get("name"), "delta.function.name") or ""
        # Some servers repeat the whole name in every delta; OpenAI sends it once.
        if name and name != call.name:
            call.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments += arguments
        elif arguments is not None:
            call.arguments_object = arguments
        if call.announced or not call.name:
            return []
        call.announced = True
        return [ToolCallDelta(index, clean_tool_name(call.name), call.id or None)]

    def _index_without_index(self, call_id: object) -> int:
        if isinstance(call_id, str) and call_id:
            known = [i for i, c in self.calls.items() if c.id == call_id]
            return known[0] if known else len(self.calls)
        return max(self.calls, default=0)

    def build(self, ids: IdSource) -> Turn | ProviderError:
        if not self.seen_chunk:
            return self.cut("was empty: no chunk")
        if not self.done and self.finish_reason is None:
            return self.cut("ended before its finish_reason")
        calls = [
            build_tool_call(
                ids, c.id, c.name, c.arguments_object if c.arguments_object is not None else c.arguments
            )
            for _, c in sorted(self.calls.items())
        ]
        return build_turn(
            PROVIDER,
            text=join_text(self.text),
            thinking=join_thinking(["".join(self.thinking)]),
            tool_calls=calls,
            usage=parse_chat_usage(self.usage),
            model=self.model,
            finish_reason=parse_finish_reason(self.finish_reason),
            provider_data={"response_id": self.response_id} if self.response_id else {},
        )
