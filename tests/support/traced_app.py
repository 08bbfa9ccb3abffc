"""A web app's process, as docs/guides/tracing.md sets one up: its own OpenTelemetry SDK exporting over OTLP,
and a turn submitted inside the span of the request it serves. Prints `{"turn_id", "trace_id", "span_id"}`
as JSON.

    python -m tests.support.traced_app REDIS_URL PROMPT TOOL[,TOOL…]
"""

from __future__ import annotations

import json
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from orchestrator import Client


def main(redis_url: str, prompt: str, tools: list[str]) -> None:
    # The app's own setup (docs/guides/tracing.md): toolloop's client installs nothing, it uses the app's.
    provider = TracerProvider(resource=Resource.create({"service.name": "web-app"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)

    tracer = trace.get_tracer("web-app")
    with (
        tracer.start_as_current_span("POST /ask", kind=trace.SpanKind.SERVER) as span,
        Client(redis_url) as client,
    ):
        turn_id = client.submit(prompt=prompt, tools=tools)
        context = span.get_span_context()
    provider.shutdown()  # flushes the request's span
    print(
        json.dumps(
            {"turn_id": turn_id, "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
