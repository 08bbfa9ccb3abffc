"""The orchestrator side of tracing (`workers.tracing` is the core): a turn's trace from submit to answer.

    submit                 `attach_trace_context`: the caller's current span context stored with the turn
    POST /v1/turns         `continue_http_trace`: the request's `traceparent` (and a server span when this
                           process exports), stored with the turn as `submit` stores its caller's
    the turn               `TurnSpans` (`runtime.turn_spans`): an `invoke_agent toolloop` span per owner,
                           child of the stored context
    each model call        `trace_model_call`: a `chat {model}` span (GenAI conventions), child of the turn's
    each tool task         its message headers carry the turn span's context (`runtime.publish`)

Spans are built only when a provider exports them (`workers.tracing.get_tracer`); otherwise these functions
return at once. Message content is recorded only with TOOLLOOP_TRACE_CONTENT, redacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from orchestrator.machine.events import CallModel
from orchestrator.model import Message, ProviderError, ToolMessage, Turn, TurnRequest
from orchestrator.providers.base import parse_model_ref
from orchestrator.providers.profiles import find_profile
from orchestrator.store.turn_view import build_shown_call, build_shown_messages, build_shown_raw_arguments
from workers.tracing import (
    CONTENT_MAX_CHARS,
    ERROR_TYPE,
    OPERATION,
    build_carrier,
    extract_carrier,
    get_tracer,
    records_content,
)

PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
MAX_TOKENS = "gen_ai.request.max_tokens"
LLM_CALL_INDEX = "toolloop.llm_call.index"


def attach_trace_context(request: TurnRequest) -> TurnRequest:
    """`request` with the caller's current trace context, unless it has one already or there is none.

    Read through the global propagator, so whatever provider the web app set up (or none) decides."""
    if request.trace_context is not None:
        return request
    carrier = build_carrier()
    return request if carrier is None else request.model_copy(update={"trace_context": carrier})


@contextmanager
def continue_http_trace(headers: Mapping[str, str], name: str) -> Iterator[None]:
    """Make the trace of an HTTP request's `traceparent` header the current one while it is handled, under a
    SERVER span `name` when this process exports spans: a turn submitted meanwhile continues it."""
    parent = extract_carrier({k: v for k in ("traceparent", "tracestate") if (v := headers.get(k))})
    tracer = get_tracer()
    if tracer is not None:
        with tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER):
            yield
        return
    token = otel_context.attach(parent) if parent is not None else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


class ChatSpan:
    """The `chat {model}` span of one model call; `record` sets what the answer says."""

    __slots__ = ("_span",)

    def __init__(self, span: Span | None) -> None:
        self._span = span

    # The recorder of no span is its own context manager: with tracing off, the hook costs a lookup.
    def __enter__(self) -> ChatSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def record(self, result: Turn | ProviderError) -> None:
        """Response model, token usage and finish reason of an answer; `error.type` and ERROR of a failure."""
        span = self._span
        if span is None or not span.is_recording():
            return
        if isinstance(result, ProviderError):
            kind = result.type or (str(result.status) if result.status else "provider_error")
            span.set_attribute(ERROR_TYPE, kind)
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            span.set_status(Status(StatusCode.ERROR, result.message[:CONTENT_MAX_CHARS]))
            return
        if result.model:
            span.set_attribute(RESPONSE_MODEL, result.model)
        span.set_attribute(INPUT_TOKENS, result.usage.input_tokens)
        span.set_attribute(OUTPUT_TOKENS, result.usage.output_tokens)
        if result.finish_reason is not None:
            span.set_attribute(FINISH_REASONS, [result.finish_reason])
        if records_content():
            span.set_attribute(OUTPUT_MESSAGES, build_output_messages(result))


NO_CHAT_SPAN = ChatSpan(None)


def trace_model_call(parent: Context | None, command: CallModel) -> AbstractContextManager[ChatSpan]:
    """The CLIENT span `chat {model}` of one model call, child of `parent` (the turn's span); with tracing
    off, `NO_CHAT_SPAN`, which records nothing."""
    tracer = get_tracer()
    if tracer is None:
        return NO_CHAT_SPAN
    return _traced_model_call(tracer, parent, command)


def build_genai_provider(provider: str) -> str:
    """A provider as the GenAI conventions name it (`gen_ai.provider.name`, its profile's `genai_name`): one
    wire format of a vendor is that vendor; a provider they do not name (the scripted model) keeps its own."""
    profile = find_profile(provider)
    return profile.genai_name if profile is not None and profile.genai_name else provider


@contextmanager
def _traced_model_call(tracer: Tracer, parent: Context | None, command: CallModel) -> Iterator[ChatSpan]:
    ref = parse_model_ref(command.model)
    attributes: dict[str, Any] = {
        OPERATION: "chat",
        PROVIDER_NAME: build_genai_provider(ref.provider),
        REQUEST_MODEL: ref.model,
        LLM_CALL_INDEX: command.llm_call_index,
    }
    if command.settings.max_output_tokens is not None:
        attributes[MAX_TOKENS] = command.settings.max_output_tokens
    if records_content():
        attributes[INPUT_MESSAGES] = build_input_messages(command.messages)
        if command.instructions:
            attributes[SYSTEM_INSTRUCTIONS] = command.instructions[:CONTENT_MAX_CHARS]
    with tracer.start_as_current_span(
        f"chat {ref.model}", context=parent, kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield ChatSpan(span)


def build_input_messages(messages: Sequence[Message]) -> str:
    """The messages a model call sends, as a recorded attribute: tool-call arguments, and tool results that
    are JSON, redacted (the keys `turn_view` redacts for a person); provider continuation data left out."""
    shown = [
        m.model_copy(update={"content": build_shown_raw_arguments(m.content)})
        if isinstance(m, ToolMessage)
        else m
        for m in build_shown_messages(messages)
    ]
    dumped = [m.model_dump(mode="json", exclude={"provider_data"}) for m in shown]
    return _cut(json.dumps(dumped, ensure_ascii=False))


def build_output_messages(turn: Turn) -> str:
    """A model's answer as a recorded attribute, its tool calls' arguments redacted."""
    calls = [build_shown_call(c).model_dump(mode="json") for c in turn.tool_calls]
    answer = {"role": "assistant", "content": turn.text, "tool_calls": calls}
    return _cut(json.dumps([answer], ensure_ascii=False))


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_MAX_CHARS else text[: CONTENT_MAX_CHARS - 1] + "…"
