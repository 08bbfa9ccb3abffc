"""Where a turn's trace comes from (issue 17), over a real redis-server: `submit` stores its caller's current
span context with the turn, `POST /v1/turns` the request's `traceparent` header (never the body's)."""

from __future__ import annotations

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

from orchestrator.client.redis_client import AsyncClient, Client
from orchestrator.model import TurnRequest
from orchestrator.settings import Settings
from tests.support.api_server import api_client
from workers import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def stored(db_url: str, turn_id: str) -> TurnRequest:
    reader = redis.Redis.from_url(db_url)
    try:
        raw = reader.get(keys.turn_request(turn_id))
    finally:
        reader.close()
    assert raw is not None
    return TurnRequest.model_validate_json(raw)


def test_submit_stores_the_callers_span_context_and_none_outside_a_span(db_url: str) -> None:
    # The web app's own provider, as an app sets one up (not installed globally: the propagator reads the
    # current span whatever provider made it).
    tracer = TracerProvider().get_tracer("web-app")
    with Client(db_url) as client:
        with tracer.start_as_current_span("POST /ask") as span:
            traced = client.submit(prompt="hello")
        untraced = client.submit(prompt="hello")
    context = stored(db_url, traced).trace_context
    assert context is not None
    assert context["traceparent"].split("-")[1:3] == [
        f"{span.get_span_context().trace_id:032x}",
        f"{span.get_span_context().span_id:016x}",
    ]
    assert stored(db_url, untraced).trace_context is None


async def test_the_async_client_stores_the_callers_span_context(db_url: str) -> None:
    tracer = TracerProvider().get_tracer("web-app")
    async with AsyncClient(db_url) as client:
        with tracer.start_as_current_span("POST /ask") as span:
            turn_id = await client.submit(prompt="hello")
    context = stored(db_url, turn_id).trace_context
    assert context is not None
    assert context["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"


def test_the_api_continues_the_traceparent_header_and_ignores_a_body_context(db_url: str) -> None:
    with api_client(Settings(redis_url=db_url)) as http:
        headed = http.post("/v1/turns", json={"prompt": "hi"}, headers={"traceparent": PARENT})
        bodied = http.post("/v1/turns", json={"prompt": "hi", "trace_context": {"traceparent": PARENT}})
        shown = http.get(f"/v1/turns/{headed.json()['id']}").json()
    assert headed.status_code == bodied.status_code == 202
    assert stored(db_url, headed.json()["id"]).trace_context == {"traceparent": PARENT}
    assert stored(db_url, bodied.json()["id"]).trace_context is None
    # Trace ids, not secrets: a person sees which trace the turn is in.
    assert shown["request"]["trace_context"] == {"traceparent": PARENT}
