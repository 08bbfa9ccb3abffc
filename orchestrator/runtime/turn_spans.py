"""A turn's span in the orchestrator that owns it, and the driver that opens and closes it.

`TurnSpans` holds one `invoke_agent toolloop` span per turn this process owns — the GenAI conventions' span of
one agent invocation, whose children are the `chat` spans of its model calls and the `execute_tool` spans of
its tool calls, which is what a turn is. The span begins when the turn is claimed or taken over, as a child of
the trace context stored with the turn (its submitter's), and ends when the turn finishes or leaves this
process (released while stopping, or its lease lost). A turn resumed by another orchestrator gets a new span
in the same trace, with a link to the previous owner's span, whose context is kept under
`keys.turn_trace` (a turn submitted outside any trace continues its first owner's instead, as a child).

Synthetic outcomes (a deadline, a lost worker, a stop: answers no tool gave) are events on the turn span.

With tracing off (`workers.tracing.get_tracer` None), every method returns at once: no span, no Redis call.
The driver opens and closes the spans (`runtime.traced.TracingTurnDriver`); the performer parents each model
call's span on its turn's, and the publisher puts the turn span's context in each tool task's headers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from redis.asyncio import Redis

from orchestrator.machine.state import TurnState
from orchestrator.outage import REDIS_ERRORS
from workers import keys
from workers.contract import ToolOutcome
from workers.tracing import (
    ERROR_TYPE,
    OPERATION,
    TOOL_ATTEMPT,
    TOOL_NAME,
    TOOL_OUTCOME,
    TURN_ID,
    build_carrier,
    extract_carrier,
    get_tracer,
)

log = logging.getLogger("toolloop.tracing")

AGENT_NAME = "toolloop"
TURN_SPAN_NAME = f"invoke_agent {AGENT_NAME}"
SYNTHETIC_EVENT = "toolloop.tool.synthetic_outcome"


class TurnSpans:
    """The open turn spans of one orchestrator, by turn id."""

    def __init__(self, redis: Redis, *, ttl_s: int = keys.TURN_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._open: dict[str, Span] = {}

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._open

    async def begin(self, turn_id: str, *, how: str, orchestrator_id: str) -> None:
        """Open the turn's span (`how`: claimed or taken over), unless tracing is off or it is open."""
        tracer = get_tracer()
        if tracer is None or turn_id in self._open:
            return
        stored, previous = await self._read(turn_id)
        links = [Link(ctx)] if (ctx := _span_context(previous)) is not None else []
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            TURN_ID: turn_id,
            "toolloop.orchestrator.id": orchestrator_id,
            "toolloop.turn.adopted": how,
        }
        # The submitter's trace; a turn submitted outside any goes on in its first owner's.
        parent = extract_carrier(stored) or extract_carrier(previous)
        span = tracer.start_span(
            TURN_SPAN_NAME, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, links=links
        )
        self._open[turn_id] = span
        carrier = build_carrier(trace.set_span_in_context(span))
        if carrier is not None:
            try:
                await self._redis.set(keys.turn_trace(turn_id), json.dumps(carrier), ex=self._ttl_s)
            except REDIS_ERRORS as exc:  # only a later owner's link is lost
                log.debug("turn %s: trace context not stored (%s)", turn_id, exc)

    async def _read(self, turn_id: str) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        # The trace context stored with the request, and the previous owner's span context.
        try:
            request, previous = await self._redis.mget(keys.turn_request(turn_id), keys.turn_trace(turn_id))
        except REDIS_ERRORS as exc:  # the span starts a trace of its own: the turn is never held up
            log.debug("turn %s: trace context not read (%s)", turn_id, exc)
            return None, None
        stored = _json_dict(request).get("trace_context") if request is not None else None
        return (stored if isinstance(stored, dict) else None), (_json_dict(previous) or None)

    def context(self, turn_id: str) -> Context | None:
        """The context whose current span is the turn's (the parent of its model calls); None if none."""
        span = self._open.get(turn_id)
        return None if span is None else trace.set_span_in_context(span)

    def carrier(self, turn_id: str) -> dict[str, str] | None:
        """The turn span's context as message headers (`traceparent`, …) for its tool tasks."""
        span = self._open.get(turn_id)
        return None if span is None else build_carrier(trace.set_span_in_context(span))

    def record_synthetic(self, outcome: ToolOutcome) -> None:
        """A synthetic outcome that became a call's answer: an event on its turn's span."""
        span = self._open.get(outcome.turn_id or "")
        if span is None or not span.is_recording():
            return
        kind = outcome.failure_kind.value if outcome.failure_kind is not None else "failed"
        attributes: dict[str, Any] = {
            TOOL_NAME: outcome.tool,
            "gen_ai.tool.call.id": outcome.call_id,
            TOOL_OUTCOME: kind,
            TOOL_ATTEMPT: outcome.attempts,
            "toolloop.tool.error": outcome.error or "",
        }
        span.add_event(SYNTHETIC_EVENT, attributes)

    def end(self, turn_id: str, state: TurnState | None, *, how: str) -> None:
        """Close the turn's span: how the turn ended (`state` terminal), or how it left (`how`)."""
        span = self._open.pop(turn_id, None)
        if span is None:
            return
        span.set_attribute("toolloop.turn.end", how)
        outcome = state.outcome if state is not None else None
        if outcome is not None:
            span.set_attribute("toolloop.turn.status", outcome.status)
            if outcome.stop_reason is not None:
                span.set_attribute("toolloop.turn.stop_reason", str(outcome.stop_reason))
            span.set_attribute("gen_ai.usage.input_tokens", outcome.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", outcome.usage.output_tokens)
            if outcome.status == "failed":
                kind = outcome.error.type if outcome.error and outcome.error.type else "failed"
                span.set_attribute(ERROR_TYPE, kind)
                span.set_status(Status(StatusCode.ERROR, str(outcome.stop_reason or kind)))
        span.end()

    def end_all(self, *, how: str) -> None:
        """Close every span still open (the process stops)."""
        for turn_id in list(self._open):
            self.end(turn_id, None, how=how)


def _json_dict(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _span_context(carrier: dict[str, Any] | None) -> trace.SpanContext | None:
    context = extract_carrier(carrier)
    if context is None:
        return None
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None
