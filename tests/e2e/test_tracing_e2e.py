"""Tracing end to end (issue 17): one OpenTelemetry trace from a web app's request through the turn to every
tool task, as a local OTLP/HTTP receiver gets it from real processes — the app (its own SDK), `toolloop
orchestrator` (the scripted `plan` model over HTTP) and a prefork `toolloop worker` — each exporting because
`OTEL_EXPORTER_OTLP_ENDPOINT` says so.

The worker records tool arguments (`TOOLLOOP_TRACE_CONTENT=true`): they reach the receiver redacted, and a
password argument's value is nowhere in the bytes received. A transient failure's retry is a span of its
own in the same trace; a turn resumed by another orchestrator stays in the trace, linked to its first span.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer
from tests.support.e2e_processes import start_orchestrator
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, WorkerHandle, start_worker
from tests.support.turns import event_data, wait_outcome
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOOLS = "tests.support.tracing_tools"
PASSWORD = f"pw-{uuid.uuid4().hex}"
TURN_SPAN = "invoke_agent toolloop"
SERVER_KIND = 2  # the protobuf's SPAN_KIND_SERVER
ERROR_STATUS = 2  # the protobuf's STATUS_CODE_ERROR


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """What a process needs to export to the receiver, with short batches so the test waits little."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SDK_DISABLED": "false",
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


@pytest.fixture(scope="module")
def trace_worker(module_redis: RedisServer, receiver: OtlpReceiver) -> Iterator[WorkerHandle]:
    env = {**otel_env(receiver), "TOOLLOOP_TRACE_CONTENT": "true"}
    handle = start_worker(module_redis.url, [TOOLS], concurrency=2, env=env)
    yield handle
    handle.stop()


def submit_from_app(redis_url: str, receiver: OtlpReceiver, prompt: str, tools: list[str]) -> dict[str, str]:
    """Submit a turn from the web app's process, inside its request span: turn id, trace id, span id."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.traced_app", redis_url, prompt, ",".join(tools)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**otel_env(receiver), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def wait_spans(
    receiver: OtlpReceiver, trace_id: str, ready: Callable[[list[ReceivedSpan]], bool], what: str
) -> list[ReceivedSpan]:
    """The spans of one trace, once `ready` says they are all in; failing, those that came."""

    def of_trace() -> list[ReceivedSpan]:
        return [s for s in receiver.spans() if s.trace_id == trace_id]

    def all_in() -> list[ReceivedSpan] | None:
        spans = of_trace()
        return spans if ready(spans) else None

    def listing() -> str:
        spans = "\n".join(f"  {s.service}/{s.pid} {s.name} {s.attributes}" for s in of_trace())
        return f"spans of the trace:\n{spans}"

    return wait_for(all_in, what, detail=listing)


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def test_a_turn_is_one_trace_from_the_web_app_to_each_tool_task_and_across_owners(
    module_redis: RedisServer, trace_worker: WorkerHandle, receiver: OtlpReceiver
) -> None:
    env = {**otel_env(receiver), "TOOLLOOP_MODEL": "scripted:plan"}
    first = start_orchestrator(module_redis.url, env=env)
    second = None
    client = Client(module_redis.url)
    try:
        # --- one turn: two tool calls in parallel, one retried once, then the answer ------------------------
        key = uuid.uuid4().hex
        calls = [
            {"name": "trace_login", "arguments": {"user": "ada", "password": PASSWORD}},
            {"name": "trace_flaky", "arguments": {"key": key}},
        ]
        prompt = plan_prompt([{"calls": calls}, {"text": "all done"}])
        app = submit_from_app(module_redis.url, receiver, prompt, ["trace_login", "trace_flaky"])
        outcome = wait_outcome(client, app["turn_id"])
        assert outcome.status == "completed", outcome

        def complete(spans: list[ReceivedSpan]) -> bool:
            return (
                len(named(spans, TURN_SPAN)) == 1
                and len(named(spans, "chat plan")) == 2
                and len(named(spans, "execute_tool trace_login")) == 1
                and len(named(spans, "execute_tool trace_flaky")) == 2
                and len(named(spans, "POST /ask")) == 1
            )

        spans = wait_spans(receiver, app["trace_id"], complete, "the whole turn's spans")
        (request,) = named(spans, "POST /ask")
        (turn,) = named(spans, TURN_SPAN)
        chats = named(spans, "chat plan")
        logins = named(spans, "execute_tool trace_login")
        flaky = sorted(
            named(spans, "execute_tool trace_flaky"), key=lambda s: s.attributes["toolloop.tool.attempt"]
        )

        # Three processes, told apart by their resource: the app, the orchestrator, a worker's pool child.
        assert request.service == "web-app" and request.kind == SERVER_KIND
        assert turn.service == "toolloop-orchestrator"
        assert {s.service for s in [*logins, *flaky]} == {"toolloop-worker"}
        assert len({request.pid, turn.pid, logins[0].pid}) == 3

        # The turn continues the app's request; model calls and tool calls are the turn's children.
        assert turn.parent_span_id == request.span_id
        assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert turn.attributes["toolloop.turn.id"] == app["turn_id"]
        assert turn.attributes["toolloop.turn.status"] == "completed"
        for chat in chats:
            assert chat.parent_span_id == turn.span_id
            assert chat.attributes["gen_ai.operation.name"] == "chat"
            assert chat.attributes["gen_ai.request.model"] == "plan"
            assert chat.attributes["gen_ai.provider.name"] == "scripted"
            assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        reasons = sorted(tuple(c.attributes["gen_ai.response.finish_reasons"]) for c in chats)
        assert reasons == [("stop",), ("tool_calls",)]
        for tool_span in [*logins, *flaky]:
            assert tool_span.parent_span_id == turn.span_id
            assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
            assert tool_span.attributes["toolloop.turn.id"] == app["turn_id"]
        assert logins[0].attributes["gen_ai.tool.name"] == "trace_login"
        assert logins[0].attributes["toolloop.tool.outcome"] == "ok"

        # The retried call: each attempt a span of the same trace, under the same call id.
        assert [s.attributes["toolloop.tool.outcome"] for s in flaky] == ["retry", "ok"]
        assert [s.attributes["toolloop.tool.attempt"] for s in flaky] == [1, 2]
        assert len({s.attributes["gen_ai.tool.call.id"] for s in flaky}) == 1

        # Content is recorded where asked (the worker), redacted: the password's value is nowhere.
        arguments = json.loads(logins[0].attributes["gen_ai.tool.call.arguments"])
        assert arguments == {"user": "ada", "password": "***"}
        assert PASSWORD.encode() not in receiver.raw()

        # --- a turn whose orchestrator stops while its tool runs: another one finishes it ------------------
        prompt = plan_prompt(
            [{"calls": [{"name": "trace_sleep", "arguments": {"seconds": 2}}]}, {"text": "ok"}]
        )
        app = submit_from_app(module_redis.url, receiver, prompt, ["trace_sleep"])
        wait_until(lambda: event_data(client.redis, app["turn_id"], "tool_started"), "the tool to start")
        first.stop()
        second = start_orchestrator(module_redis.url, env=env)
        outcome = wait_outcome(client, app["turn_id"])
        assert outcome.status == "completed", outcome

        def resumed(spans: list[ReceivedSpan]) -> bool:
            return len(named(spans, TURN_SPAN)) == 2 and len(named(spans, "chat plan")) == 2

        spans = wait_spans(receiver, app["trace_id"], resumed, "both owners' turn spans")
        turns = named(spans, TURN_SPAN)
        (before,) = [t for t in turns if t.attributes["toolloop.orchestrator.id"] == first.orchestrator_id]
        (after,) = [t for t in turns if t.attributes["toolloop.orchestrator.id"] == second.orchestrator_id]
        assert before.attributes["toolloop.turn.end"] == "released"
        assert after.attributes["toolloop.turn.adopted"] == "taken_over"
        assert after.attributes["toolloop.turn.end"] == "finished"
        # The same trace, the same parent (the app's request), and a link to the previous owner's span.
        assert before.parent_span_id == after.parent_span_id == app["span_id"]
        assert after.links == [(app["trace_id"], before.span_id)]
        assert {c.parent_span_id for c in named(spans, "chat plan")} == {before.span_id, after.span_id}
    finally:
        client.close()
        first.stop()
        if second is not None:
            second.stop()
