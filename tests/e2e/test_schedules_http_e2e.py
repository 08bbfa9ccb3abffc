"""Schedules and named agents over HTTP, on real processes: a Redis of the module's own, a prefork worker
serving the e2e tools, `toolloop orchestrator` calling the scripted `plan` model, `toolloop api` with
tenants' keys (`TOOLLOOP_API_KEYS`), and `toolloop beat`.

A tenant's key creates, lists and removes its own schedules (`HttpClient` and `AsyncHttpClient`, and the
routes as a stranger's tooling sends them): another tenant neither sees nor removes them, nor takes their
name; a read-only key lists but cannot create; refusals are 422s naming the field, and store nothing; a
schedule created over HTTP is run by a real beat as a turn of its tenant. Agents: registered with an admin
key (a tenant's key gets 403), refused for a name that is not the path's, and listed by
`HttpClient.list_agents` and `toolloop agents`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator import AsyncHttpClient, HttpClient
from orchestrator.client.redis_client import Client
from orchestrator.errors import ApiAuthError, ModelConfigError, UnknownToolError, UnknownTurnError
from orchestrator.redis_server import RedisServer
from orchestrator.schedules.schedule import ScheduleView
from tests.openapi_schemas import assert_valid_answer
from tests.support import served
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.waiting import wait_for
from workers import AgentSpec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ACME_KEY = "sched-acme-key-4e2a"
OTHER_KEY = "sched-other-key-9b7d"
READER_KEY = "sched-reader-key-1f3c"
ADMIN_KEY = "sched-admin-key-6a0e"
KEYS = {
    ACME_KEY: {"tenant": "acme", "scopes": ["submit", "read"]},
    OTHER_KEY: {"tenant": "other", "scopes": ["submit", "read"]},
    READER_KEY: {"tenant": "acme", "scopes": ["read"]},
    ADMIN_KEY: {"tenant": "ops", "scopes": ["submit", "read", "admin"]},
}
SECRET = "sk-schedule-secret-5c1d"
MODEL = "scripted:plan"


@pytest.fixture(scope="module", autouse=True)
def running(orchestrator_process: OrchestratorHandle) -> OrchestratorHandle:
    return orchestrator_process


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer) -> Iterator[str]:
    with served.serving_api(module_redis.url, env={"TOOLLOOP_API_KEYS": json.dumps(KEYS)}) as base:
        yield base


@pytest.fixture(scope="module")
def document(api_url: str) -> dict[str, Any]:
    schema: dict[str, Any] = httpx.get(f"{api_url}/openapi.json", timeout=10).raise_for_status().json()
    return schema


def _name(base: str) -> str:
    return f"{base}-{uuid.uuid4().hex[:6]}"


def _names(views: list[ScheduleView]) -> list[str]:
    return [view.schedule.name for view in views]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_tenant_creates_lists_replaces_and_removes_its_own_schedules(api_url: str, client: Client) -> None:
    name = _name("nightly")
    with (
        HttpClient(api_url, token=ACME_KEY) as acme,
        HttpClient(api_url, token=OTHER_KEY) as other,
        HttpClient(api_url, token=READER_KEY) as reader,
        HttpClient(api_url, token=ADMIN_KEY) as admin,
    ):
        before = time.time()
        view = acme.schedule(
            name,
            cron="0 3 * * *",
            prompt="the nightly report",
            tools=["e2e_add"],
            model=MODEL,
            context={"api_key": SECRET, "team": "a"},
        )
        assert (view.schedule.name, view.schedule.cron, view.schedule.overlap) == (name, "0 3 * * *", "skip")
        assert view.schedule.request.tenant == "acme"  # the key's tenant, none given
        assert view.schedule.request.context == {"api_key": "***", "team": "a"}  # shown redacted
        assert view.next_run_at > before and view.state.runs == []
        assert name in _names(acme.schedules()) and name in _names(reader.schedules())
        assert name not in _names(other.schedules())  # another tenant's
        assert name in _names(admin.schedules())  # the admin sees every tenant's
        stored = next(v for v in client.schedules() if v.schedule.name == name)
        assert stored.schedule.request.context["api_key"] == SECRET  # stored as given

        assert other.unschedule(name) is False  # as if there were none
        with pytest.raises(ValueError, match="another tenant's"):
            other.schedule(name, every_s=60, prompt="mine now")
        with pytest.raises(ApiAuthError):
            reader.schedule(_name("read-only"), every_s=60, prompt="hi")
        with pytest.raises(ApiAuthError):
            acme.schedule(_name("theirs"), every_s=60, prompt="hi", tenant="other")

        replaced = acme.schedule(name, every_s=3600, overlap="queue", prompt="hourly now", model=MODEL)
        assert (replaced.schedule.cron, replaced.schedule.every_s) == (None, 3600)
        stored = next(v for v in client.schedules() if v.schedule.name == name)
        assert (stored.schedule.overlap, stored.schedule.request.prompt) == ("queue", "hourly now")

        assert acme.unschedule(name) is True
        assert acme.unschedule(name) is False
    assert name not in _names(client.schedules())


def test_the_async_http_client_schedules_too(api_url: str, client: Client) -> None:
    name = _name("async")

    async def run() -> tuple[ScheduleView, list[str], bool]:
        async with AsyncHttpClient(api_url, token=ACME_KEY) as acme:
            view = await acme.schedule(name, every_s=120, prompt="async", model=MODEL)
            listed = _names(await acme.schedules())
            return view, listed, await acme.unschedule(name)

    view, listed, removed = asyncio.run(run())
    assert view.schedule.every_s == 120 and name in listed and removed
    assert name not in _names(client.schedules())


def test_refused_schedules_are_422s_naming_the_field_and_store_nothing(
    api_url: str, client: Client, document: dict[str, Any]
) -> None:
    name = _name("refused")
    path = "/v1/schedules/{name}"
    with HttpClient(api_url, token=ACME_KEY) as acme:
        with pytest.raises(UnknownToolError) as unknown:
            acme.schedule(name, every_s=60, prompt="hi", tools=["e2e_addd"])
        assert unknown.value.unknown == ["e2e_addd"] and "e2e_add" in unknown.value.available
        with pytest.raises(ModelConfigError):
            acme.schedule(name, every_s=60, prompt="hi", model="nonsense")
        with pytest.raises(ValueError, match="invalid cron expression"):
            acme.schedule(name, cron="* * *", prompt="hi")  # refused before anything is sent

    def put(body: dict[str, Any], key: str = ACME_KEY, at: str = name) -> httpx.Response:
        reply = httpx.put(f"{api_url}/v1/schedules/{at}", json=body, headers=_bearer(key), timeout=10)
        assert_valid_answer(document, "put", path, reply.status_code, reply.json())
        return reply

    def loc(reply: httpx.Response) -> list[Any]:
        assert reply.status_code == 422, reply.text
        located: list[Any] = reply.json()["detail"][0]["loc"]
        return located

    request = {"prompt": "hi", "model": MODEL}
    assert loc(put({"cron": "* * *", "request": request})) == ["body", "cron"]
    assert loc(put({"every_s": 0.5, "request": request})) == ["body", "every_s"]
    assert loc(put({"request": request})) == ["body"]  # neither cron nor every_s
    assert loc(put({"cron": "0 3 * * *", "every_s": 60, "request": request})) == ["body"]
    assert loc(put({"every_s": 60, "overlap": "sometimes", "request": request})) == ["body", "overlap"]
    assert loc(put({"every_s": 60, "request": {**request, "tools": ["e2e_addd"]}})) == [
        "body",
        "request",
        "tools",
        0,
    ]
    assert loc(put({"every_s": 60, "request": {**request, "model": "nonsense"}})) == [
        "body",
        "request",
        "model",
    ]
    assert loc(put({"every_s": 60, "request": {"prompt": " "}})) == ["body", "request"]
    assert loc(put({"every_s": 60, "request": {**request, "schedule": "x"}})) == [
        "body",
        "request",
        "schedule",
    ]
    assert loc(put({"name": "another", "every_s": 60, "request": request})) == ["body", "name"]
    assert loc(put({"every_s": 60, "request": request}, at="bad%20name")) == ["path", "name"]
    assert put({"every_s": 60, "request": {**request, "tenant": "other"}}).status_code == 403
    assert put({"every_s": 60, "request": request}, key=READER_KEY).status_code == 403
    assert put({"every_s": 60, "request": request}, key="not-a-key").status_code == 401
    assert name not in _names(client.schedules())  # nothing was stored

    missing = httpx.delete(f"{api_url}/v1/schedules/{name}", headers=_bearer(ACME_KEY), timeout=10)
    assert missing.status_code == 404
    assert_valid_answer(document, "delete", path, 404, missing.json())
    listed = httpx.get(f"{api_url}/v1/schedules", headers=_bearer(READER_KEY), timeout=10)
    assert listed.status_code == 200
    assert_valid_answer(document, "get", "/v1/schedules", 200, listed.json())


def test_a_schedule_created_over_http_is_run_by_a_real_beat_as_a_turn_of_its_tenant(
    api_url: str, module_redis: RedisServer
) -> None:
    name = _name("tick")
    with HttpClient(api_url, token=ACME_KEY) as acme:
        acme.schedule(name, every_s=1, prompt=plan_prompt([{"text": "tick"}]), model=MODEL)
        beat = served.start_toolloop(
            ["beat", "--id", f"beat-{name}", "--lease-ttl-s", "2"], {"TOOLLOOP_REDIS_URL": module_redis.url}
        )
        try:

            def first_run() -> str | None:
                view = next((v for v in acme.schedules() if v.schedule.name == name), None)
                return view.state.last_turn_id if view is not None else None

            turn_id = wait_for(first_run, "a run of the schedule", timeout_s=60)
            assert acme.unschedule(name)
        finally:
            beat.kill()
        outcome = acme.wait(turn_id, timeout=60)  # the tenant's key reads its run
        view = acme.get(turn_id)
    assert outcome.status == "completed" and outcome.text == "tick"
    assert (view.request.schedule, view.tenant) == (name, "acme")
    with HttpClient(api_url, token=OTHER_KEY) as other, pytest.raises(UnknownTurnError):
        other.get(turn_id)


def _toolloop(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLLOOP_BIN), *args],
        env={**os.environ, "TOOLLOOP_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def test_agents_are_registered_with_an_admin_key_and_listed_over_http_and_by_the_cli(
    api_url: str, module_redis: RedisServer, document: dict[str, Any]
) -> None:
    name = _name("helper")
    spec = AgentSpec(
        name=name, description="Helps with sums.", instructions="You add.", model=MODEL, tools=["e2e_add"]
    )
    with HttpClient(api_url, token=ADMIN_KEY) as admin, HttpClient(api_url, token=ACME_KEY) as acme:
        admin.register_agent(spec)
        with pytest.raises(ApiAuthError) as refused:
            acme.register_agent(spec.model_copy(update={"instructions": "You subtract."}))
        assert refused.value.status_code == 403
        assert spec in acme.list_agents()  # any reader lists them, unchanged by the refused one
    body = spec.model_dump(mode="json")
    mismatch = httpx.put(f"{api_url}/v1/agents/other-name", json=body, headers=_bearer(ADMIN_KEY), timeout=10)
    assert mismatch.status_code == 422 and mismatch.json()["detail"][0]["loc"] == ["body", "name"]
    assert_valid_answer(document, "put", "/v1/agents/{name}", 422, mismatch.json())
    registered = httpx.put(f"{api_url}/v1/agents/{name}", json=body, headers=_bearer(ADMIN_KEY), timeout=10)
    assert registered.status_code == 200 and registered.json() == body
    assert_valid_answer(document, "put", "/v1/agents/{name}", 200, registered.json())
    listed = httpx.get(f"{api_url}/v1/agents", headers=_bearer(READER_KEY), timeout=10)
    assert_valid_answer(document, "get", "/v1/agents", 200, listed.json())

    table = _toolloop(module_redis.url, "agents").stdout
    line = next(line for line in table.splitlines() if name in line)
    assert "Helps with sums." in line and "e2e_add" in line and MODEL in line
    dumped = json.loads(_toolloop(module_redis.url, "agents", "--json").stdout)
    assert spec.model_dump(mode="json", exclude_defaults=True) in dumped
