"""Tenants (issue 31): an API key sees, streams, approves and cancels only its tenant's turns, submits only
for its tenant, and uses only its tools; the admin token sees every tenant; tools get the turn's tenant.

The shipped processes (`FaultEnv`): Redis, `toolloop worker` with the tenant tools, `toolloop orchestrator`
and `toolloop api` with three keys of two tenants (globex's given as its SHA-256) and the admin token.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from orchestrator.model import ToolMessage
from orchestrator.store import codec
from tests.faults.env import PLAN_MODEL, FaultEnv, call
from tests.support.processes import TOOLLOOP_BIN
from tests.support.served import Served
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ACME = f"acme-{uuid.uuid4().hex}"
ACME_OPS = f"acme-ops-{uuid.uuid4().hex}"
GLOBEX = f"globex-{uuid.uuid4().hex}"
TOKEN = f"admin-{uuid.uuid4().hex}"
API_KEYS = {
    ACME: {"tenant": "acme", "scopes": ["submit", "read", "cancel"]},
    ACME_OPS: {"tenant": "acme", "scopes": ["read", "approve", "cancel"]},
    "sha256:" + hashlib.sha256(GLOBEX.encode()).hexdigest(): {
        "tenant": "globex",
        "scopes": ["submit", "read", "approve", "cancel"],
        "tools": ["whose_tenant", "refund"],
    },
}


@dataclass
class Deployment:
    env: FaultEnv
    api: Served
    api_url: str

    def http(self, key: str) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with FaultEnv() as env:
        env.start_worker(concurrency=2, modules=("tests.security.tenant_tools",))
        env.start_orchestrator()
        api, api_url = env.start_api({"TOOLLOOP_API_TOKEN": TOKEN, "TOOLLOOP_API_KEYS": json.dumps(API_KEYS)})
        yield Deployment(env, api, api_url)


def plan(*calls: dict[str, Any]) -> str:
    rounds = [{"calls": list(calls)}] if calls else []
    return json.dumps({"plan": [*rounds, {"text": "Done."}]})


def submit(http: httpx.Client, tools: list[str], *calls: dict[str, Any], **more: Any) -> str:
    """A turn of `calls` (none: an answer in a word), offering `tools`, submitted with `http`'s key."""
    body = {"prompt": plan(*calls), "tools": tools, "model": PLAN_MODEL, **more}
    reply = http.post("/v1/turns", json=body)
    assert reply.status_code == 202, reply.text
    turn_id: str = reply.json()["id"]
    return turn_id


def wait_status(http: httpx.Client, turn_id: str, status: str) -> dict[str, Any]:
    wait_until(lambda: http.get(f"/v1/turns/{turn_id}").json()["status"] == status, f"turn {status}")
    view: dict[str, Any] = http.get(f"/v1/turns/{turn_id}").json()
    return view


def listed(http: httpx.Client, **params: str) -> set[str]:
    reply = http.get("/v1/turns", params={"limit": "500", **params})
    assert reply.status_code == 200, reply.text
    return {turn["turn_id"] for turn in reply.json()["turns"]}


def test_each_key_sees_only_its_tenant_and_the_admin_sees_both(deployment: Deployment) -> None:
    with deployment.http(ACME) as acme, deployment.http(GLOBEX) as globex, deployment.http(TOKEN) as admin:
        ours = submit(acme, [])
        theirs = submit(globex, ["whose_tenant"], call("whose_tenant"))
        assert ours in listed(acme) and theirs not in listed(acme)
        assert theirs in listed(globex) and ours not in listed(globex)
        assert {ours, theirs} <= listed(admin)
        assert ours in listed(admin, tenant="acme") and theirs not in listed(admin, tenant="acme")
        assert acme.get("/v1/turns", params={"tenant": "globex"}).status_code == 403
        unknown = acme.get("/v1/turns/turn_0123456789abcdef0123456789abcdef")
        assert unknown.status_code == 404
        for path in (f"/v1/turns/{theirs}", f"/v1/turns/{theirs}/events"):
            refused = acme.get(path)
            assert refused.status_code == 404, path
            assert refused.json()["detail"] == f"unknown turn {theirs!r}"
        view = wait_status(globex, theirs, "completed")
        assert view["tenant"] == "globex" and view["request"]["tenant"] == "globex"
        assert wait_status(admin, ours, "completed")["tenant"] == "acme"
        # The tenant is in the turn's events, and reached the tool as `ctx.tenant`.
        events = codec.parse_entries(theirs, deployment.env.redis.xrange(keys.turn_events(theirs)))
        started = [e.data for e in events if e.name == "turn_started"]
        assert started[0]["tenant"] == "globex"
    outcome = deployment.env.client.wait(theirs, 30)
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.content == "globex"


def test_another_tenants_turn_cannot_be_approved_or_cancelled(deployment: Deployment) -> None:
    with (
        deployment.http(ACME) as acme,
        deployment.http(ACME_OPS) as acme_ops,
        deployment.http(GLOBEX) as globex,
        deployment.http(TOKEN) as admin,
    ):
        refund = submit(globex, ["refund"], call("refund", amount=5))
        shipment = submit(acme, ["ship"], call("ship", order="o-1"))
        (pending,) = wait_status(globex, refund, "waiting")["pending_approvals"]
        (shipping,) = wait_status(acme, shipment, "waiting")["pending_approvals"]
        # The exploit of issue 31: another caller approving the refund with its amount edited.
        edited = {"approved": True, "arguments": {"amount": 5000}}
        taken = acme_ops.post(f"/v1/turns/{refund}/approvals/{pending['call_id']}", json=edited)
        assert taken.status_code == 404 and taken.json()["detail"] == f"unknown turn {refund!r}"
        assert acme.post(f"/v1/turns/{refund}/cancel").status_code == 404
        assert globex.post(f"/v1/turns/{shipment}/cancel").status_code == 404
        answer, approval = {"approved": True}, f"/v1/turns/{shipment}/approvals/{shipping['call_id']}"
        assert globex.post(approval, json=answer).status_code == 404
        # A key without `approve` cannot approve, even its own tenant's call; one with it can.
        lacking = acme.post(approval, json=answer)
        assert lacking.status_code == 403, lacking.text
        assert acme_ops.post(approval, json=answer).status_code == 202
        assert wait_status(acme, shipment, "completed")["tenant"] == "acme"
        assert wait_status(admin, refund, "waiting")["pending_approvals"] == [pending]
        assert admin.post(f"/v1/turns/{refund}/cancel").status_code == 202
        assert wait_status(globex, refund, "cancelled")["tenant"] == "globex"


def test_tools_and_tenants_a_key_may_not_use_are_refused(deployment: Deployment) -> None:
    with deployment.http(ACME) as acme, deployment.http(GLOBEX) as globex, deployment.http(TOKEN) as admin:
        body = {"prompt": plan(call("refund", amount=1)), "tools": ["refund"], "model": PLAN_MODEL}
        refused = acme.post("/v1/turns", json=body)
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["detail"]
        assert problem["ctx"]["tool"] == "refund" and "refund" not in problem["ctx"]["available"]
        body["tools"] = ["ship"]
        outside = globex.post("/v1/turns", json=body)
        assert outside.status_code == 422 and outside.json()["detail"][0]["ctx"]["tool"] == "ship"
        names = [tool["name"] for tool in globex.get("/v1/tools").json()]
        assert names == ["refund", "whose_tenant"]
        public = acme.get("/v1/tools", params={"include_sensitive": True}).json()
        assert "refund" not in [tool["name"] for tool in public]
        # A tenant not the key's is refused; the admin submits for any.
        body = {"prompt": plan(call("whose_tenant")), "tools": ["whose_tenant"], "model": PLAN_MODEL}
        assert globex.post("/v1/turns", json={**body, "tenant": "acme"}).status_code == 403
        theirs = submit(admin, ["whose_tenant"], call("whose_tenant"), tenant="initech")
        assert wait_status(admin, theirs, "completed")["tenant"] == "initech"
        assert theirs not in listed(acme) and theirs not in listed(globex)
        # The admin's scope: a key without it reads no metrics.
        assert acme.get("/metrics").status_code == 403
        assert 'toolloop_api_turns_submitted_total{tenant="other"}' in admin.get("/metrics").text


def test_a_page_session_sees_only_its_keys_tenant(deployment: Deployment) -> None:
    page = httpx.Client(base_url=deployment.api_url, timeout=30)
    with deployment.http(ACME) as acme, deployment.http(GLOBEX) as globex, page:
        ours = submit(acme, [])
        submit(globex, [])
        # Signed in with the form, as a browser does (a key never travels in a URL).
        signed_in = page.post("/ui/session", data={"key": GLOBEX, "next": "/ui"})
        assert signed_in.status_code == 303
        turns = page.get("/v1/turns").json()["turns"]
        assert turns and {turn["tenant"] for turn in turns} == {"globex"}
        assert page.get(f"/v1/turns/{ours}").status_code == 404
        assert page.post("/v1/turns", json={"prompt": "hi"}).status_code == 401  # reads only


def test_toolloop_submit_tenant_is_stored_and_old_records_read_as_default(deployment: Deployment) -> None:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": deployment.env.url}
    done = subprocess.run(
        [str(TOOLLOOP_BIN), "submit", "--prompt", "hi", "--tenant", "acme"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    turn_id = done.stdout.strip()
    shown = subprocess.run(
        [str(TOOLLOOP_BIN), "show", turn_id], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    assert json.loads(shown.stdout)["tenant"] == "acme"
    with deployment.http(ACME) as acme, deployment.http(TOKEN) as admin:
        assert turn_id in listed(acme)
        # A request stored before tenants existed has no `tenant`: it reads as "default".
        request_key = keys.turn_request(turn_id)
        stored = json.loads(deployment.env.redis.get(request_key))
        del stored["tenant"]
        deployment.env.redis.set(request_key, json.dumps(stored), keepttl=True)
        assert admin.get(f"/v1/turns/{turn_id}").json()["tenant"] == "default"
        assert acme.get(f"/v1/turns/{turn_id}").status_code == 404
    assert deployment.env.client.get(turn_id).tenant == "default"


def test_an_api_keys_setting_that_cannot_be_used_stops_the_api() -> None:
    env = {**os.environ, "TOOLLOOP_API_KEYS": '{"k-1": {"tenant": "acme", "scopes": ["read"]'}
    done = subprocess.run(
        [str(TOOLLOOP_BIN), "api", "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "error: TOOLLOOP_API_KEYS is not valid JSON" in done.stderr and "k-1" not in done.stderr
