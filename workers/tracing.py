"""OpenTelemetry tracing, the core both sides share: setting up a process, carrying a trace, the tool span.

Every toolloop process exports spans over OTLP when the standard variables ask for it — and only then:

    setup_tracing(service)    an SDK `TracerProvider` with a batching OTLP exporter, installed as the global
                              one when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
                              is set and `OTEL_SDK_DISABLED` is not true; the SDK itself reads
                              `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, the
                              exporter's headers, timeout and compression, and `OTEL_BSP_*`
    shutdown_tracing()        flush and stop what `setup_tracing` installed

Unset, nothing is installed and `get_tracer()` is None: every call site skips its span altogether (no span
object, no attribute built), which is what "costs nothing measurable" takes. A process that already has an
SDK provider (a web app's own, a tool module's) is left as it is, and toolloop's spans go to that provider.
`Client` never calls `setup_tracing`: inside a web app, the app's own setup decides.

A trace crosses processes as W3C `traceparent`/`tracestate` (the global propagator): `build_carrier` writes
a context into a dict (stored with a turn, sent in a tool task's message headers), `extract_carrier` reads
one back. A tool task's worker span is `execute_tool {tool}` (`trace_tool_call`), a child of the span that
dispatched it, whichever delivery, retry or redelivery runs it: Celery carries the message's headers over to
a retry, and a redelivery is the same message.

Message content (tool arguments and results here, model messages in the orchestrator) is not recorded unless
`TOOLLOOP_TRACE_CONTENT=true`; then it is recorded redacted (`contract.redact`), never for a sensitive tool.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from celery import signals
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec, redact
from workers.progress import WIRE_CALL_ID_SEPARATOR
from workers.run import Decision, Finished, RetryLater, Skipped

log = logging.getLogger("toolloop.tracing")

TRACER_NAME = "toolloop"
# The propagation fields a carrier holds (W3C Trace Context; baggage rides along when a caller set some).
TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
# How long a stopping process waits for its last spans to go out.
FLUSH_TIMEOUT_MS = 5000
# A recorded content attribute is cut to this many characters (a backend refuses or drops huge attributes).
CONTENT_MAX_CHARS = 8192

# GenAI semantic conventions (the attribute names toolloop writes; see the OpenTelemetry GenAI spans).
OPERATION = "gen_ai.operation.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
# toolloop's own.
TURN_ID = "toolloop.turn.id"
CALL_ID = "toolloop.call.id"  # the call's id in Redis and Celery (`<turn id>/<model's call id>`)
TOOL_OUTCOME = "toolloop.tool.outcome"
TOOL_ATTEMPT = "toolloop.tool.attempt"
TOOL_DISPATCH = "toolloop.tool.dispatch"
TOOL_REASON = "toolloop.tool.reason"


class _State:
    """What `setup_tracing` did in this process."""

    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.record_content = False
        self.lock = threading.Lock()


_state = _State()


def is_export_configured(environ: Mapping[str, str]) -> bool:
    """True when the standard variables ask for spans over OTLP: an endpoint set, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES)


def setup_tracing(service_name: str, *, record_content: bool = False) -> bool:
    """Set this process up to export spans when the OTEL_* variables ask for it; True when it installed a
    provider (then `shutdown_tracing` flushes it). `service_name` is the default `service.name`
    (OTEL_SERVICE_NAME wins); `record_content` is TOOLLOOP_TRACE_CONTENT.

    Idempotent; a process with an SDK provider of its own keeps it (False)."""
    _state.record_content = record_content
    if not is_export_configured(os.environ):
        return False
    with _state.lock:
        if _state.provider is not None or isinstance(trace.get_tracer_provider(), TracerProvider):
            return False
        # process.pid tells the processes of one service apart (the pool children of a worker each set up).
        resource = Resource.create({"process.pid": os.getpid()})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service_name}))
        provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(_build_exporter()))
        trace.set_tracer_provider(provider)
        _state.provider = provider
    log.info("tracing: spans exported over OTLP as %s", resource.attributes.get(SERVICE_NAME))
    return True


def _build_exporter() -> SpanExporter:
    protocol = next((os.environ[n] for n in _PROTOCOL_VARIABLES if os.environ.get(n)), "http/protobuf")
    if protocol.strip() == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.warning(
                "tracing: OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc, "
                "not installed: exporting over http/protobuf instead"
            )
        else:
            exporter: SpanExporter = GrpcExporter()
            return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def shutdown_tracing() -> None:
    """Export the spans still buffered, then stop what `setup_tracing` installed (nothing else)."""
    with _state.lock:
        provider, _state.provider = _state.provider, None
    if provider is not None:
        provider.force_flush(FLUSH_TIMEOUT_MS)
        provider.shutdown()


def flush_tracing() -> None:
    """Export the spans still buffered, keeping the provider (a pool child about to exit, best effort)."""
    provider = _state.provider
    if provider is not None:
        provider.force_flush(FLUSH_TIMEOUT_MS)


def records_content() -> bool:
    """True when message content is recorded (TOOLLOOP_TRACE_CONTENT), redacted."""
    return _state.record_content


def records_content_of(spec: ToolSpec) -> bool:
    """True when a call of this tool has its arguments and result recorded: never a sensitive tool's."""
    if spec.sensitive:
        return False
    return _state.record_content


def get_tracer() -> Tracer | None:
    """toolloop's tracer when spans go anywhere (an SDK provider is installed); None otherwise, and then a
    call site builds no span at all."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return None
    return provider.get_tracer(TRACER_NAME)


def build_carrier(context: Context | None = None) -> dict[str, str] | None:
    """The propagation fields of `context` (default: the current one), or None when there is no trace."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier or None


def extract_carrier(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context a carrier holds (None without one: the span it parents is a root)."""
    if not carrier:
        return None
    fields = {k: str(v) for k, v in carrier.items() if k in TRACE_HEADERS and v}
    return propagate.extract(fields) if fields else None


def build_content(value: Any) -> str:
    """`value` as a recorded content attribute: JSON with the values of sensitive keys redacted, cut short."""
    text = json.dumps(redact(value), ensure_ascii=False, default=str)
    return text if len(text) <= CONTENT_MAX_CHARS else text[: CONTENT_MAX_CHARS - 1] + "…"


# --- the worker ---------------------------------------------------------------------------------------------


def register_worker_tracing(record_content: bool) -> None:
    """Set tracing up in each pool child after fork, flush it as the child exits (or is recycled).

    In the child, not the parent: a batching exporter's thread does not survive a fork, and each child is a
    process of its own (`process.pid`)."""

    def on_process_init(**_: Any) -> None:
        setup_tracing("toolloop-worker", record_content=record_content)

    def on_process_shutdown(**_: Any) -> None:
        shutdown_tracing()

    signals.worker_process_init.connect(on_process_init, weak=False, dispatch_uid="toolloop-tracing-init")
    signals.worker_process_shutdown.connect(
        on_process_shutdown, weak=False, dispatch_uid="toolloop-tracing-shutdown"
    )


def build_task_carrier(task_request: Any) -> dict[str, str]:
    """The propagation fields of a Celery task's request: its custom message headers (a retry's too)."""
    headers = getattr(task_request, "headers", None)
    source: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    carrier = {k: str(source[k]) for k in TRACE_HEADERS if source.get(k)}
    if not carrier:
        # Protocol 2 also sets each custom header as an attribute of the request.
        carrier = {k: str(v) for k in TRACE_HEADERS if (v := getattr(task_request, k, None))}
    return carrier


class ToolSpan:
    """The `execute_tool` span of one delivery of a call: how it ended is recorded by `record`."""

    __slots__ = ("_retries", "_span", "_spec")

    def __init__(self, span: Span | None, spec: ToolSpec | None, retries: int) -> None:
        self._span = span
        self._spec = spec
        self._retries = retries

    # The recorder of no span is its own context manager: with tracing off, the hook costs a lookup.
    def __enter__(self) -> ToolSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def record(self, decision: Decision) -> None:
        """The delivery's end: outcome kind, attempt, the error of a failure (and the result, opt-in)."""
        span = self._span
        if span is None or not span.is_recording():
            return
        outcome: ToolOutcome | None = None
        match decision:
            case Finished(outcome=outcome):
                kind = "ok" if outcome.ok else _failure_kind(outcome)
            case RetryLater(reason=reason):
                kind = "retry"
                span.set_attribute(TOOL_REASON, reason)
            case Skipped(reason=reason, outcome=outcome):
                kind = "skipped"
                span.set_attribute(TOOL_REASON, reason)
        span.set_attribute(TOOL_OUTCOME, kind)
        # The attempt as Redis counts it when the outcome says; a retry's is Celery's count of its retries.
        span.set_attribute(TOOL_ATTEMPT, outcome.attempts if outcome is not None else self._retries + 1)
        if isinstance(decision, Finished) and not decision.outcome.ok:
            span.set_attribute(ERROR_TYPE, kind)
            span.set_status(Status(StatusCode.ERROR, decision.outcome.error or kind))
        if outcome is not None and self._spec is not None and records_content_of(self._spec):
            span.set_attribute(TOOL_RESULT, build_content(outcome.result if outcome.ok else outcome.error))


def build_model_call_id(request: ToolCallRequest) -> str:
    """The model's id of a call (what `gen_ai.tool.call.id` names), from its id on the wire."""
    prefix = f"{request.turn_id}{WIRE_CALL_ID_SEPARATOR}"
    return (
        request.call_id[len(prefix) :]
        if request.turn_id and request.call_id.startswith(prefix)
        else request.call_id
    )


def _failure_kind(outcome: ToolOutcome) -> str:
    return outcome.failure_kind.value if outcome.failure_kind is not None else "failed"


NO_TOOL_SPAN = ToolSpan(None, None, 0)


def trace_tool_call(
    task_request: Any, request: ToolCallRequest, spec: ToolSpec, *, retries: int = 0
) -> AbstractContextManager[ToolSpan]:
    """The `execute_tool {tool}` span of one delivery, child of the context in the task's headers (the
    dispatching turn's); with tracing off, `NO_TOOL_SPAN`, which records nothing, and no span at all."""
    tracer = get_tracer()
    if tracer is None:
        return NO_TOOL_SPAN
    return _traced_tool_call(tracer, task_request, request, spec, retries)


@contextmanager
def _traced_tool_call(
    tracer: Tracer, task_request: Any, request: ToolCallRequest, spec: ToolSpec, retries: int
) -> Iterator[ToolSpan]:
    attributes: dict[str, Any] = {
        OPERATION: "execute_tool",
        TOOL_NAME: request.tool,
        TOOL_CALL_ID: build_model_call_id(request),
        CALL_ID: request.call_id,
        TOOL_TYPE: "function",
        TOOL_DISPATCH: request.attempt,
    }
    if request.turn_id:
        attributes[TURN_ID] = request.turn_id
    if records_content_of(spec):
        attributes[TOOL_ARGUMENTS] = build_content(request.arguments)
    parent = extract_carrier(build_task_carrier(task_request))
    with tracer.start_as_current_span(
        f"execute_tool {request.tool}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield ToolSpan(span, spec, retries)
