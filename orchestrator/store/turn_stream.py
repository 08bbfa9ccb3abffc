"""A turn's event stream as typed events: what `Client.stream` / `AsyncClient.stream` yield.

    for event in client.stream(turn_id):
        match event:
            case TextDeltaEvent(text=text):
                print(text, end="", flush=True)
            case ToolProgressEvent(tool=tool, message=message, fraction=fraction):
                ...
            case TurnFinishedEvent(outcome=outcome):
                print(outcome.status)

The events a page or a chat needs have their own class (the answer as it is written, tool calls, progress);
any other event of the turn (`turn_started`, `model_called`, `tool_dispatched`…) comes as an
`OtherEvent` with its name and data, so nothing in the stream is hidden. The last one is always a
`TurnFinishedEvent` holding the turn's outcome (redacted as `Client.get` shows it), read when
`turn_finished` comes — the outcome and that event are stored together, so it is there to read.

The flow (`stream_turn`) is the events' follower (`flows.follow_events`), with the typing on top: the same
for both clients, riding out a Redis restart the same way (resuming after the last event it yielded).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import UnknownTurnError
from orchestrator.model import TurnOutcome
from orchestrator.store import codec, flows, history
from orchestrator.store.codec import TurnEvent
from orchestrator.store.effects import Item, Stream
from orchestrator.store.runner import Done, advance
from orchestrator.store.turn_view import build_shown_outcome


class StreamEvent(BaseModel):
    """What every event carries: its stream id (a `Last-Event-ID`), its turn, and when it was written."""

    model_config = ConfigDict(frozen=True)

    id: str
    turn_id: str
    at: float


class TextDeltaEvent(StreamEvent):
    """A piece of model call `llm_call`'s answer; one call's pieces concatenate exactly to its text."""

    llm_call: int
    text: str


class ThinkingDeltaEvent(StreamEvent):
    """A piece of model call `llm_call`'s reasoning, as the provider shows it."""

    llm_call: int
    text: str


class ToolCallStartedEvent(StreamEvent):
    """A tool call the model is writing: its name is known, its arguments are still coming."""

    llm_call: int
    call_id: str | None = None
    tool: str


class ModelStreamResetEvent(StreamEvent):
    """Drop what was shown of model call `llm_call`: it failed and is retried, or it is written again."""

    llm_call: int


class ToolProgressEvent(StreamEvent):
    """A tool's own report while it runs (`ctx.progress`): a message and, when it knows, a fraction 0..1."""

    call_id: str
    tool: str
    message: str
    fraction: float | None = None


class ToolStartedEvent(StreamEvent):
    """A worker started a call (attempt `attempt`)."""

    call_id: str
    tool: str
    attempt: int = 1
    worker: str | None = None


class ToolFinishedEvent(StreamEvent):
    """A call's outcome arrived (`synthetic`: toolloop answered it — a timeout, a lost worker, a stop)."""

    call_id: str
    tool: str
    ok: bool
    failure_kind: str | None = None
    attempts: int = 0
    duration_ms: float | None = None
    worker: str | None = None
    synthetic: bool = False
    # A failed call's error, its first line (events written before it existed have none).
    error: str | None = None


class CallWaitingEvent(StreamEvent):
    """A call waits for something outside the turn — `waiting_for` "approval": a person's answer
    (`approve`); "client_result": the result of a client-side tool its caller runs (`submit_tool_result`) —
    until `wait_deadline` (epoch seconds), when `on_timeout` ("deny", "approve") answers an approval and a
    client-side tool's call gets a `timeout` outcome."""

    call_id: str
    tool: str
    # Redacted, as every view of the turn shows them.
    arguments: dict[str, Any] = {}
    waiting_for: str = "approval"
    wait_deadline: float
    on_timeout: str = "deny"


class OtherEvent(StreamEvent):
    """Any other event of the turn, by its name, with its data as stored."""

    name: str
    data: dict[str, Any]


class TurnFinishedEvent(StreamEvent):
    """The last event: the turn's outcome."""

    outcome: TurnOutcome


TYPED: dict[str, type[StreamEvent]] = {
    "text_delta": TextDeltaEvent,
    "thinking_delta": ThinkingDeltaEvent,
    "tool_call_started": ToolCallStartedEvent,
    "model_stream_reset": ModelStreamResetEvent,
    "tool_progress": ToolProgressEvent,
    "tool_started": ToolStartedEvent,
    "tool_finished": ToolFinishedEvent,
    "tool_synthesized": ToolFinishedEvent,
    "call_waiting": CallWaitingEvent,
}


def parse_stream_event(event: TurnEvent) -> StreamEvent:
    """The typed event for a stored one; an `OtherEvent` when its name has no class or its data does not
    fit it (an event written by a newer version), so a reader never stops on one."""
    common = {"id": event.id, "turn_id": event.turn_id, "at": event.at}
    kind = TYPED.get(event.name)
    if kind is not None:
        fields = {**event.data, **common}
        if event.name == "tool_synthesized":
            fields["synthetic"] = True
        try:
            return kind.model_validate(fields)
        except ValidationError:
            pass
    return OtherEvent(**common, name=event.name, data=event.data)


def stream_turn(turn_id: str, after: str, *, block_ms: int | None, cap_ms: int) -> Stream[StreamEvent]:
    """Item each event of the turn from `after` on as a typed event, `TurnFinishedEvent` last.

    UnknownTurnError for a turn that does not exist. A stream that ends without `turn_finished` (the turn
    expired meanwhile) ends without it too."""
    events = flows.follow_events(turn_id, after, block_ms=block_ms, cap_ms=cap_ms)
    reply: Any = None
    while not isinstance(step := advance(events, reply), Done):
        if not isinstance(step, Item):
            reply = yield step
            continue
        reply = None
        event: TurnEvent = step.value
        if event.name != codec.TURN_FINISHED:
            yield Item(parse_stream_event(event))
            continue
        outcome: TurnOutcome | None = yield history.get_outcome(turn_id)
        if outcome is None:
            raise UnknownTurnError(turn_id)
        shown = build_shown_outcome(outcome)
        yield Item(TurnFinishedEvent(id=event.id, turn_id=event.turn_id, at=event.at, outcome=shown))
