"""`GET /v1/turns/{id}/events`: a turn's events as server-sent events, riding out Redis restarts (issue 12).

A stream starts after `Last-Event-ID` (what a reconnecting EventSource sends) or, without it, after the
query's `after` ("0": from the first event). Each event goes out with its stream id as the SSE `id`, its
name as `event` and the event as JSON as `data` (`build_sse`); the stream ends after `turn_finished`.

How a stream follows its turn (`follow_turn`): it catches up with paged reads on the request pool, then
subscribes to the process's one events reader (`api_fanout`) for what comes next. When Redis fails
mid-stream the stream stays open: it waits with capped backoff and goes on after the last id it sent, so no
event is lost or sent twice. While nothing comes (Redis away, a quiet turn) it writes a keep-alive comment
every `api_sse_keepalive_s` (TOOLLOOP_API_SSE_KEEPALIVE_S), so proxies do not cut it, and an idle stream
looks at its turn again each time, so a turn that vanished (expired, or Redis came back empty) ends it.

Opening a stream while Redis is away waits up to `api_redis_retry_s` (TOOLLOOP_API_REDIS_RETRY_S) for it,
as a browser's EventSource gives up for good on a 503; past that, the 503 with `Retry-After` every route
gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, HTTPException, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from orchestrator import metrics
from orchestrator.api.connections import ApiRedis, build_failure_reason
from orchestrator.api.fanout import EventFanout, Subscription
from orchestrator.model import TurnStatus
from orchestrator.store import codec
from orchestrator.store.codec import TurnEvent
from orchestrator.store.turn_stream import TYPED, StreamEvent
from workers.redis_errors import REDIS_ERRORS, Backoff

# A stream id as a client may give it: `after` and `Last-Event-ID` (anything else is a 422).
STREAM_ID_PATTERN = r"^\d+(-\d+)?$"
# Events read per catch-up read: a stream further behind reads page after page, at its client's pace.
PAGE_EVENTS = 100

# The event types a turn's stream carries, as the schema documents them (a later version may add others: a
# reader skips a name it does not know). Those `store.turn_stream` types have their `data` fields declared.
EVENT_TYPES: dict[str, str] = {
    "turn_queued": "The turn is stored and queued.",
    "turn_started": (
        "An orchestrator started the turn: its model(s), the tools offered, its deadline, its `tenant`."
    ),
    "turn_resumed": "Another orchestrator took the turn over and goes on from its last saved step.",
    "model_called": "A model call went out (`llm_call_index`, `model`).",
    "text_delta": "A piece of the model's answer as it is written; a call's pieces concatenate to its text.",
    "thinking_delta": "A piece of the model's reasoning, as the provider shows it.",
    "tool_call_started": "The model is writing a tool call: its name is known, its arguments still coming.",
    "model_stream_reset": "Drop what was shown of a model call: it failed and is retried.",
    "model_responded": "A model call answered (`type`, `tool_calls`, `finish_reason`, `usage`).",
    "model_failed": "A model call failed (`status`, `error_type`, `message`, `retryable`).",
    "model_fallback": "The turn moves on to the next model of its list (`from`, `to`).",
    "context_trimmed": "Older history was left out of a model call to fit its context window.",
    "context_exceeded": "A model call was over the context window; it is tried again with less.",
    "context_compacted": "The history before a point was summarised.",
    "context_compaction_failed": "Summarising the history failed; the turn goes on without it.",
    "output_invalid": "An answer did not fit the turn's `output_schema` (`errors`, `retrying`).",
    "model_empty_answer": "The model answered nothing; it is asked again.",
    "approval_requested": "Tool calls wait for a person's approval (`call_ids`).",
    "approval_given": "A person approved or denied a call (`call_id`, `approved`, `edited`).",
    "child_turn_started": (
        "A sub-agent's call started its child turn (`call_id`, `agent`, `child_turn_id`, `depth`)."
    ),
    "child_turn_finished": (
        "A child turn ended; its answer is the call's result (`child_turn_id`, `status`, `ok`)."
    ),
    "child_call_waiting": (
        "A call of a child turn waits for a person (`child_turn_id`, `call_id`, `tool`, `arguments`): it can "
        "be approved through this turn too."
    ),
    "agent_depth_reached": "A sub-agent's call would nest deeper than `max_agent_depth`: it started nothing.",
    "agent_handoff": (
        "The turn goes on as another agent from its next model call (`from_agent`, `to_agent`)."
    ),
    "tool_dispatched": "A tool call was sent to the workers (`call_id`, `tool`, `attempt`, `arguments`).",
    "tool_waiting_for_worker": (
        "A call was sent while no live worker serves its tool, though one did lately (`last_served_at`): it "
        "waits in its queue for the next worker, whose `tool_started` ends the wait."
    ),
    "tool_waiting_for_slot": (
        "A call found its tool's concurrency slots (`max_concurrency`, or per tenant) all held: it waits for "
        "one (`limit`, `max_concurrency`, `running`, `tenant`), and its `tool_started` ends the wait."
    ),
    "tool_started": "A worker started a call.",
    "tool_progress": "A tool's own report while it runs (`message`, `fraction`).",
    "tool_redispatched": "A call whose worker was lost was sent again.",
    "tool_synthesis_requested": "toolloop answers a call itself (a timeout, a lost worker, a stop).",
    "tool_finished": (
        "A call's outcome arrived (`ok`, `failure_kind`, `duration_ms`; a failure's `error`, its first line)."
    ),
    "tool_synthesized": "A call was answered by toolloop rather than by its tool.",
    "late_outcome": "An outcome came after its call was answered otherwise; kept, not used.",
    "turn_stopping": "The turn is stopping (`reason`: cancelled, a limit, the deadline…).",
    "turn_lost": "The turn could not be run any further.",
    "turn_finished": "The last event: the turn is terminal (`status`, `stop_reason`); its outcome is stored.",
}
_EVENT_ENVELOPE = ("id", "turn_id", "at")
EVENTS_DESCRIPTION = """The turn's events as server-sent events, from the first one (or after `after`,
or after `Last-Event-ID` when a client reconnects), ending after `turn_finished`. Each message has the
event's stream id as `id` (send it back as `Last-Event-ID` to resume: nothing is lost or repeated), its
name as `event`, and the event as JSON as `data`: `{"id", "name", "turn_id", "at", "data"}`. Comment lines
keep the connection alive while nothing happens (every `TOOLLOOP_API_SSE_KEEPALIVE_S`). A Redis restart
does not end a stream.

Event types (a later version may add others; skip a name you do not know):

""" + "\n".join(f"- `{name}`: {meaning}" for name, meaning in EVENT_TYPES.items())


def build_event_data_schema(kind: type[StreamEvent] | None) -> dict[str, Any]:
    """The schema of an event's `data` object: a typed event's fields but the envelope's, else any object."""
    if kind is None:
        return {"type": "object", "additionalProperties": True}
    schema = kind.model_json_schema()
    properties = {k: v for k, v in schema["properties"].items() if k not in _EVENT_ENVELOPE}
    required = [k for k in schema.get("required", []) if k not in _EVENT_ENVELOPE]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": True}


def build_event_item_schema(name: str, description: str) -> dict[str, Any]:
    """One SSE message of event type `name`, as OpenAPI 3.2 describes an event-stream item."""
    payload = {
        "type": "object",
        "required": ["id", "name", "turn_id", "at", "data"],
        "properties": {
            "id": {"type": "string", "description": "The event's stream id."},
            "name": {"const": name},
            "turn_id": {"type": "string"},
            "at": {"type": "number", "description": "When it was written (Unix time, s)."},
            "data": build_event_data_schema(TYPED.get(name)),
        },
    }
    return {
        "title": name,
        "description": description,
        "type": "object",
        "required": ["event", "id", "data"],
        "properties": {
            "event": {"const": name},
            "id": {"type": "string", "pattern": STREAM_ID_PATTERN},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
        },
    }


def build_events_content() -> dict[str, Any]:
    """The `text/event-stream` content of the events route: the body as text (OpenAPI 3.1), and each event
    type as an `itemSchema` (OpenAPI 3.2's way, which FastAPI's own SSE routes use)."""
    items = [build_event_item_schema(name, meaning) for name, meaning in EVENT_TYPES.items()]
    return {
        "text/event-stream": {
            "schema": {"type": "string", "description": "Server-sent events, one per turn event."},
            "itemSchema": {"oneOf": items},
        }
    }


def build_sse(event: TurnEvent) -> ServerSentEvent:
    """One SSE message: `event` = the event's name, `id` = its stream id, `data` = the event as JSON."""
    return ServerSentEvent(data=event.model_dump_json(), event=event.name, id=event.id)


def build_keepalive(outage: str | None) -> ServerSentEvent:
    """A comment line that keeps the connection alive, saying why nothing comes when Redis is away."""
    return ServerSentEvent(comment="keep-alive" if outage is None else f"waiting for Redis ({outage})")


@dataclass
class _Position:
    """Where a stream is: the id of the last event it sent, and whether that was `turn_finished`."""

    cursor: str
    finished: bool = False


async def _follow_live(
    fanout: EventFanout, subscription: Subscription, position: _Position, keepalive_s: float
) -> AsyncIterator[ServerSentEvent]:
    # Ends at turn_finished, when detached and drained (the caller catches up), or idle with Redis up.
    while not (subscription.detached and subscription.queue.empty()):
        try:
            async with asyncio.timeout(keepalive_s):
                event = await subscription.queue.get()
        except TimeoutError:
            yield build_keepalive(fanout.outage)
            if fanout.outage is None:
                return  # quiet with Redis up: the caller looks at the turn again
            continue
        yield build_sse(event)
        position.cursor = event.id
        if event.name == codec.TURN_FINISHED:
            position.finished = True
            return


async def follow_turn(
    api: ApiRedis, turn_id: str, after: str, keepalive_s: float
) -> AsyncIterator[ServerSentEvent]:
    """The turn's events after `after` as SSE messages, ending after `turn_finished`; keep-alives between.

    Never raises for Redis: a failure is waited out with capped, jittered backoff, and the stream goes on
    after the last event it sent."""
    store, position, backoff = api.client.store, _Position(after), Backoff(first_s=0.05)
    while not position.finished:
        try:
            async with api.gate.slot():
                # Read before the events, as in store.flows.follow_events: a turn that had ended then has
                # its turn_finished in what the read returns, unless it is gone from the stream.
                status: TurnStatus | None = await store.get_status(turn_id)
                page = await store.read_events(turn_id, position.cursor, count=PAGE_EVENTS)
        except REDIS_ERRORS as exc:
            metrics.record_redis_error("api_stream", exc)
            yield build_keepalive(build_failure_reason(exc))
            await asyncio.sleep(backoff.next_s())
            continue
        backoff.reset()
        for event in page:
            yield build_sse(event)
            position.cursor = event.id
            if event.name == codec.TURN_FINISHED:
                return
        if len(page) == PAGE_EVENTS:
            continue  # further behind: the next page
        if status is None or status.terminal:
            return  # ended (or gone) and its turn_finished no longer in the stream
        subscription = api.fanout.subscribe(turn_id, position.cursor)
        try:
            async for message in _follow_live(api.fanout, subscription, position, keepalive_s):
                yield message
        finally:
            api.fanout.unsubscribe(subscription)


async def _open_status(api: ApiRedis, turn_id: str) -> TurnStatus | None:
    # The turn's status, waiting up to api_redis_retry_s for Redis; past it the last failure (a 503) raises.
    loop = asyncio.get_running_loop()
    # A shorter cap than a stream's: a Redis that flaps is up for moments, and one read is all it takes.
    deadline, backoff = loop.time() + api.client.settings.api_redis_retry_s, Backoff(first_s=0.05, cap_s=1.0)
    while True:
        try:
            async with api.gate.slot():
                return await api.client.store.get_status(turn_id)
        except REDIS_ERRORS:
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise
            await asyncio.sleep(min(backoff.next_s(), left_s))


async def turn_events(
    turn_id: str,
    request: Request,
    after: Annotated[str, Query(pattern=STREAM_ID_PATTERN)] = "0",
    last_event_id: Annotated[str | None, Header(pattern=STREAM_ID_PATTERN)] = None,
) -> EventSourceResponse:
    """Server-sent events of the turn after `Last-Event-ID` (or `after`), ending after `turn_finished`
    (`EVENTS_DESCRIPTION`)."""
    api: ApiRedis = request.app.state.redis
    if await _open_status(api, turn_id) is None:
        raise HTTPException(404, f"unknown turn {turn_id!r}")
    keepalive_s = api.client.settings.api_sse_keepalive_s
    return EventSourceResponse(follow_turn(api, turn_id, last_event_id or after, keepalive_s))
