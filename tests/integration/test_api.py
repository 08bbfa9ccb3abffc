"""The HTTP API over a real redis-server: status codes, token, SSE, health, metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from pydantic import SecretStr

from orchestrator.client.redis_client import Client
from orchestrator.settings import Settings
from tests.support.api_server import api_client
from tests.support.approvals import hold_for_approval
from tests.support.store_db import finish_in_thread
from workers import keys
from workers.contract import ToolSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

TOKEN = "s3cret-token"


@pytest.fixture
def secured(db_url: str) -> Iterator[httpx.Client]:
    with api_client(Settings(redis_url=db_url, api_token=SecretStr(TOKEN))) as http:
        yield http


def test_submit_answers_202_with_an_id_and_the_turn_is_stored(api: httpx.Client) -> None:
    reply = api.post("/v1/turns", json={"prompt": "2+2?", "tools": ["add"], "limits": {"max_llm_calls": 2}})
    assert reply.status_code == 202
    turn_id = reply.json()["id"]
    state = api.get(f"/v1/turns/{turn_id}")
    assert state.status_code == 200
    body = state.json()
    assert body["status"] == "queued" and body["outcome"] is None
    assert body["request"]["limits"]["max_llm_calls"] == 2
    assert body["messages"] == [{"role": "user", "content": "2+2?"}]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "'prompt' or at least one message"),
        ({"prompt": "x", "colour": "red"}, "colour"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": "x", "limits": {"max_llm_calls": "many"}}, "max_llm_calls"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        # Under the body's limit, over what a task message carries for each tool call.
        ({"prompt": "x", "context": {"blob": "x" * 300_000}}, "every tool call of the turn carries it"),
    ],
)
def test_bad_bodies_get_422_with_a_clear_message(
    api: httpx.Client, body: dict[str, object], needle: str
) -> None:
    reply = api.post("/v1/turns", json=body)
    assert reply.status_code == 422
    assert needle in json.dumps(reply.json())


def test_malformed_json_and_oversized_bodies(api: httpx.Client, db_url: str) -> None:
    reply = api.post("/v1/turns", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 422
    huge = {"prompt": "x" * (1024 * 1024 + 10)}
    reply = api.post("/v1/turns", json=huge)
    assert reply.status_code == 413
    assert "over 1048576 bytes" in reply.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"y" * 65536
        yield b'"}'

    reply = api.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413
    assert redis.Redis.from_url(db_url).llen(keys.TURN_QUEUE) == 0


def test_unknown_turns_are_404(api: httpx.Client) -> None:
    for method, path in [
        ("GET", "/v1/turns/turn_nope"),
        ("GET", "/v1/turns/turn_nope/events"),
        ("POST", "/v1/turns/turn_nope/cancel"),
    ]:
        reply = api.request(method, path)
        assert reply.status_code == 404, path
        assert "turn_nope" in reply.json()["detail"]
    reply = api.post("/v1/turns/turn_nope/approvals/call_1", json={"approved": True})
    assert reply.status_code == 404


def test_cancel_and_approvals(api: httpx.Client, redis_url: str, db_url: str) -> None:
    turn_id = api.post("/v1/turns", json={"prompt": "x"}).json()["id"]
    (waiting,) = hold_for_approval(db_url, turn_id, 1)
    assert api.post(f"/v1/turns/{turn_id}/cancel").status_code == 202
    reply = api.post(f"/v1/turns/{turn_id}/approvals/{waiting}", json={"approved": False})
    assert reply.status_code == 202 and reply.json() == {"id": turn_id, "accepted": True}
    assert api.post(f"/v1/turns/{turn_id}/approvals/{waiting}", json={"approved": "maybe"}).status_code == 422
    assert api.post(f"/v1/turns/{turn_id}/approvals/{waiting}", json={}).status_code == 422
    finish_in_thread(redis_url, turn_id, wait_reader=False).join()
    assert api.post(f"/v1/turns/{turn_id}/cancel").status_code == 409


def test_events_stream_as_sse_until_turn_finished(api: httpx.Client, redis_url: str) -> None:
    turn_id = api.post("/v1/turns", json={"prompt": "x"}).json()["id"]
    # Written once the stream's reader waits for more: the stream shows them as they come.
    thread = finish_in_thread(redis_url, turn_id, ("turn_started", "tool_dispatched"))
    names: list[str] = []
    ids: list[str] = []
    with api.stream("GET", f"/v1/turns/{turn_id}/events") as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("event:"):
                names.append(line.split(":", 1)[1].strip())
            elif line.startswith("id:"):
                ids.append(line.split(":", 1)[1].strip())
            elif line.startswith("data:"):
                assert json.loads(line.split(":", 1)[1])["turn_id"] == turn_id
    thread.join()
    assert names == ["turn_queued", "turn_started", "tool_dispatched", "turn_finished"]
    # Resuming after an id gives only what came after it.
    with api.stream("GET", f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": ids[1]}) as reply:
        later = [line for line in reply.iter_lines() if line.startswith("event:")]
    assert later == ["event: tool_dispatched", "event: turn_finished"]
    assert api.get(f"/v1/turns/{turn_id}").json()["outcome"]["text"] == "4"


def test_bearer_token_guards_every_route_but_healthz(secured: httpx.Client) -> None:
    assert secured.get("/healthz").status_code == 200
    for method, path in [
        ("POST", "/v1/turns"),
        ("GET", "/v1/turns/turn_x"),
        ("GET", "/v1/turns/turn_x/events"),
        ("POST", "/v1/turns/turn_x/cancel"),
        ("POST", "/v1/turns/turn_x/approvals/c"),
        ("GET", "/metrics"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            reply = secured.request(method, path, headers=headers, json={"prompt": "x"})
            assert reply.status_code == 401, (method, path, headers)
            assert reply.headers["www-authenticate"] == "Bearer"
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert secured.post("/v1/turns", json={"prompt": "x"}, headers=good).status_code == 202
    assert secured.get("/metrics", headers=good).status_code == 200


def test_healthz_and_metrics(api: httpx.Client) -> None:
    assert api.get("/healthz").json() == {"status": "ok", "redis": "ok"}
    api.post("/v1/turns", json={"prompt": "count me"})
    metrics = api.get("/metrics")
    assert metrics.status_code == 200
    assert "toolloop_turns_submitted_total" in metrics.text


def test_healthz_is_503_when_redis_is_down() -> None:
    from orchestrator.redis_server import find_free_port

    # A request rides out a Redis that does not answer for `api_redis_retry_s` first (10 s by default).
    settings = Settings(redis_url=f"redis://127.0.0.1:{find_free_port()}/0", api_redis_retry_s=1)
    with api_client(settings, timeout_s=20) as test_client:
        reply = test_client.get("/healthz")
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["status"] == "unavailable"
        reply = test_client.post("/v1/turns", json={"prompt": "x"})
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["detail"].startswith("Redis unavailable: ")


def test_tools_listing_hides_sensitive_tools_unless_asked(api: httpx.Client, db_url: str) -> None:
    specs = [
        ToolSpec(name="add", description="Add two numbers.", parameters={"type": "object", "properties": {}}),
        ToolSpec(name="reset_password", sensitive=True, requires_confirmation=True),
    ]
    entry = {"seen_at": time.time(), "tools": [s.model_dump(mode="json") for s in specs]}
    publisher = redis.Redis.from_url(db_url)
    publisher.hset(keys.CATALOGUE, "worker-1", json.dumps(entry))
    publisher.close()
    public = api.get("/v1/tools").json()
    assert [t["name"] for t in public] == ["add"]
    assert public[0]["description"] == "Add two numbers." and "queue" not in public[0]
    everything = api.get("/v1/tools", params={"include_sensitive": "true"}).json()
    assert [(t["name"], t["requires_confirmation"]) for t in everything] == [
        ("add", False),
        ("reset_password", True),
    ]


def test_sse_outlasts_the_redis_socket_timeout(db_url: str, redis_url: str) -> None:
    # A 1 s socket timeout and a turn silent for 2.5 s: the stream must wait, not break (redis-py's default
    # is 5 s; tests/e2e/test_api_e2e.py holds a real turn quiet for 7 s against it).
    settings = Settings(redis_url=f"{db_url}?socket_timeout=1")
    with api_client(settings, timeout_s=10) as http:
        turn_id = http.post("/v1/turns", json={"prompt": "x"}).json()["id"]
        thread = finish_in_thread(redis_url, turn_id, ("tool_started",), quiet_s=2.5)
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as reply:
            lines = list(reply.iter_lines())
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("event:")]
        thread.join()
    assert names == ["turn_queued", "tool_started", "turn_finished"]


@pytest.mark.parametrize("refusal", ["out_of_memory", "read_only"])
def test_a_redis_that_refuses_writes_gets_503_with_retry_after_and_healthz_stays_200(refusal: str) -> None:
    from orchestrator.redis_server import RedisServer, find_free_port

    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        with Client(server.url) as client:
            turn_id = client.submit(prompt="stored before Redis refused writes")
        if refusal == "out_of_memory":
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
        else:  # a replica of a master that is not there: what a client meets mid-failover
            admin.replicaof("127.0.0.1", find_free_port())
        admin.close()
        settings = Settings(redis_url=server.url, api_redis_retry_s=1)
        with api_client(settings, timeout_s=20) as http:
            reply = http.post("/v1/turns", json={"prompt": "x"})
            assert reply.status_code == 503, reply.text
            assert reply.headers["retry-after"] == "1"
            needle = "out of memory" if refusal == "out_of_memory" else "read-only"
            assert needle in reply.json()["detail"]
            assert http.post(f"/v1/turns/{turn_id}/cancel").status_code == 503
            # Reads still work, and Redis answers: the API is degraded, not down.
            assert http.get(f"/v1/turns/{turn_id}").json()["status"] == "queued"
            assert http.get("/healthz").json() == {"status": "ok", "redis": "ok"}
            assert 'loop="api_request"' in http.get("/metrics").text  # toolloop_redis_errors_total


def test_a_malformed_last_event_id_is_422(api: httpx.Client) -> None:
    turn_id = api.post("/v1/turns", json={"prompt": "x"}).json()["id"]
    reply = api.get(f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": "not-an-id"})
    assert reply.status_code == 422


def test_a_redis_cluster_client_that_cannot_connect_is_a_503_and_metrics_stay_up(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py's cluster client raises its own RedisClusterException (no RedisError) when no node it knows
    # answers: a 500 with a traceback before, where any other Redis failure is a 503.
    from fastapi import FastAPI
    from redis.exceptions import RedisClusterException

    from orchestrator.api.app import create_app
    from orchestrator.store.backlog import BacklogReader
    from tests.support.api_server import serve_app

    down = RedisClusterException("Redis Cluster cannot be connected: no node it knows answers")

    async def unreachable(*_args: object) -> None:
        raise down

    monkeypatch.setattr(BacklogReader, "read", unreachable)
    app: FastAPI = create_app(Settings(redis_url=db_url))

    @app.get("/probe")
    async def probe() -> None:
        raise down

    with serve_app(app) as base_url, httpx.Client(base_url=base_url, timeout=10) as http:
        reply = http.get("/probe")
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1", reply.text
        assert "Redis Cluster cannot be connected" in reply.json()["detail"]
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "toolloop_turns_submitted_total" in metrics.text
