"""Reading a provider's event stream one SSE event at a time: deltas as they come, the Turn last.

Each streaming provider module (`openai_chat`, `openai_responses`, `anthropic`) has a `StreamReader` subclass
in its `*_stream` module. `add(event)` returns the deltas that event produced, in order; `finish(ids)` builds
the Turn the non-streaming normaliser gives for the same answer, or a ProviderError. The stream's own errors
are values: an error event, a malformed event, or a stream that ended before its terminal event (a retryable
`invalid_response`) set `error`, after which the reader ignores what follows. Nothing here does I/O; the
HTTP loop is `providers.streaming`, and `read_stream_text` reads a whole recorded body.

The text pieces of one stream add up exactly to its Turn's text; `ThinkingJoiner` makes the thinking
pieces add up exactly to `join_thinking` of the thinking parts, holding back the newlines that
join would strip.
"""

from __future__ import annotations

import codecs
from collections.abc import Hashable
from typing import Any, Protocol

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import decode_json, invalid_response, req_map
from orchestrator.providers.common import IdSource, SSEDecoder, SSEEvent, parse_sse
from orchestrator.providers.deltas import Delta, ThinkingDelta


class StreamReader:
    """One provider's stream, event by event: subclasses read payloads; this class decodes, keeps errors."""

    provider = "unknown"
    stream_name = "event stream"

    def __init__(self) -> None:
        self.error: ProviderError | None = None

    def add(self, event: SSEEvent) -> list[Delta]:
        """The deltas `event` produced (none once the stream has failed)."""
        if self.error is not None:
            return []
        data = event.data.strip()
        if not data:
            return []
        if data == "[DONE]":
            self.read_done()
            return []
        payload = decode_json(data, self.provider)
        if isinstance(payload, ProviderError):
            self.error = payload
            return []
        try:
            self.error = self.read_error(event.event, payload)
            if self.error is not None:
                return []
            return self.read_event(req_map(payload, "stream event"))
        except MalformedBody as exc:
            self.error = invalid_response(self.provider, f"malformed {self.stream_name}: {exc}")
            return []

    def finish(self, ids: IdSource | None = None) -> Turn | ProviderError:
        """The Turn accumulated from the whole stream, or why there is none."""
        if self.error is not None:
            return self.error
        try:
            return self.build(ids or IdSource())
        except MalformedBody as exc:
            return invalid_response(self.provider, f"malformed {self.stream_name}: {exc}")

    def cut(self, what: str) -> ProviderError:
        """The error of a stream that ended early: retryable, as a dropped connection is."""
        return invalid_response(self.provider, f"{self.stream_name} {what}", retryable=True)

    # --- what a provider's reader defines ----------------------------------------------------------------

    def read_done(self) -> None:
        """A `data: [DONE]` line (OpenAI's end of stream); ignored unless the provider sends one."""

    def read_error(self, event_name: str | None, payload: object) -> ProviderError | None:
        """The error an event reports, or None for an ordinary event."""
        raise NotImplementedError

    def read_event(self, payload: dict[str, Any]) -> list[Delta]:
        """Accumulate one event; the deltas it produced."""
        raise NotImplementedError

    def build(self, ids: IdSource) -> Turn | ProviderError:
        """The Turn once the stream has ended; a `cut(...)` error when it ended before its terminal event."""
        raise NotImplementedError


def read_stream_text(reader: StreamReader, text: str, ids: IdSource | None = None) -> Turn | ProviderError:
    """The Turn of a whole recorded stream body (what each module's `from_stream` is)."""
    for event in parse_sse(text):
        reader.add(event)
        if reader.error is not None:
            break
    return reader.finish(ids)


class EventDecoder(Protocol):
    """A body's events from its bytes as they arrive: SSE (`SSEByteDecoder`), or a wire module's own framing
    (Bedrock's binary event stream) mapped onto the same `SSEEvent`s. Either raises `ValueError` for bytes
    it cannot read, from `close` too when the body stopped inside an event."""

    def feed(self, chunk: bytes) -> list[SSEEvent]: ...

    def close(self) -> list[SSEEvent]: ...


class SSEByteDecoder:
    """Server-sent events from a body's bytes as they arrive: UTF-8 decoded incrementally (a leading BOM
    dropped), so a character split between two chunks is read whole. Raises UnicodeDecodeError for bytes
    that are not UTF-8, from `close` too when the body stopped inside a character."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        self._sse = SSEDecoder()

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by `chunk`."""
        return self._sse.feed(self._utf8.decode(chunk))

    def close(self) -> list[SSEEvent]:
        """The events left at the end of the body."""
        return [*self._sse.feed(self._utf8.decode(b"", final=True)), *self._sse.close()]


class ThinkingJoiner:
    """Thinking pieces that add up to `join_thinking(parts)` while the parts are still growing.

    `join_thinking` drops blank parts, strips each part's leading and trailing newlines and puts a blank line
    between parts: a part's text is held back until it has something besides whitespace, and its trailing
    newlines until more text follows them.
    """

    def __init__(self) -> None:
        self._part: Hashable = None
        self._started = False
        self._pending = ""
        self._any = False

    def add(self, part: Hashable, piece: str) -> list[Delta]:
        """The delta (none or one) that `piece`, appended to the part keyed `part`, adds to the thinking."""
        if part != self._part:
            self._part, self._started, self._pending = part, False, ""
        if not piece:
            return []
        text = self._pending + piece
        self._pending = ""
        prefix = ""
        if not self._started:
            if not text.strip():
                self._pending = text
                return []
            text = text.lstrip("\n")
            prefix = "\n\n" if self._any else ""
            self._started = self._any = True
        body = text.rstrip("\n")
        self._pending = text[len(body) :]
        return [ThinkingDelta(prefix + body)] if prefix or body else []
