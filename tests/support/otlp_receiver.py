"""A local OTLP/HTTP trace receiver: what every process of a test exported, raw and decoded.

    with OtlpReceiver() as receiver:             # OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url
        ...
        receiver.spans()                           # every span received, with its process's resource
        receiver.raw()                             # every request body as received, to search for secrets

It answers `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, gzip or not) as a collector does.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received, ids in hex."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    service: str
    pid: int | None
    status_code: int
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class OtlpReceiver:
    """An OTLP/HTTP receiver on a free local port, in a thread."""

    def __init__(self) -> None:
        self._bodies: list[bytes] = []
        self._lock = threading.Lock()
        bodies, lock = self._bodies, self._lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with lock:
                    bodies.append(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The OTLP endpoint (the exporters append `/v1/traces`)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def raw(self) -> bytes:
        """Every request body received, as received (decompressed)."""
        with self._lock:
            return b"".join(self._bodies)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            bodies = list(self._bodies)
        spans: list[ReceivedSpan] = []
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    spans += [_span(s, resource) for s in scope_spans.spans]
        return spans

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


def _span(span: Any, resource: dict[str, Any]) -> ReceivedSpan:
    pid = resource.get("process.pid")
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        attributes=_attributes(span.attributes),
        service=str(resource.get("service.name")),
        pid=int(pid) if pid is not None else None,
        status_code=span.status.code,
        events=[(e.name, _attributes(e.attributes)) for e in span.events],
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
    )
