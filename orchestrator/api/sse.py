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
from typing import Annotated

from fastapi import Header, HTTPException, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from orchestrator import metrics
from orchestrator.api.connections import ApiRedis, build_failure_reason
from orchestrator.api.fanout import REDIS_FAILURES, Backoff, EventFanout, Subscription
from orchestrator.model import TurnStatus
from orchestrator.store import codec
from orchestrator.store.codec import TurnEvent

# A stream id as a client may give it: `after` and `Last-Event-ID` (anything else is a 422).
STREAM_ID_PATTERN = r"^\d+(-\d+)?$"
# Events read per catch-up read: a stream further behind reads page after page, at its client's pace.
PAGE_EVENTS = 100


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

    Never raises for Redis: a failure is waited out with capped backoff, and the stream goes on after the
    last event it sent."""
    store, position, backoff = api.client.store, _Position(after), Backoff()
    while not position.finished:
        try:
            async with api.gate.slot():
                # Read before the events, as in store.flows.follow_events: a turn that had ended then has
                # its turn_finished in what the read returns, unless it is gone from the stream.
                status: TurnStatus | None = await store.get_status(turn_id)
                page = await store.read_events(turn_id, position.cursor, count=PAGE_EVENTS)
        except REDIS_FAILURES as exc:
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
    deadline, backoff = loop.time() + api.client.settings.api_redis_retry_s, Backoff(cap_s=1.0)
    while True:
        try:
            async with api.gate.slot():
                return await api.client.store.get_status(turn_id)
        except REDIS_FAILURES:
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
    """Server-sent events of the turn after `Last-Event-ID` (or `after`), ending after `turn_finished`."""
    api: ApiRedis = request.app.state.redis
    if await _open_status(api, turn_id) is None:
        raise HTTPException(404, f"unknown turn {turn_id!r}")
    keepalive_s = api.client.settings.api_sse_keepalive_s
    return EventSourceResponse(follow_turn(api, turn_id, last_event_id or after, keepalive_s))
