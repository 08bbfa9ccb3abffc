"""Hypothesis over the HTTP API's bodies: huge, deeply nested, wrong types, invalid UTF-8, unknown fields.

Every answer is a clear 4xx (or 202 for a body that happens to be a valid turn), never a 5xx, and the
server keeps answering. Each answer the route's schema declares fits it, as schemathesis checks (its status
and its body against the live `/openapi.json`; the router's own 307, 404 and 405 are no route's). The shipped
server, `toolloop api`, over a real Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.openapi_schemas import assert_valid_answer
from tests.support.served import serving_api
from tests.support.store_db import store_db_url

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOSTILE_DB = 5
JSON = {"content-type": "application/json"}
# 307: a trailing slash (an encoded "/" in an id) is redirected by the router, which is no error.
ACCEPTED = {202, 307, 400, 404, 405, 409, 413, 415, 422}
# Answers of the router rather than of a route (an encoded "/" in an id reaches no route): no schema has them.
ROUTER_ANSWERS = {307, 404, 405}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
turn_fields = st.fixed_dictionaries(
    {},
    optional={
        "prompt": json_values,
        "messages": json_values,
        "tools": json_values,
        "model": json_values,
        "limits": json_values
        | st.dictionaries(st.sampled_from(["deadline_s", "max_llm_calls", "x"]), json_values),
        "context": json_values,
        "conversation_id": json_values,
        "tool_choice": json_values,
        "unknown_field": json_values,
    },
)
raw_bodies = st.one_of(
    turn_fields.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),  # mostly invalid UTF-8 and invalid JSON
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.text(max_size=50).map(lambda t: json.dumps({"prompt": t}).encode()[:-2] + b"\xff\xfe}"),
)


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[httpx.Client]:
    with (
        serving_api(store_db_url(redis_url, HOSTILE_DB)) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        yield http


@pytest.fixture(scope="module")
def document(api: httpx.Client) -> dict[str, Any]:
    schema: dict[str, Any] = api.get("/openapi.json").raise_for_status().json()
    return schema


def _assert_clear_4xx(reply: httpx.Response, document: dict[str, Any] | None = None, route: str = "") -> None:
    assert reply.status_code in ACCEPTED, (reply.status_code, reply.text[:500])
    if reply.status_code >= 400:
        detail: Any = reply.json().get("detail")
        assert detail, reply.text[:500]
    if document is None:
        return
    method, _, path = route.partition(" ")
    declared = document["paths"][path][method]["responses"]
    if str(reply.status_code) in declared or reply.status_code not in ROUTER_ANSWERS:
        assert_valid_answer(document, method, path, reply.status_code, reply.json())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=raw_bodies)
def test_turn_bodies_never_5xx(api: httpx.Client, document: dict[str, Any], body: bytes) -> None:
    reply = api.post("/v1/turns", content=body, headers={"content-type": "application/json"})
    _assert_clear_4xx(reply, document, "post /v1/turns")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=raw_bodies, turn_id=st.text(min_size=1, max_size=40), call_id=st.text(min_size=1, max_size=40))
@example(body=b"{}", turn_id=".", call_id="..")  # found by a suite run: dot segments
def test_control_bodies_and_ids_never_5xx(
    api: httpx.Client, document: dict[str, Any], body: bytes, turn_id: str, call_id: str
) -> None:
    # Dots too: an id of "." or ".." is a dot segment every HTTP client removes (RFC 3986 §5.2.4), so it
    # would reach another route (GET /v1/turns/. is the list); percent-encoded, the server sees the id.
    tid, cid = (quote(value, safe="").replace(".", "%2E") for value in (turn_id, call_id))
    routes = {
        f"/v1/turns/{tid}/approvals/{cid}": "post /v1/turns/{turn_id}/approvals/{call_id}",
        f"/v1/turns/{tid}/cancel": "post /v1/turns/{turn_id}/cancel",
        f"/v1/turns/{tid}/calls/{cid}/result": "post /v1/turns/{turn_id}/calls/{call_id}/result",
    }
    for path, route in routes.items():
        reply = api.post(path, content=body, headers={"content-type": "application/json"})
        _assert_clear_4xx(reply, document, route)
    reply = api.get(f"/v1/turns/{tid}")
    _assert_clear_4xx(reply, document, "get /v1/turns/{turn_id}")


call_fields = st.fixed_dictionaries(
    {},
    optional={
        "arguments": json_values,
        "timeout_s": json_values | st.floats(-1, 0.5),
        "context": json_values,
        "approve": json_values,
        "unknown_field": json_values,
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(call_fields.map(lambda d: json.dumps(d).encode()), raw_bodies),
    name=st.text(min_size=0, max_size=40),
)
@example(body=b'{"arguments": {}}', name="..")
def test_tool_call_bodies_and_names_never_5xx(
    api: httpx.Client, document: dict[str, Any], body: bytes, name: str
) -> None:
    # No worker serves this database: a call that gets through is a `not_found` outcome (200), at once.
    path = f"/v1/tools/{quote(name, safe='').replace('.', '%2E')}/calls"
    reply = api.post(path, content=body, headers=JSON)
    if reply.status_code == 200:
        assert reply.json()["failure_kind"] == "not_found", reply.text
        assert_valid_answer(document, "post", "/v1/tools/{name}/calls", 200, reply.json())
        return
    _assert_clear_4xx(reply, document, "post /v1/tools/{name}/calls")


schedule_fields = st.fixed_dictionaries(
    {},
    optional={
        "name": json_values,
        "cron": json_values | st.sampled_from(["0 3 * * *", "*/5 * * * *", "* * *", "61 * * * *", ""]),
        "every_s": json_values | st.floats(-1, 5) | st.sampled_from([1e308, 60]),
        "overlap": json_values | st.sampled_from(["skip", "queue", "cancel_previous"]),
        "request": json_values | turn_fields,
        "unknown_field": json_values,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(schedule_fields.map(lambda d: json.dumps(d).encode()), raw_bodies),
    name=st.text(min_size=1, max_size=40),
)
@example(body=b'{"every_s": 60, "request": {"prompt": "hi"}}', name="..")
@example(body=b'{"every_s": 1e308, "request": {"prompt": "hi"}}', name="fuzz-valid")
def test_schedule_bodies_and_names_never_5xx(
    api: httpx.Client, document: dict[str, Any], body: bytes, name: str
) -> None:
    path = f"/v1/schedules/{quote(name, safe='').replace('.', '%2E')}"
    reply = api.put(path, content=body, headers=JSON)
    if reply.status_code == 200:  # a body that happens to be a valid schedule: stored, then removed
        assert_valid_answer(document, "put", "/v1/schedules/{name}", 200, reply.json())
        assert api.delete(path).status_code == 200
        return
    _assert_clear_4xx(reply, document, "put /v1/schedules/{name}")
    _assert_clear_4xx(api.delete(path), document, "delete /v1/schedules/{name}")


def _post_fresh(api: httpx.Client, path: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
    # A connection of its own: a server that failed would drop the connection of the request.
    return httpx.post(api.base_url.join(path), content=content, headers=headers, timeout=30)


def test_non_finite_numbers_in_a_refused_body_get_a_4xx(api: httpx.Client) -> None:
    reply = _post_fresh(api, "/v1/turns", content=b'{"prompt": {"x": NaN}}', headers=JSON)
    _assert_clear_4xx(reply)
    assert reply.status_code == 422


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"prompt": "x", "context": {"a": [1, NaN]}}', "context.a[1]: nan is not a JSON number"),
        (b'{"prompt": "x", "limits": {"deadline_s": Infinity}}', "limits.deadline_s: inf is not a JSON"),
        (b'{"prompt": "x", "context": {"a": -Infinity}}', "context.a: -inf is not a JSON number"),
    ],
)
def test_non_finite_numbers_in_a_valid_turn_are_refused(api: httpx.Client, body: bytes, needle: str) -> None:
    reply = _post_fresh(api, "/v1/turns", content=body, headers=JSON)
    assert reply.status_code == 422, reply.text
    assert needle in json.dumps(reply.json()), reply.text


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"prompt": "\\ud800"}', "prompt: an unpaired surrogate \\\\ud800 at index 0"),
        (b'{"prompt": "ok", "context": {"k": ["a\\udfff"]}}', "context.k[0]: an unpaired surrogate"),
        (b'{"prompt": "ok", "context": {"\\ud83d": 1}}', "context: a key holds an unpaired surrogate"),
        (b'{"prompt": "ok", "\\ud800": 1}', "unicode"),
        (b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages[0].content: an unpaired"),
    ],
)
def test_unpaired_surrogates_get_a_4xx(api: httpx.Client, body: bytes, needle: str) -> None:
    reply = _post_fresh(api, "/v1/turns", content=body, headers=JSON)
    assert reply.status_code == 422, reply.text
    assert needle in json.dumps(reply.json()), reply.text


def test_a_lone_surrogate_gets_a_4xx(api: httpx.Client) -> None:
    reply = _post_fresh(api, "/v1/turns", content=b'{"prompt": "\\ud800"}', headers=JSON)
    _assert_clear_4xx(reply)
    assert reply.status_code == 422
    # A complete pair (an emoji) is text like any other.
    reply = _post_fresh(api, "/v1/turns", content=b'{"prompt": "\\ud83d\\ude00"}', headers=JSON)
    assert reply.status_code == 202, reply.text


def test_a_refused_approval_body_with_nan_gets_a_422(api: httpx.Client) -> None:
    turn_id = api.post("/v1/turns", json={"prompt": "approve me"}).json()["id"]
    reply = _post_fresh(
        api,
        f"/v1/turns/{turn_id}/approvals/call_1",
        content=b'{"approved": NaN, "x": "\\ud800"}',
        headers=JSON,
    )
    assert reply.status_code == 422, reply.text
    assert "approved" in reply.text


def test_huge_bodies_are_refused_and_the_server_stays_up(api: httpx.Client) -> None:
    huge = json.dumps({"prompt": "x" * (3 * 1024 * 1024)}).encode()
    assert (
        api.post("/v1/turns", content=huge, headers={"content-type": "application/json"}).status_code == 413
    )

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(64):
            yield b"y" * 65536
        yield b'"}'

    reply = api.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413
    assert api.get("/healthz").status_code == 200


def test_the_server_is_alive_after_the_fuzzing(api: httpx.Client) -> None:
    assert api.get("/healthz").status_code == 200
    reply = api.post("/v1/turns", json={"prompt": "still there?"})
    assert reply.status_code == 202 and reply.json()["id"]
