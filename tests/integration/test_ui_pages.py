"""The turn pages and the recent-turns listing over a real redis-server and the API app (issue 14): the pages
and their files are served, `GET /v1/turns` lists what was submitted (newest first, expired turns skipped
and forgotten, the index capped), and with a token the pages ask for it with a sign-in form (never in an
address, nor in the access log), keep a read-only session cookie, and never show the token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from pydantic import SecretStr

from orchestrator.api.pages.auth import CSRF_HEADER, SESSION_COOKIE, build_csrf_token, build_redacted_path
from orchestrator.client.redis_client import Client
from orchestrator.model import TurnOutcome, TurnRequest
from orchestrator.settings import Settings
from orchestrator.store import operations
from orchestrator.store.runner import SyncRunner
from orchestrator.store.turns import TurnStore
from tests.support.api_server import api_client
from workers import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOKEN = "ui-s3cret-token"
FLOWER = "http://flower.test:5555/"


@pytest.fixture
def client(db_url: str) -> Iterator[Client]:
    c = Client(db_url)
    yield c
    c.redis.close()


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    with api_client(Settings(redis_url=db_url, flower_url=FLOWER)) as http:
        yield http


@pytest.fixture
def secured(db_url: str) -> Iterator[httpx.Client]:
    with api_client(Settings(redis_url=db_url, api_token=SecretStr(TOKEN))) as http:
        yield http


def play_turn(db_url: str, turn_id: str) -> None:
    """What an orchestrator writes for a turn that calls `add` twice and `multiply` once, then completes."""

    async def play() -> None:
        store = TurnStore.from_url(db_url)
        try:
            await store.append_event(turn_id, "turn_started", {"model": "scripted:demo", "tools": ["add"]})
            for call, tool in (("c1", "add"), ("c2", "add"), ("c3", "multiply")):
                await store.append_event(turn_id, "text_delta", {"llm_call": 0, "text": "thinking aloud "})
                await store.append_event(
                    turn_id, "tool_finished", {"call_id": call, "tool": tool, "ok": True}
                )
            outcome = TurnOutcome(turn_id=turn_id, status="completed", text="20", llm_calls=2)
            await store.save_outcome(turn_id, outcome)
        finally:
            await store.aclose()

    asyncio.run(play())


def test_the_pages_and_their_files_are_served_with_a_strict_policy(api: httpx.Client, client: Client) -> None:
    listing = api.get("/ui")
    assert listing.status_code == 200 and listing.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/static/turns.js">' in listing.text
    policy = listing.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert listing.headers["referrer-policy"] == "no-referrer"

    turn_id = client.submit(prompt="2+2?", model="scripted:demo")
    page = api.get(f"/ui/turns/{turn_id}")
    assert page.status_code == 200
    assert (
        f'data-turn-id="{turn_id}"' in page.text and 'data-flower-url="http://flower.test:5555"' in page.text
    )
    assert '<script src="/ui/static/turn.js">' in page.text
    # An id is put in the page escaped: whatever it holds stays an attribute's text.
    odd = api.get('/ui/turns/x"><b>y')
    assert odd.status_code == 200 and 'data-turn-id="x&quot;&gt;&lt;b&gt;y"' in odd.text

    script = api.get("/ui/static/turn.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "EventSource" in script.text and "innerHTML" not in script.text
    assert api.get("/ui/static/ui.css").headers["content-type"].startswith("text/css")
    assert api.get("/ui/static/secrets.txt").status_code == 404
    assert api.get("/ui/static/..%2Fauth.py").status_code == 404


def test_the_listing_shows_each_turn_newest_first_with_its_status_times_and_tools(
    api: httpx.Client, client: Client, db_url: str
) -> None:
    first = client.submit(prompt="2+3, times 4?", model="scripted:demo")
    second = client.submit(prompt="hello", model="scripted:echo")
    reply = api.get("/v1/turns")
    assert reply.status_code == 200
    turns = reply.json()["turns"]
    assert [t["turn_id"] for t in turns] == [second, first]
    assert turns[0]["status"] == "queued" and turns[0]["model"] == "scripted:echo"
    assert turns[0]["submitted_at"] is not None and turns[0]["duration_s"] is None and turns[0]["tools"] == {}

    play_turn(db_url, first)
    turns = api.get("/v1/turns").json()["turns"]
    done = next(t for t in turns if t["turn_id"] == first)
    assert done["status"] == "completed" and done["tools"] == {"add": 2, "multiply": 1}
    assert done["started_at"] >= done["submitted_at"] and done["finished_at"] >= done["started_at"]
    assert done["duration_s"] == pytest.approx(done["finished_at"] - done["submitted_at"], abs=0.01)
    assert [t["turn_id"] for t in api.get("/v1/turns", params={"limit": 1}).json()["turns"]] == [second]
    assert api.get("/v1/turns", params={"limit": 0}).status_code == 422


def test_the_listing_filters_by_status_tenant_and_model(
    api: httpx.Client, client: Client, db_url: str
) -> None:
    done = client.submit(prompt="2+3, times 4?", model="scripted:demo")
    echo = client.submit(prompt="hello", model="scripted:echo")
    acme = client.submit_request(TurnRequest(prompt="hello", model="scripted:echo", tenant="acme"))
    play_turn(db_url, done)

    def listed(**filters: str) -> list[str]:
        reply = api.get("/v1/turns", params=filters)
        assert reply.status_code == 200, reply.text
        return [t["turn_id"] for t in reply.json()["turns"]]

    assert listed() == [acme, echo, done]
    assert listed(status="completed") == [done]
    assert listed(status="queued") == [acme, echo]
    assert listed(model="scripted:echo") == [acme, echo]
    assert listed(model="scripted:demo", status="queued") == []
    assert listed(tenant="acme", model="scripted:echo", status="queued") == [acme]
    assert listed(status="queued", limit="1") == [acme]
    assert listed(status="waiting") == []
    assert api.get("/v1/turns", params={"status": "sleeping"}).status_code == 422
    assert api.get("/v1/turns", params={"model": ""}).status_code == 422
    # A fallback list is listed (it once failed the whole listing) by the model it tries first.
    fallback = client.submit(prompt="hello", model=["openai:demo", "scripted:echo"])
    assert listed(status="queued", limit="1") == [fallback]
    assert api.get("/v1/turns", params={"limit": 1}).json()["turns"][0]["model"] == "openai:demo"
    assert listed(model="openai:demo") == [fallback]
    page = api.get("/ui", params={"status": "completed"})
    assert page.status_code == 200 and 'id="filter-status"' in page.text and 'name="model"' in page.text


def test_an_expired_turn_is_skipped_and_removed_from_the_index(
    api: httpx.Client, client: Client, db_url: str
) -> None:
    kept, gone, newest = (client.submit(prompt=f"turn {n}", model="scripted:echo") for n in range(3))
    r = redis.Redis.from_url(db_url)
    try:
        r.delete(keys.turn_status(gone), keys.turn_request(gone), keys.turn_events(gone))  # as its TTL does
        listed = [t["turn_id"] for t in api.get("/v1/turns", params={"limit": 2}).json()["turns"]]
        assert listed == [newest, kept]  # the limit is filled past the expired one
        assert r.zscore(keys.TURNS_RECENT, gone) is None
        assert r.zscore(keys.TURNS_RECENT, kept) is not None
    finally:
        r.close()


def test_submit_keeps_only_the_newest_turns_in_the_index(client: Client, db_url: str) -> None:
    runner = SyncRunner(client.redis)
    for n in range(5):
        op = operations.submit(TurnRequest(prompt=f"turn {n}"), f"turn_capped_{n}", time.time() + n)
        # A cap of 3 instead of the default (the argument that holds keys.RECENT_TURNS_MAX).
        at = op.args.index(str(keys.RECENT_TURNS_MAX))
        runner.run(dataclasses.replace(op, args=(*op.args[:at], "3", *op.args[at + 1 :])))
    r = redis.Redis.from_url(db_url, decode_responses=True)
    try:
        assert r.zrevrange(keys.TURNS_RECENT, 0, -1) == [f"turn_capped_{n}" for n in (4, 3, 2)]
    finally:
        r.close()


def sign_in(http: httpx.Client, key: str, next_path: str = "/ui") -> httpx.Response:
    """The sign-in form's POST, as a browser sends it."""
    return http.post("/ui/session", data={"key": key, "next": next_path})


def test_with_a_token_a_page_asks_to_sign_in_with_a_form_and_keeps_a_read_only_session(
    secured: httpx.Client, client: Client, db_url: str
) -> None:
    turn_id = client.submit(prompt="2+2?", model="scripted:demo")
    play_turn(db_url, turn_id)

    refused = secured.get("/ui")
    assert refused.status_code == 401 and 'action="/ui/session"' in refused.text
    assert 'name="key"' in refused.text
    page_refused = secured.get(f"/ui/turns/{turn_id}")
    assert page_refused.status_code == 401 and f'value="/ui/turns/{turn_id}"' in page_refused.text
    assert secured.get("/v1/turns").status_code == 401
    assert "form-action 'self'" in refused.headers["content-security-policy"]
    form = secured.get("/ui/session", params={"next": f"/ui/turns/{turn_id}"})
    assert form.status_code == 200 and f'value="/ui/turns/{turn_id}"' in form.text

    wrong = sign_in(secured, "guess")
    assert (
        wrong.status_code == 401
        and "guess" not in wrong.text
        and "not one of the API" in wrong.text
        and SESSION_COOKIE not in wrong.headers.get("set-cookie", "")
    )

    signed_in = sign_in(secured, TOKEN, f"/ui/turns/{turn_id}")
    assert signed_in.status_code == 303 and signed_in.headers["location"] == f"/ui/turns/{turn_id}"
    cookie = signed_in.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie  # the cookie holds a value derived from the token, not the token
    session = signed_in.cookies[SESSION_COOKIE]
    # Only this server's pages are where a sign-in goes on to.
    for elsewhere in ("https://evil.test/ui", "//evil.test/ui", "/v1/turns", "/ui/../v1/turns"):
        assert sign_in(secured, TOKEN, elsewhere).headers["location"] == "/ui"
    # A sign-in posted by another site's page is refused (it would sign a person in with another's key).
    cross = secured.post("/ui/session", data={"key": TOKEN}, headers={"Origin": "https://evil.test"})
    assert cross.status_code == 403 and SESSION_COOKIE not in cross.headers.get("set-cookie", "")
    cross = secured.post("/ui/session", data={"key": TOKEN}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403

    with httpx.Client(base_url=str(secured.base_url), cookies={SESSION_COOKIE: session}) as browser:
        page = browser.get(f"/ui/turns/{turn_id}")
        assert page.status_code == 200 and TOKEN not in page.text and 'action="/ui/session/end"' in page.text
        listing = browser.get("/ui")
        assert listing.status_code == 200 and 'action="/ui/session/end"' in listing.text
        assert [t["turn_id"] for t in browser.get("/v1/turns").json()["turns"]] == [turn_id]
        assert browser.get(f"/v1/turns/{turn_id}").json()["status"] == "completed"
        events = browser.get(f"/v1/turns/{turn_id}/events")  # the finished turn's stream ends by itself
        assert events.status_code == 200 and "event: turn_finished" in events.text
        # Reads only: the session cannot submit or cancel.
        assert browser.post("/v1/turns", json={"prompt": "x"}).status_code == 401
        assert browser.post(f"/v1/turns/{turn_id}/cancel").status_code == 401

        signed_out = browser.post("/ui/session/end")
        assert signed_out.status_code == 303
        assert signed_out.headers["location"] == "/ui/session?why=signed-out"
        assert f'{SESSION_COOKIE}=""' in signed_out.headers["set-cookie"]
        assert "Max-Age=0" in signed_out.headers["set-cookie"]  # a browser drops the cookie at once
    with httpx.Client(base_url=str(secured.base_url), cookies={SESSION_COOKIE: "0" * 64}) as forger:
        assert forger.get("/ui").status_code == 401 and forger.get("/v1/turns").status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert secured.get("/v1/turns", headers=bearer).status_code == 200
    # A page read with a bearer header has no session to sign out of: no button.
    with httpx.Client(base_url=str(secured.base_url), headers=bearer) as script:
        for path in ("/ui", f"/ui/turns/{turn_id}"):
            page = script.get(path)
            assert page.status_code == 200 and "session/end" not in page.text and "{{" not in page.text
    assert secured.get("/ui", headers=bearer).status_code == 200


def test_a_key_in_the_address_is_no_longer_taken_nor_logged(
    secured: httpx.Client, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    turn_id = client.submit(prompt="2+2?", model="scripted:demo")
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        sent = secured.get(f"/ui/turns/{turn_id}", params={"token": TOKEN})
    # To the form, saying why, with the page to go back to and without the key; no session from it.
    assert sent.status_code == 303
    assert sent.headers["location"] == f"/ui/session?why=token-in-url&next=/ui/turns/{turn_id}"
    assert SESSION_COOKIE not in sent.headers.get("set-cookie", "")
    form = secured.get(sent.headers["location"])
    assert "no longer taken from the address" in form.text and TOKEN not in form.text
    assert secured.get("/ui", params={"token": TOKEN}).headers["location"].endswith("next=/ui")
    lines = [record.getMessage() for record in caplog.records if record.name == "uvicorn.access"]
    assert any("token=***" in line for line in lines), lines
    assert not any(TOKEN in line for line in lines)
    # An open API has no key to take: the address is cleaned and the page served.
    assert build_redacted_path(f"/ui?a=1&token={TOKEN}&b=2") == "/ui?a=1&token=***&b=2"


def test_an_open_api_needs_no_sign_in(api: httpx.Client) -> None:
    assert api.get("/ui", params={"token": "x", "tenant": "acme"}).headers["location"] == "/ui?tenant=acme"
    assert api.get("/ui/session").headers["location"] == "/ui"
    # Nor shows a sign-out button: there is nothing to sign out of.
    for path in ("/ui", "/ui/turns/t_0123456789abcdef0123456789abcdef"):
        page = api.get(path)
        assert page.status_code == 200 and "session/end" not in page.text and "{{" not in page.text


APPROVER_KEY = "ui-approver-key-7a1"
READER_KEY = "ui-reader-key-2b9"


@pytest.fixture
def keyed(db_url: str) -> Iterator[httpx.Client]:
    keys_setting = {
        APPROVER_KEY: {"tenant": "default", "scopes": ["read", "approve"], "name": "ana"},
        READER_KEY: {"tenant": "default", "scopes": ["read"]},
    }
    settings = Settings(redis_url=db_url, api_keys=SecretStr(json.dumps(keys_setting)))
    with api_client(settings) as http:
        yield http


def page_attribute(page: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', page)
    assert found is not None, name
    return found.group(1)


def test_a_page_session_approves_only_with_its_csrf_token_and_only_with_the_approve_scope(
    keyed: httpx.Client, client: Client
) -> None:
    turn_id = client.submit(prompt="2+2?", model="scripted:demo")
    approval = f"/v1/turns/{turn_id}/approvals/call_x"
    base = str(keyed.base_url)

    approver = sign_in(keyed, APPROVER_KEY).cookies[SESSION_COOKIE]
    with httpx.Client(base_url=base, cookies={SESSION_COOKIE: approver}) as browser:
        page = browser.get(f"/ui/turns/{turn_id}").text
        token = page_attribute(page, "data-csrf-token")
        assert token == build_csrf_token(approver) and page_attribute(page, "data-can-approve") == "true"
        # Without the token, or with another, the session writes nothing: another site cannot send it.
        assert browser.post(approval, json={"approved": True}).status_code == 401
        wrong = {CSRF_HEADER: "0" * 64}
        assert browser.post(approval, json={"approved": True}, headers=wrong).status_code == 401
        # With it the approval reaches the turn (which waits for no such call: 409, past authentication).
        sent = browser.post(approval, json={"approved": True}, headers={CSRF_HEADER: token})
        assert sent.status_code == 409 and sent.json()["code"] == "call_not_waiting"
        # Submits and cancels stay bearer-only, token or not.
        assert (
            browser.post("/v1/turns", json={"prompt": "x"}, headers={CSRF_HEADER: token}).status_code == 401
        )
        assert browser.post(f"/v1/turns/{turn_id}/cancel", headers={CSRF_HEADER: token}).status_code == 401

    reader = sign_in(keyed, READER_KEY).cookies[SESSION_COOKIE]
    with httpx.Client(base_url=base, cookies={SESSION_COOKIE: reader}) as browser:
        page = browser.get(f"/ui/turns/{turn_id}").text
        assert page_attribute(page, "data-can-approve") == "false"
        token = page_attribute(page, "data-csrf-token")
        refused = browser.post(approval, json={"approved": True}, headers={CSRF_HEADER: token})
        assert refused.status_code == 403 and "approve" in refused.json()["detail"]
    # One session's token is no other's.
    with httpx.Client(base_url=base, cookies={SESSION_COOKIE: approver}) as browser:
        assert (
            browser.post(approval, json={"approved": True}, headers={CSRF_HEADER: token}).status_code == 401
        )
