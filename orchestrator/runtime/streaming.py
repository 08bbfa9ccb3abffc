"""A model call's answer on the turn's event stream while the model writes it.

A `CallStream` is the `DeltaSink` of one model call. The pieces the provider streams are buffered and
written as few events as a reader needs: every `flush_s` (TOOLLOOP_STREAM_FLUSH_S, 0.2 s — five events a
second of a model writing, whatever its speed; `make bench` counts them per turn), one `text_delta` /
`thinking_delta` per run of pieces, and a `tool_call_started` as soon as a streamed call's name is known.
Nothing of it enters the turn's state: the events are a preview, and the Turn the call ends with is the
record. `finish` makes the two agree:

- an answer: what was still buffered, then whatever the text deltas did not say. A provider that did not
  stream (or a `stream: false` turn) gets its whole text as one `text_delta`; a normaliser that reshaped
  the streamed text (thinking tags moved out of it) gets `model_stream_reset` and the text again. So the
  `text` of one call's `text_delta`s always concatenates exactly to that call's text;
- a failure after something was shown: `model_stream_reset`, so that a page drops it before the retry.

`finish` returns those last events rather than writing them: the runtime writes them first in the step
that records the answer (`ModelResponded.preview`), in its one round trip instead of one more of their own.
The ticker's first write goes out as soon as the provider's reader waits for the network, not on a clock:
an answer that comes whole (a fast model, a cached one, a reply not streamed) is parsed to its end without
the reader waiting, so it costs no write of its own, while the first piece of a streamed answer reaches its
readers with no delay added to the model's own.

Writing never holds up the model: the provider's reader only appends to a buffer, a ticker task writes.
A write that fails (Redis away, full, slow past `WRITE_TIMEOUT_S`) drops that event — the outcome and the
state never depend on it — and is logged once per call.

Design notes: docs/design/streaming.md, "Model deltas".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta

log = logging.getLogger("toolloop.orchestrator")

TEXT_DELTA = "text_delta"
THINKING_DELTA = "thinking_delta"
TOOL_CALL_STARTED = "tool_call_started"
MODEL_STREAM_RESET = "model_stream_reset"
# A delta event holds at most this much text: a model that writes a book between two flushes still makes
# events a page can take in one piece.
MAX_EVENT_CHARS = 8_000
WRITE_TIMEOUT_S = 2.0

Events = list[tuple[str, dict[str, Any]]]

Append = Callable[[Sequence[tuple[str, Mapping[str, Any]]]], Awaitable[object]]
"""Appends events (name, data), in order, to the turn's stream in one write; may raise `redis.RedisError`."""


@dataclass
class _Shown:
    """What the events of this call have said so far."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    anything: bool = False


class CallStream:
    """The delta events of model call `llm_call` of one turn; `on_delta` is its sink, `finish` its end."""

    def __init__(
        self, append: Append, llm_call: int, *, flush_s: float, id_prefix: str | None = None
    ) -> None:
        self._append = append
        self._llm_call = llm_call
        self._flush_s = flush_s
        self._id_prefix = id_prefix
        self._pending: Events = []
        self._shown = _Shown()
        self._unnamed_calls = 0
        self._lock = asyncio.Lock()
        self._ticker: asyncio.Task[None] | None = None
        self._failed = False

    async def on_delta(self, delta: Delta) -> None:
        """Buffer one piece of the answer (never waits for Redis)."""
        match delta:
            case TextDelta(text=text):
                self._buffer_text(TEXT_DELTA, text)
            case ThinkingDelta(text=text):
                self._buffer_text(THINKING_DELTA, text)
            case ToolCallDelta():
                self._pending.append((TOOL_CALL_STARTED, self._call_started(delta)))
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name=f"stream-{self._llm_call}")

    async def finish(self, result: Turn | ProviderError) -> Events:
        """End the call's stream: the events, in order, that make it agree with `result` (see the module's
        docstring), for the caller to write with the step that records `result`."""
        async with self._lock:
            # Stopped only between two writes (it needs the lock to write): one cancelled mid-write could have
            # reached Redis without being counted as shown, and its text would be sent twice.
            if self._ticker is not None:
                self._ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._ticker
            pending, self._pending = self._pending, []
            if isinstance(result, ProviderError):
                return [(MODEL_STREAM_RESET, {"llm_call": self._llm_call})] if self._shown.anything else []
            self._mark_shown(pending)
            return [*pending, *self._reconcile(result)]

    # --- buffering -------------------------------------------------------------------------------------

    def _buffer_text(self, name: str, text: str) -> None:
        if not text:
            return
        if self._pending and self._pending[-1][0] == name:
            data = self._pending[-1][1]
            if len(data["text"]) + len(text) <= MAX_EVENT_CHARS:
                data["text"] += text
                return
        self._pending.append((name, {"llm_call": self._llm_call, "text": text}))

    def _call_started(self, delta: ToolCallDelta) -> dict[str, Any]:
        call_id = delta.call_id
        if call_id is None:
            # The id the normaliser will synthesise (`IdSource`): `<id_prefix>_<n>`, n-th call without one.
            self._unnamed_calls += 1
            call_id = f"{self._id_prefix}_{self._unnamed_calls}" if self._id_prefix else None
        return {"llm_call": self._llm_call, "call_id": call_id, "tool": delta.tool}

    async def _tick(self) -> None:
        # The task runs first when the reader that buffered the first piece waits (tasks do not preempt one
        # another); one more turn of the loop lets a reader woken by the rest of a whole answer go first.
        await asyncio.sleep(0)
        while True:
            async with self._lock:
                await self._flush()
            await asyncio.sleep(self._flush_s)

    async def _flush(self) -> None:
        # Everything buffered goes out in one write: each round trip costs the orchestrator more CPU than
        # the events it carries.
        pending, self._pending = self._pending, []
        if pending and await self._write_all(pending):
            self._mark_shown(pending)

    def _mark_shown(self, events: Events) -> None:
        for name, data in events:
            if name != TOOL_CALL_STARTED:
                shown = self._shown.text if name == TEXT_DELTA else self._shown.thinking
                shown.append(data["text"])

    # --- the end ---------------------------------------------------------------------------------------

    def _reconcile(self, turn: Turn) -> Events:
        events: Events = []
        text, shown = turn.text or "", "".join(self._shown.text)
        if text != shown and not text.startswith(shown):
            events.append((MODEL_STREAM_RESET, {"llm_call": self._llm_call}))
            self._shown = _Shown()
            shown = ""
        thinking, shown_thinking = turn.thinking or "", "".join(self._shown.thinking)
        if thinking.startswith(shown_thinking) and len(thinking) > len(shown_thinking):
            events += self._text_events(THINKING_DELTA, thinking[len(shown_thinking) :])
        if len(text) > len(shown):
            events += self._text_events(TEXT_DELTA, text[len(shown) :])
        return events

    def _text_events(self, name: str, text: str) -> Events:
        pieces = range(0, len(text), MAX_EVENT_CHARS)
        return [(name, {"llm_call": self._llm_call, "text": text[i : i + MAX_EVENT_CHARS]}) for i in pieces]

    async def _write_all(self, events: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
        try:
            await asyncio.wait_for(self._append(events), WRITE_TIMEOUT_S)
        except (redis.RedisError, TimeoutError) as exc:
            if not self._failed:
                names = ", ".join(dict.fromkeys(name for name, _ in events))
                log.warning("model call %d: %s events dropped (%s)", self._llm_call, names, exc or type(exc))
            self._failed = True
            return False
        self._shown.anything = True
        return True
