"""Tracing's pure parts (issue 17): when a process exports, what a tool task's headers carry, what content
reaches a span (redacted), and that nothing is built while no SDK provider is installed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from orchestrator.machine.events import CallModel
from orchestrator.model import AssistantMessage, ToolCall, ToolMessage, Turn, UserMessage
from orchestrator.publishing.publisher import build_send_options
from orchestrator.tracing import (
    NO_CHAT_SPAN,
    build_input_messages,
    build_output_messages,
    trace_model_call,
)
from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec
from workers.run import Finished
from workers.tracing import (
    CONTENT_MAX_CHARS,
    build_carrier,
    build_content,
    build_model_call_id,
    build_task_carrier,
    extract_carrier,
    get_tracer,
    is_export_configured,
    trace_tool_call,
)

SECRET = "hunter2-do-not-trace"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("environ", "exports"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_a_process_exports_only_when_the_standard_variables_ask(
    environ: dict[str, str], exports: bool
) -> None:
    assert is_export_configured(environ) is exports


def _spec(name: str = "login", *, sensitive: bool = False) -> ToolSpec:
    return ToolSpec(name=name, description="d", parameters={"type": "object"}, sensitive=sensitive)


def _request() -> ToolCallRequest:
    return ToolCallRequest(
        call_id="turn_1/call_7", tool="login", turn_id="turn_1", arguments={"user": "ada", "password": SECRET}
    )


def test_a_tool_task_carries_the_turn_spans_context_in_its_headers() -> None:
    options = build_send_options(_spec(), _request(), 100.0, trace={"traceparent": PARENT})
    assert options["headers"]["traceparent"] == PARENT
    assert options["headers"]["toolloop_call_id"] == "turn_1/call_7"
    # Without a trace, the headers are as before.
    assert "traceparent" not in build_send_options(_spec(), _request(), 100.0)["headers"]


def test_a_worker_reads_the_context_from_the_tasks_headers_or_attributes() -> None:
    from_headers = SimpleNamespace(headers={"traceparent": PARENT, "toolloop_turn_id": "t"})
    assert build_task_carrier(from_headers) == {"traceparent": PARENT}
    as_attributes = SimpleNamespace(headers=None, traceparent=PARENT)
    assert build_task_carrier(as_attributes) == {"traceparent": PARENT}
    assert build_task_carrier(SimpleNamespace(headers=None)) == {}
    context = extract_carrier({"traceparent": PARENT})
    assert context is not None
    assert f"{trace.get_current_span(context).get_span_context().trace_id:032x}" == PARENT.split("-")[1]
    assert extract_carrier({}) is None


def test_a_carrier_holds_the_current_span_of_whatever_provider_the_caller_uses() -> None:
    assert build_carrier() is None  # no current span: nothing stored with a turn
    tracer = TracerProvider().get_tracer("web-app")  # the app's own, never installed globally here
    with tracer.start_as_current_span("request") as span:
        carrier = build_carrier()
    assert carrier is not None
    assert carrier["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"


def test_the_model_call_id_is_the_wire_id_without_its_turn() -> None:
    assert build_model_call_id(_request()) == "call_7"
    assert build_model_call_id(ToolCallRequest(call_id="direct_1", tool="x")) == "direct_1"


def test_recorded_content_is_redacted_and_bounded() -> None:
    assert build_content({"user": "ada", "password": SECRET}) == '{"user": "ada", "password": "***"}'
    assert len(build_content("x" * (CONTENT_MAX_CHARS * 2))) == CONTENT_MAX_CHARS


def test_model_messages_are_recorded_without_sensitive_argument_values() -> None:
    raw = f'{{"user": "ada", "password": "{SECRET}"}}'
    call = ToolCall(id="c1", name="login", arguments={"user": "ada", "password": SECRET}, raw_arguments=raw)
    messages = [
        UserMessage(content="log me in"),
        AssistantMessage(content=None, tool_calls=[call]),
        ToolMessage(tool_call_id="c1", name="login", content=f'{{"api_key": "{SECRET}", "ok": true}}'),
    ]
    recorded = build_input_messages(messages)
    assert SECRET not in recorded
    user, assistant, tool = json.loads(recorded)
    assert user["content"] == "log me in"
    assert assistant["tool_calls"][0]["arguments"] == {"user": "ada", "password": "***"}
    assert json.loads(tool["content"]) == {"api_key": "***", "ok": True}
    answer = build_output_messages(Turn(type="tool_calls", tool_calls=[call]))
    assert SECRET not in answer and '"user": "ada"' in answer


def test_with_no_sdk_provider_installed_no_span_is_built() -> None:
    # The test process installs no global provider: every call site skips its span.
    assert get_tracer() is None
    with trace_tool_call(SimpleNamespace(headers={"traceparent": PARENT}), _request(), _spec()) as traced:
        outcome = ToolOutcome(call_id="turn_1/call_7", tool="login", ok=True, content="ok")
        traced.record(Finished(outcome, won=True))
        assert trace.get_current_span() is trace.INVALID_SPAN
    command = CallModel(model="scripted:plan", messages=[], tools=[], id_prefix="c", llm_call_index=0)
    with trace_model_call(None, command) as chat:
        assert chat is NO_CHAT_SPAN
